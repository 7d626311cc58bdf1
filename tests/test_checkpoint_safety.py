"""Resume's config-change classes, and checkpoint writes and pruning with real concurrent processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlft.config import Config, ConfigError
from rlft.state import checkpoint as ckpt
from rlft.state import resume_rules, run_state
from tests.support import ROOT, TINY, leaf_keys, run_cli

# ---------------------------------------------------------------------------------------
# Item 6: which config changes a resume accepts


def test_every_config_key_is_classified():
    keys = leaf_keys(Config)
    assert len(keys) > 60 and "sampler.vllm.sync" in keys and "seed" in keys
    unclassified = [k for k in keys if resume_rules.rule(k) is None]
    assert not unclassified, f"add these keys to resume_rules.KEY_CLASSES: {unclassified}"
    for k in keys:
        kind, why = resume_rules.rule(k)
        assert kind in (resume_rules.HARMLESS, resume_rules.NUMERICS, resume_rules.HARMFUL) and why, k
    stale = [row for row in resume_rules.KEY_CLASSES if not any(k == row or k.startswith(row) for k in keys)]
    assert not stale, f"rows of resume_rules.KEY_CLASSES that match no config key: {stale}"
    assert set(resume_rules.CONDITIONS) <= set(keys)
    # A key the table does not know is refused, not waved through.
    assert resume_rules.rule("trainer.new_knob") is None
    assert resume_rules.classify("trainer.new_knob", {}, {})[0] == resume_rules.HARMFUL


def _resolved(*overrides: str) -> str:
    """The YAML the CLI saves for a run: the composed config, resolved."""
    from omegaconf import OmegaConf

    from rlft.config import compose

    _, raw, _ = compose([*TINY, *overrides])
    return OmegaConf.to_yaml(raw, resolve=True)


def _checkpoint_with(tmp_path: Path, saved_yaml: str) -> Path:
    path = tmp_path / "step_000001"
    path.mkdir()
    (path / run_state.CONFIG).write_text(saved_yaml)
    return path


def _refusal(path: Path, current_yaml: str) -> str:
    with pytest.raises(ConfigError) as e:
        resume_rules.check_compatible(path, current_yaml)
    message = str(e.value)
    assert message.startswith("cannot resume") and "\n" not in message
    return message


@pytest.mark.parametrize("override, kind, words", [
    ("logger.console=true", resume_rules.HARMLESS, "logging only"),
    ("trainer.save_every=5", resume_rules.HARMLESS, "checkpointing only"),
    ("trainer.micro_batch_size=2", resume_rules.NUMERICS, "numerics only: float summation order"),
    ("trainer.steps=9", resume_rules.HARMLESS, "optim.schedule=constant"),
])
def test_allowed_changes_are_reported_with_their_reason(override, kind, words, tmp_path):
    path = _checkpoint_with(tmp_path, _resolved())  # TINY: logger.console=false, optim.schedule=constant
    key = override.split("=")[0]
    allowed = resume_rules.check_compatible(path, _resolved(override))
    assert len(allowed) == 1 and allowed[0].startswith(f"{key}: ") and words in allowed[0]


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_steps_change_is_refused_when_the_lr_schedule_depends_on_it(schedule, tmp_path):
    path = _checkpoint_with(tmp_path, _resolved(f"optim.schedule={schedule}"))
    message = _refusal(path, _resolved(f"optim.schedule={schedule}", "trainer.steps=9"))
    assert "trainer.steps: 2 -> 9 (sets the length of the linear/cosine LR schedule" in message


@pytest.mark.parametrize("override, words", [
    ("data.num_eval=4", "held-out split, carved out of or rejected from the training problems"),
    ("data.eval_path=held_out.jsonl", "whether the eval rows are carved out of the training file"),
    ("sampler.temperature=0.7", "sampling distribution"),
    ("model.dtype=fp32", "frozen weights' dtype"),
    ("seed=1", "data order"),
])
def test_changes_of_the_training_run_are_refused_with_their_reason(override, words, tmp_path):
    path = _checkpoint_with(tmp_path, _resolved())
    message = _refusal(path, _resolved(override))
    assert f"{override.split('=')[0]}: " in message and words in message


def test_refusal_stays_one_line_and_lists_at_most_four_keys(tmp_path):
    import yaml

    saved = _resolved()
    path = _checkpoint_with(tmp_path, saved)
    current = yaml.safe_load(saved)
    current["data"]["template"] = "Q:\n{a} {op} {b}"
    assert "data.template: What is {a} {op} {b}? Reply with just the number. -> Q:\\n{a} {op} {b} (the training " \
        "problems)" in _refusal(path, yaml.safe_dump(current))
    message = _refusal(path, _resolved("algo=dapo"))
    assert "algo.clip_eps_high: 0.2 -> 0.28 (the algorithm's" in message and " more; revert them" in message


@pytest.mark.slow
def test_cli_refuses_resume_with_changed_num_eval(tmp_path):
    run = tmp_path / "run"
    args = ["train", *[a for a in TINY if not a.startswith("trainer.steps")], "trainer.steps=1", f"hydra.run.dir={run}"]
    r = run_cli(args, ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli([*args, "trainer.resume=auto", "data.num_eval=4"], ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert "cannot resume" in r.stderr and "data.num_eval: 8 -> 4" in r.stderr


# ---------------------------------------------------------------------------------------
# Item 8: a complete newest checkpoint at every instant; prune spares live writers


def write(root: Path, step: int, version: int) -> Path:
    """A small checkpoint whose contents (and file sizes) depend on ``version``."""
    tensors = {"w.safetensors": {"w": torch.full((16,), float(version))}}
    return ckpt.write_checkpoint(root, step, tensors, {"state.json": {"v": version, "pad": "x" * version}})


def _spawn_writer(root: Path, step: int, version: int, env: dict[str, str]) -> subprocess.Popen:
    """Another process calling :func:`write` (this file run as a script)."""
    return subprocess.Popen(
        [sys.executable, __file__, str(root), str(step), str(version)], cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _version(path: Path) -> int:
    return ckpt.read_json(path, "state.json")["v"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the atomic swap is renameat2, Linux only")
def test_resaving_a_step_keeps_a_complete_copy_at_every_instant(tmp_path):
    root = tmp_path / "checkpoints"
    write(root, 1, 1)
    step2 = write(root, 2, 1)
    # The writer pauses for a minute once its new copy of step 2 is in place, before removing the old one.
    proc = _spawn_writer(root, 2, 2, {ckpt.FAULT_SWAP_DELAY_ENV: "60"})
    try:
        deadline = time.time() + 120
        while True:  # from the writer's start until the new copy is in place, look as often as we can
            found = ckpt.latest_in(root)
            assert found == step2, f"no complete copy of step 2 at some instant (found {found})"
            if _version(found) == 2:
                break
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "the writer never put its copy in place"
            time.sleep(0.001)
        proc.kill()  # a real kill before the old copy is removed
        proc.wait()
    finally:
        _stop(proc)
    assert ckpt.latest_in(root) == step2 and _version(step2) == 2
    assert [p for p in root.iterdir() if p.name.startswith(".")], "expected the killed writer's leftover"
    ckpt.prune(root, 0)  # the writer is dead: its leftover goes
    assert sorted(p.name for p in root.iterdir()) == ["step_000001", "step_000002"]


def test_prune_spares_directories_of_live_writers_only(tmp_path):
    root = tmp_path / "checkpoints"
    write(root, 1, 1)
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "60"])
    try:
        names = {
            f".tmp-step_000002-{live.pid}": True, f".old-step_000001-{live.pid}": True,
            f".tmp-step_000002-{dead.pid}": False, f".old-step_000001-{dead.pid}": False,
            f".tmp-step_000003-{os.getpid()}": False,  # our own leftover: prune runs after our writes
            ".tmp-not-ours": True,
        }
        for name in names:
            (root / name).mkdir()
            (root / name / "w.safetensors").write_bytes(b"partial")
        ckpt.prune(root, 0)
        assert {n for n in names if (root / n).exists()} == {n for n, kept in names.items() if kept}
        assert (root / "step_000001").is_dir()
    finally:
        _stop(live)


def test_prune_by_one_process_does_not_break_another_process_write(tmp_path):
    root = tmp_path / "checkpoints"
    proc = _spawn_writer(root, 2, 2, {ckpt.FAULT_DELAY_ENV: "5"})  # pauses after its first file
    try:
        partial = root / f".tmp-step_000002-{proc.pid}"
        deadline = time.time() + 120
        while not (partial.is_dir() and any(partial.iterdir())):
            assert proc.poll() is None and time.time() < deadline, "the writer never started its write"
            time.sleep(0.01)
        write(root, 1, 1)
        ckpt.prune(root, 1)  # what a run sharing the directory does after each save
        _, err = proc.communicate(timeout=120)
    finally:
        _stop(proc)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert ckpt.latest_in(root) == root / "step_000002" and _version(root / "step_000002") == 2


def test_keep_last_and_resaving_in_process(tmp_path):
    root = tmp_path / "checkpoints"
    for step in range(1, 5):
        write(root, step, 1)
        ckpt.prune(root, 2)
    write(root, 4, 2)  # re-save the newest step
    ckpt.prune(root, 2)
    assert sorted(p.name for p in root.iterdir()) == ["step_000003", "step_000004"]
    assert _version(root / "step_000004") == 2 and ckpt.is_complete(root / "step_000004")


if __name__ == "__main__":  # the writer process of the tests above
    write(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
