"""Bad user input (model dirs, reward entries, paths) ends in one `rlft: error:` line, never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlft.models import ModelError, load_base
from rlft.rewards import RewardError, resolve_reward
from rlft.rewards.functions import RewardNameError
from tests.support import TINY, one_error_line, run_cli

NOT_TINY = [a for a in TINY if a != "model=tiny"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """The tiny random model saved as a regular HF model directory."""
    from rlft.config import compose

    cfg, _, _ = compose(TINY)
    model, tok = load_base(cfg.model, torch.float32, 0)
    out = tmp_path_factory.mktemp("tiny") / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def broken_copy(src: Path, dst: Path, kind: str) -> Path:
    if kind == "no_config":
        dst.mkdir()
        return dst
    shutil.copytree(src, dst)
    if kind == "truncated_weights":
        with open(dst / "model.safetensors", "r+b") as f:
            f.truncate(1000)
    elif kind == "wrong_architecture":
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, "model_type": "no_such_arch"}))
    elif kind == "not_causal_lm":
        (dst / "config.json").write_text(json.dumps({"model_type": "t5"}))
    elif kind == "no_tokenizer":
        for p in dst.glob("tokenizer*"):
            p.unlink()
    return dst


@pytest.mark.parametrize("kind", ["no_config", "truncated_weights", "wrong_architecture", "not_causal_lm",
                                  "no_tokenizer"])
def test_broken_model_dir_is_one_model_error(tiny_dir, tmp_path, compose_cfg, kind):
    path = broken_copy(tiny_dir, tmp_path / kind, kind)
    cfg = compose_cfg("model=local", f"model.path={path}")
    with pytest.raises(ModelError) as err:
        load_base(cfg.model, torch.float32, 0)
    msg = str(err.value)
    assert msg.startswith(f"model.path={path}: ") and "\n" not in msg, msg


def test_cli_train_on_a_missing_model_dir(tmp_path):
    proc = run_cli(["train", *NOT_TINY, "model=local", "model.path=/does/not/exist",
                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert one_error_line(proc, 2) == "rlft: error: model.path=/does/not/exist: no such directory"


def test_cli_eval_on_truncated_weights(tiny_dir, tmp_path):
    path = broken_copy(tiny_dir, tmp_path / "m", "truncated_weights")
    proc = run_cli(["eval", "model=local", f"model.path={path}", "sampler=hf", "--samples", "0"], cwd=tmp_path)
    line = one_error_line(proc, 2)
    assert f"model.path={path}: cannot load the model: SafetensorError" in line


@pytest.mark.parametrize("entry", [":f", ".f", ".m:f", "m:", "json:", "a..b:f", "mathh", "no_such_module:f"])
def test_bad_reward_entry_is_one_config_error(entry):
    with pytest.raises(RewardNameError) as err:
        resolve_reward(entry)
    assert f"'{entry}'" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("source, cause", [("def f(:\n", "SyntaxError: "),
                                           ("raise KeyError('at import')\n", "KeyError: 'at import'")])
def test_reward_module_failing_at_import_is_one_reward_error(tmp_path, monkeypatch, source, cause):
    (tmp_path / "broken_rewards.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardError) as err:
        resolve_reward("broken_rewards:f")
    assert not isinstance(err.value, RewardNameError)
    assert f"'broken_rewards:f': importing broken_rewards raised {cause}" in str(err.value)


def test_cli_train_bad_reward_entries(tmp_path):
    """A malformed name is a config error (2); the user's module failing to import is a reward error (1)."""
    run = ["train", *TINY, f"hydra.run.dir={tmp_path / 'run'}"]
    line = one_error_line(run_cli([*run, "reward.fns=[.m:f]"], cwd=tmp_path), 2)
    assert "malformed reward '.m:f'" in line
    (tmp_path / "broken_rewards.py").write_text("def f(:\n")
    line = one_error_line(run_cli([*run, "reward.fns=[broken_rewards:f]"], cwd=tmp_path), 1)
    assert "'broken_rewards:f': importing broken_rewards raised SyntaxError" in line


@pytest.mark.slow  # CLI runs (~15 s)
def test_home_paths_expand_and_export_refuses_a_file(tiny_dir, tmp_path, monkeypatch):
    """`~` works unquoted in data.path, data.eval_path, model.path, hydra.run.dir and export's arguments."""
    from rlft.models.loading import cache_root

    monkeypatch.setenv("RLFT_CACHE", str(cache_root()))  # keep the converted SmolLM2 tokenizer under the new HOME
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(tiny_dir, tmp_path / "m")
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(12)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_cli(["train", *NOT_TINY, "trainer.steps=1", "model=local", "model.path=~/m", "data=jsonl",
                    "data.path=~/train.jsonl", "data.eval_path=~/train.jsonl", "data.num_eval=4",
                    "hydra.run.dir=~/run"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "run" / "config.yaml").is_file()

    (tmp_path / "taken").write_text("")
    line = one_error_line(run_cli(["export", "~/run", "~/taken"], cwd=tmp_path), 2)
    assert line == f"rlft: error: {tmp_path / 'taken'} exists and is a file: choose a new output directory"
    proc = run_cli(["export", "~/run", "~/merged"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "merged" / "config.json").is_file()


def test_run_and_sweep_dirs_expand_home(tmp_path, monkeypatch):
    from rlft.commands.train import _expand_home

    monkeypatch.setenv("HOME", str(tmp_path))
    assert _expand_home("hydra.sweep.dir=~/s") == f"hydra.sweep.dir='{tmp_path / 's'}'"
    assert _expand_home("hydra.run.dir='~/r x'") == f"hydra.run.dir='{tmp_path / 'r x'}'"
    assert _expand_home("data.path=~/d") == "data.path=~/d"  # user paths in the config expand where they are read


@pytest.mark.parametrize(("overrides", "says"), [
    (["trainer.strategy=zero3"], "valid choices: ddp, fsdp2"),
    (["trainer.strategy=fsdp2", "model.lora.enabled=false"], "full fine-tuning under FSDP2 is not supported"),
    (["trainer.strategy=fsdp2"], "this is one process"),  # nothing to shard over: not a silent no-op
    (["trainer.strategy=fsdp2", "model.lora.target_modules=[q_proj,embed_tokens]"], "embed_tokens under"),
])
def test_a_strategy_that_cannot_take_effect_is_one_line(tmp_path, overrides, says):
    line = one_error_line(run_cli(["train", *TINY, "trainer.steps=1", *overrides, f"hydra.run.dir={tmp_path / 'r'}"],
                                  cwd=tmp_path), 2)
    assert says in line, line


def test_fsdp2_on_a_decoder_without_layers_names_the_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlft.config import ConfigError
    from rlft.parallel.distributed import DataParallel
    from rlft.parallel.fsdp import shard_decoder

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10, n_positions=8))
    with pytest.raises(ConfigError, match="GPT2Model has none"):
        shard_decoder(model, torch.device("cpu"), DataParallel(0, 2))
