"""`rlft export`: a checkpoint as a merged Hugging Face model directory, or as its peft adapter
(a checkpoint of ``rlft rm``: a sequence-classification directory, :mod:`rlft.rm.command`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from rlft.config import Config, compose_on
from rlft.config.sft_schema import SFT_KIND
from rlft.models.loading import load_base, load_tokenizer, quiet_libraries
from rlft.models.policy import wrap_lora
from rlft.paths import user_path
from rlft.sft.command import SFT_SCHEMA
from rlft.state import checkpoint as ckpt
from rlft.state.run_state import CONFIG, load_policy_weights


def find_checkpoint(spec: str | Path) -> Path:
    """A checkpoint directory, or the newest complete one in a run directory.

    Raises:
        CheckpointError: nothing usable there.
    """
    found = ckpt.resolve(str(spec), user_path(spec), label="")
    if found is None:
        raise ckpt.CheckpointError(f"{spec}: no checkpoint")
    return found


def checkpoint_config(path: Path, overrides: list[str] | None = None) -> Config:
    """The config a checkpoint was trained with (``rlft sft``'s for its checkpoints: their model section is the
    same), ``overrides`` applied."""
    if ckpt.kind(path) == SFT_KIND:
        return compose_on((path / CONFIG).read_text(), list(overrides or []), SFT_SCHEMA)
    return compose_on((path / CONFIG).read_text(), list(overrides or []))


def is_sft_checkpoint(path: Path) -> bool:
    return ckpt.kind(path) == SFT_KIND


def load_merged(path: Path, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, object]:
    """The checkpoint's policy as a plain transformers model (adapter merged into the base) and its tokenizer."""
    quiet_libraries()
    cfg = checkpoint_config(path)
    base, tok = load_base(cfg.model, torch.float32, cfg.seed)
    model = wrap_lora(base, cfg.model.lora) if cfg.model.lora.enabled else base
    load_policy_weights(model, path)
    if cfg.model.lora.enabled:
        model = model.merge_and_unload()
    return model.to(dtype).eval(), tok


def export(spec: str | Path, out: str | Path, adapter_only: bool = False) -> Path:
    """Write ``out`` (which must not exist or be empty) atomically; returns the checkpoint used."""
    path = find_checkpoint(spec)
    out = user_path(out)
    from rlft.rm.state import is_reward_checkpoint

    if is_reward_checkpoint(path):  # rlft rm's: a sequence-classification directory, the score head included
        if adapter_only:
            raise ckpt.CheckpointError(f"{path} is a reward model's checkpoint: export it without --adapter-only")
        from rlft.rm.command import export_checkpoint

        export_checkpoint(path, out)
        return path
    if out.exists() and not out.is_dir():
        raise ckpt.CheckpointError(f"{out} exists and is a file: choose a new output directory")
    if out.exists() and any(out.iterdir()):
        raise ckpt.CheckpointError(f"{out} exists and is not empty: choose a new output directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".tmp-{out.name}-"))
    except OSError as e:  # a file where a parent directory should be, or no write permission
        raise ckpt.CheckpointError(f"{out}: cannot write there ({e.strerror})") from None
    try:
        if adapter_only:
            if not (path / "adapter").is_dir():
                raise ckpt.CheckpointError(f"{path} holds full weights, not a LoRA adapter: export without --adapter-only")
            shutil.copytree(path / "adapter", tmp, dirs_exist_ok=True)
            load_tokenizer(checkpoint_config(path).model).save_pretrained(tmp)
        else:
            model, tok = load_merged(path)
            model.save_pretrained(tmp)  # safetensors
            tok.save_pretrained(tmp)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
