"""The reward model: a causal LM's decoder with a one-output score head
(``AutoModelForSequenceClassification``, ``num_labels=1``), trained with a LoRA adapter (the score
head trained fully, as peft's ``modules_to_save``) or in full, per the model group's ``lora`` settings.

A sequence's reward is the head's output at its last non-pad token, as transformers computes it, so
the exported directory scores exactly as the trained model does. The head is kept and applied in fp32
(rlft.models.score_head) whatever the backbone's dtype: a bf16 score would round close pairs to a tie.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from rlft.data.conversation import Rendering, write_rendering
from rlft.errors import CheckpointError
from rlft.models.device import autocast
from rlft.models.loading import DTYPES, load_base
from rlft.models.score_head import HEAD, fp32_head

if TYPE_CHECKING:
    from rlft.config.schemas.model import ModelConfig

@dataclass
class RewardModel:
    model: Any
    """The trainable module (a peft model under LoRA)."""
    tokenizer: Any
    compute_dtype: torch.dtype
    lora: bool
    device: torch.device

    def trainable(self) -> dict[str, Tensor]:
        """Every trained tensor by a stable name (adapter and score head, or all weights)."""
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def scores(self, sequences: list[list[int]]) -> Tensor:
        """The reward of each token sequence, (N,), computed in fp32 by the head; right-padded into one
        forward pass."""
        pad = self.tokenizer.pad_token_id
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), pad, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for i, s in enumerate(sequences):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        with autocast(self.device, self.compute_dtype):
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
        return out.logits[:, 0].float()


def build_reward_model(cfg: ModelConfig, seed: int, device: torch.device,
                       notes: list[str] | None = None) -> RewardModel:
    """The model named by ``cfg`` with a new (seeded) one-output head, ready to train on ``device``.

    Under LoRA the frozen base is kept in the compute dtype and the adapter and head in fp32 (AdamW's
    updates of bf16 weights would round away); full fine-tuning keeps fp32 weights under autocast. Either
    way the head computes in fp32, outside autocast, on the hidden state cast to fp32.
    """
    compute = DTYPES[cfg.dtype]
    base, tok = load_base(cfg, compute if cfg.lora.enabled else torch.float32, seed, device, num_labels=1,
                          notes=notes)
    fp32_head(base)  # before peft: its trained copy of the head (modules_to_save) is this fp32 module
    if cfg.gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = base
    if cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model  # seconds to import: only under LoRA

        lora = cfg.lora
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = get_peft_model(base, LoraConfig(
                r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules),
                modules_to_save=[HEAD], task_type="SEQ_CLS"))
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.float()
    return RewardModel(model.to(device).train(), tok, compute, cfg.lora.enabled, device)


def plain_model(rm: RewardModel) -> Any:
    """The trained model as a plain transformers sequence-classification model in fp32 (adapter merged
    into the base, the trained head in place); ``rm`` is left as it was."""
    model = copy.deepcopy(rm.model).to("cpu").float()  # merged in fp32: base + B A without rounding
    if rm.lora:
        model = model.merge_and_unload()
    return model.float().eval()


def save_reward_model(rm: RewardModel, out: Path, rendering: Rendering | None = None, replace: bool = False) -> Path:
    """Write ``out`` atomically: a Hugging Face sequence-classification directory (config, safetensors,
    tokenizer) that ``AutoModelForSequenceClassification.from_pretrained`` loads, with the record of how
    its pairs were rendered (``rendering``: rlft.data.conversation.RECORD) that ``reward.models`` scores by.
    ``out`` must be new or empty, unless ``replace`` (the end of a run, resumed after an earlier end wrote it)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not replace:
        raise CheckpointError(f"{out} exists and is not an empty directory: choose a new output directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".tmp-{out.name}-"))
    except OSError as e:
        raise CheckpointError(f"{out}: cannot write there ({e.strerror})") from None
    try:
        model = plain_model(rm)
        model.config.pad_token_id = rm.tokenizer.pad_token_id
        model.save_pretrained(tmp)
        rm.tokenizer.save_pretrained(tmp)
        if rendering is not None:
            write_rendering(tmp, rendering)
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
