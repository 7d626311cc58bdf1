"""Whole runs on several ranks (real processes, gloo on the CPU, the tiny model, hf sampler):
the same rollouts and weights whatever the world size, two nodes meeting at a loopback
rendezvous, and a rank killed mid-run that the others survive with a checkpoint to resume from."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.support import DIST_ARGS, DIST_STEPS, ROOT, dist_env

pytestmark = pytest.mark.slow  # each run starts 1-2 processes that load torch and the model (~10-20 s)


def _rlft(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlft", "train", *args], cwd=ROOT, env=env or dist_env(),
                          capture_output=True, text=True, timeout=600)


def _final(run: Path, step: int = DIST_STEPS) -> dict:
    return load_file(str(run / "checkpoints" / f"step_{step:06d}" / "trainable.safetensors"))


def _rollouts(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]


def _assert_same_weights(a: dict, b: dict, tol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for k in a:
        rel = float((a[k] - b[k]).norm() / a[k].norm().clamp(min=1e-12))
        assert rel <= tol, f"{k}: |a - b| / |a| = {rel:.2e}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One process with all 4 prompts, and 2 ranks with 2 prompts each (trainer.nproc=2: torch's launcher),
    replicated (DDP) and sharded (FSDP2)."""
    root = tmp_path_factory.mktemp("dp")
    out = {"one": root / "one", "two": root / "two", "fsdp2": root / "fsdp2"}
    r = _rlft(*DIST_ARGS, f"hydra.run.dir={out['one']}")
    assert r.returncode == 0, r.stderr[-3000:]
    r = _rlft(*DIST_ARGS, "trainer.nproc=2", f"hydra.run.dir={out['two']}")
    assert r.returncode == 0, r.stderr[-3000:]
    r = _rlft(*DIST_ARGS, "trainer.nproc=2", "trainer.strategy=fsdp2", f"hydra.run.dir={out['fsdp2']}")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_world_size_does_not_change_rollouts_or_weights(runs):
    one, two = _rollouts(runs["one"]), _rollouts(runs["two"])
    assert one == two  # token-identical rollouts (and scores) in every step
    metrics = [json.loads(x) for x in (runs["two"] / "metrics.jsonl").read_text().splitlines() if '"step": 0' not in x]
    kept = [m["dynamic/groups"] for m in metrics]
    assert len(kept) == DIST_STEPS and min(kept) < 4, f"the dynamic-sampling cap must be hit at least once: {kept}"
    assert any(k % 2 for k in kept), f"some step must split its groups unevenly over the two ranks: {kept}"
    assert {r["step"] for r in two} == set(range(1, DIST_STEPS + 1))
    a, b = _final(runs["one"]), _final(runs["two"])
    assert any(float(v.abs().max()) > 0 for k, v in a.items() if "lora_B" in k)  # the adapter did move
    _assert_same_weights(a, b)
    state = json.loads((runs["two"] / "checkpoints" / f"step_{DIST_STEPS:06d}" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and len(state["rank_rngs"]) == 1  # every rank's random state is saved
    assert not (runs["two"] / "checkpoints" / f"step_{DIST_STEPS:06d}" / "rank1").exists()


def test_fsdp2_shards_give_the_same_rollouts_and_weights(runs):
    # A step keeps one group (the cap): one rank learns from no row and runs blank micro-batches in
    # lockstep with the other. The sampler is synced from gathered shards, so later rollouts match too.
    kept = [json.loads(x).get("dynamic/groups") for x in (runs["fsdp2"] / "metrics.jsonl").read_text().splitlines()]
    assert 1 in kept, kept
    assert _rollouts(runs["fsdp2"]) == _rollouts(runs["one"])
    _assert_same_weights(_final(runs["one"]), _final(runs["fsdp2"]))
    adapter = load_file(str(runs["fsdp2"] / "checkpoints" / f"step_{DIST_STEPS:06d}" / "adapter" / "adapter_model.safetensors"))
    final = _final(runs["fsdp2"])
    lora_a = next(k for k in final if "lora_A" in k)
    saved = adapter[lora_a.removeprefix("policy/").replace(".default", "")]
    assert saved.shape == final[lora_a].shape and saved.float().equal(final[lora_a].float())  # whole, not a shard



@pytest.mark.parametrize("algo", ["grpo", "dapo"])
def test_bf16_with_one_row_per_micro_batch_is_world_size_invariant(tmp_path, algo):
    """In bf16 the claim holds only where every rank forms the same micro-batches as one process
    (``trainer.micro_batch_size=1``): then each micro-batch's gradient is the same bf16-rounded tensor,
    and its fp32 sum over rows and ranks is exact in any order. (With larger micro-batches the ranks'
    batch shapes and padding differ, bf16 rounds differently and the runs part: docs/guide/scaling.md#what-is-the-same-on-any-number-of-ranks-and-in-which-dtype.)
    DAPO as in ``runs`` (the cap hit, groups split unevenly); GRPO with a reward that varies in every group."""
    args = [a for a in DIST_ARGS if not a.startswith(("model.dtype", "trainer.steps"))]
    args += ["model.dtype=bf16", "trainer.micro_batch_size=1", "trainer.steps=2", "trainer.save_every=1"]
    if algo == "grpo":
        args = [a for a in args if not a.startswith(("algo", "reward.fns"))]
        args += ["algo=grpo", "reward.fns=[tests.helpers:char_count]"]
    one, two = tmp_path / "one", tmp_path / "two"
    for run, extra in ((one, []), (two, ["trainer.nproc=2"])):
        r = _rlft(*args, *extra, f"hydra.run.dir={run}")
        assert r.returncode == 0, r.stderr[-3000:]
    assert _rollouts(one) == _rollouts(two)
    a, b = _final(one, 2), _final(two, 2)
    assert any(float(v.abs().max()) > 0 for k, v in a.items() if "lora_B" in k)
    _assert_same_weights(a, b, tol=1e-6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_at_a_loopback_rendezvous_equal_one_node(runs, tmp_path):
    port, run = _free_port(), tmp_path / "nodes"
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", "rlft-test", "--rdzv-conf", f"is_host={int(node == 0)}",
               "-m", "rlft", "train", *DIST_ARGS, f"hydra.run.dir={run}"]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=dist_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    for code, err in results:
        assert code == 0, err[-3000:]
    assert _rollouts(run) == _rollouts(runs["two"])
    _assert_same_weights(_final(runs["two"]), _final(run))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_rank_killed_mid_run_stops_all_and_resume_continues_exactly(runs, tmp_path, strategy):
    run, args = tmp_path / "killed", [*DIST_ARGS, f"trainer.strategy={strategy}"]
    # rank 1 kills itself (SIGKILL) while scoring step 3 (8 reward calls per step on each rank)
    r = _rlft(*args, "trainer.nproc=2", f"hydra.run.dir={run}", env=dist_env(RLFT_TEST_KILL_RANK="1",
                                                                        RLFT_TEST_KILL_AFTER="20"))
    assert r.returncode != 0
    assert "another rank stopped" in r.stderr, r.stderr[-3000:]
    assert "rank 1 was killed by SIGKILL" in r.stderr, r.stderr[-3000:]  # the cause, which torch logs to train.log
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    saved = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert saved == ["step_000002"], saved  # the last completed step, written by rank 0 alone
    r = _rlft(*args, "trainer.nproc=2", f"hydra.run.dir={run}", "trainer.resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    whole = runs["two" if strategy == "ddp" else "fsdp2"]
    _assert_same_weights(_final(whole), _final(run))
    assert _rollouts(run) == _rollouts(whole)  # steps 1-2 from the first attempt, 3 from the resumed one


def test_a_sweep_gives_each_job_its_ranks(tmp_path):
    sweep = tmp_path / "sweep"
    r = subprocess.run([sys.executable, "-m", "rlft", "train", "-m", *DIST_ARGS, "trainer.steps=1", "trainer.nproc=2",
                        "seed=1,2", f"hydra.sweep.dir={sweep}"], cwd=ROOT, env=dist_env(), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for job in ("0", "1"):
        status = json.loads((sweep / job / "job.json").read_text())
        assert status["status"] == "ok" and "trainer.nproc=2" in status["overrides"]
        state = json.loads((sweep / job / "checkpoints" / "step_000001" / "trainer_state.json").read_text())
        assert state["world_size"] == 2
    assert _rollouts(sweep / "0") != _rollouts(sweep / "1")  # each job ran its own seed


# FSDP2 with the adapter served: each rank's engine loads the adapter gathered from the shards.
@pytest.mark.parametrize(("strategy", "sync"), [("ddp", "merged"), ("fsdp2", "adapter")])
def test_each_rank_runs_its_own_vllm_engine(tmp_path, strategy, sync):
    pytest.importorskip("vllm")
    run = tmp_path / "vllm"
    r = _rlft("model=tiny", "sampler=vllm", "sampler.vllm.kv_cache_gb=0.25", "sampler.vllm.max_model_len=256",
              "trainer.steps=2", "trainer.num_prompts=2", "sampler.n=2", "sampler.max_new_tokens=8", "data.num_eval=2",
              "trainer.nproc=2", "trainer.threads=1", "logger.rollouts=true", f"trainer.strategy={strategy}",
              f"sampler.vllm.sync={sync}", f"hydra.run.dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "x 2 ranks" in (run / "train.log").read_text()
    rows = _rollouts(run)
    assert {row["group"] for row in rows if row["step"] == 1} == {0, 1}  # one group from each rank's engine
