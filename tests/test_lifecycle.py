"""Export, eval and sweeps, through the real command line."""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from rlft.commands.export import checkpoint_config, find_checkpoint
from rlft.models.loading import load_base
from rlft.models.policy import wrap_lora
from rlft.output.tracking import read_metrics
from rlft.state.run_state import load_policy_weights
from rlft.training.evaluation import pass_at_k
from tests.support import TINY, run_cli

TRAINED = [*TINY, "trainer.steps=3", "reward.fns=[tests.helpers:char_count]", "reward.weights=[1]",
           "optim.lr=2e-2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    r = run_cli(["train", *TRAINED, f"hydra.run.dir={run}"], Path.cwd())
    assert r.returncode == 0, r.stderr[-2000:]
    return run


def _logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=ids).logits.float(), -1)


def _ids() -> torch.Tensor:
    return torch.tensor([[1, 5, 9, 200, 3000, 17, 42, 7], [2, 400, 30, 11, 12, 13, 900, 5]])


def _trained_policy_fp32(ckpt: Path):
    cfg = checkpoint_config(ckpt)
    base, _ = load_base(cfg.model, torch.float32, cfg.seed)
    model = wrap_lora(base, cfg.model.lora)
    load_policy_weights(model, ckpt)
    return model.eval(), cfg


def test_export_merged_loads_in_transformers_with_the_policys_logprobs(trained, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "merged"
    r = run_cli(["export", str(trained), str(out)], Path.cwd())
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert AutoTokenizer.from_pretrained(str(out)).eos_token_id is not None

    policy, cfg = _trained_policy_fp32(find_checkpoint(trained))
    got, want = _logprobs(exported, _ids()), _logprobs(policy, _ids())
    base, _ = load_base(cfg.model, torch.float32, cfg.seed)
    untrained = _logprobs(base.eval(), _ids())
    # fp32 on both sides: merging W + BA only reorders float additions (~1e-6).
    assert (got - want).abs().max() < 1e-4
    assert (untrained - want).abs().max() > 1e-2, "training did not move the policy; the check would be vacuous"

    r = run_cli(["export", str(trained), str(out)], Path.cwd())
    assert r.returncode == 2 and "not empty" in r.stderr


def test_export_adapter_only_loads_in_peft(trained, tmp_path):
    from peft import PeftModel

    out = tmp_path / "adapter"
    r = run_cli(["export", str(trained / "checkpoints" / "step_000003"), str(out), "--adapter-only"], Path.cwd())
    assert r.returncode == 0, r.stderr[-2000:]
    policy, cfg = _trained_policy_fp32(find_checkpoint(trained))
    base, _ = load_base(cfg.model, torch.float32, cfg.seed)
    loaded = PeftModel.from_pretrained(base, str(out)).eval()
    assert (_logprobs(loaded, _ids()) - _logprobs(policy, _ids())).abs().max() < 1e-5


def test_pass_at_k_matches_enumeration():
    for n, c, k in [(4, 0, 1), (4, 1, 1), (4, 1, 2), (5, 2, 3), (8, 3, 8), (8, 8, 4), (6, 5, 2)]:
        outcomes = [True] * c + [False] * (n - c)
        subsets = list(itertools.combinations(outcomes, k))
        brute = sum(any(s) for s in subsets) / len(subsets)
        assert math.isclose(pass_at_k(n, c, k), brute, abs_tol=1e-12), (n, c, k)


@pytest.mark.slow  # two CLI evaluations (~17 s)
def test_eval_checkpoint_and_base(trained, tmp_path):
    out = tmp_path / "eval.json"
    r = run_cli(["eval", str(trained), "sampler.name=hf", "data.num_eval=12", "reward.fns=[tests.helpers:answer_is_even]",
                 "--samples", "4", "--out", str(out)], Path.cwd())
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["problems"] == 12 and res["samples"] == 4
    # The judge ignores the completion: every metric is the share of even answers, computed here
    # from the task itself; a mix-up of problems, samples or answers would change them.
    cfg = checkpoint_config(find_checkpoint(trained), ["data.num_eval=12"])
    from rlft.data import build_task

    even = [int(p.answer) % 2 == 0 for p in build_task(cfg.data, cfg.seed).eval_problems]
    assert len(even) == 12 and 0 < sum(even) < 12
    for key in ("eval/accuracy", "eval/pass@1", "eval/pass@4"):
        assert res[key] == pytest.approx(sum(even) / 12), key
    assert "pass@4" in r.stdout
    # The checkpoint was trained on char_count (longer is better): it fills the 8-token budget.
    assert res["eval/mean_tokens"] == pytest.approx(8.0)

    base_out = tmp_path / "base.json"
    # overrides before and after the options, as users write them
    r = run_cli(["eval", "model=tiny", "--samples", "0", "sampler=hf", "--out", str(base_out), "data.num_eval=12"],
                Path.cwd())
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(base_out.read_text())["model"] == "tiny" and json.loads(base_out.read_text())["problems"] == 12
    assert "warn" not in (r.stdout + r.stderr).lower()  # other libraries' output goes to base.log

    r = run_cli(["eval", str(tmp_path / "missing"), "--out", str(base_out)], Path.cwd())
    assert r.returncode == 2 and "no such checkpoint" in r.stderr


def test_eval_writes_into_the_run_directory_by_default(trained, tmp_path):
    """Not ./eval.json, which the evaluation of another run from the same directory would overwrite."""
    r = run_cli(["eval", str(trained), "sampler.name=hf", "data.num_eval=4", "reward.fns=[math_correct]", "--samples", "0"],
                tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = trained / "eval_step_000003.json"
    assert json.loads(out.read_text())["problems"] == 4 and f"wrote {out}" in r.stdout
    assert not (tmp_path / "eval.json").exists()
    helped = run_cli(["eval", "--help"], tmp_path).stdout
    assert "default: 8" in helped and "eval_step_NNNNNN.json in the run" in " ".join(helped.split())


@pytest.mark.slow
def test_sweep_runs_every_job_and_survives_a_failing_one(tmp_path):
    """The second job fails at run time (its reward raises); the jobs after it still run to the end."""
    root = tmp_path / "sweep"
    good, bad = "[tests.helpers:char_count]", "[tests.helpers:raise_always]"
    r = run_cli(["train", "-m", *TINY, "algo=grpo,dapo", f"reward.fns={good},{bad}", f"hydra.sweep.dir={root}"],
                Path.cwd())
    assert r.returncode == 1, "a failed job must make the sweep's exit status non-zero"
    rows = list(csv.DictReader((root / "summary.csv").open()))
    assert [x["job"].replace("\\:", ":") for x in rows] == [f"algo={a},reward.fns={f}" for a in ("grpo", "dapo") for f in (good, bad)]
    assert [x["status"] for x in rows] == ["ok", "failed (exit 1)", "ok", "failed (exit 1)"]
    assert "a bug in the user's reward" in r.stderr
    for x in rows:
        run = Path(x["run_dir"])
        if x["status"] != "ok":
            assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
            continue
        assert x["steps"] == "2" and x["eval/accuracy"] != ""
        assert [m["step"] for m in read_metrics(run / "metrics.jsonl")] == [0, 1, 2]
        assert (run / "plots.png").stat().st_size > 1000
        assert (run / "checkpoints" / "step_000002").is_dir()
        algo = x["job"].split(",")[0].removeprefix("algo=")
        assert f"name: {algo}" in (run / "config.yaml").read_text()
    assert (root / "summary.png").stat().st_size > 1000


def test_no_two_evaluation_samples_share_a_seed(compose_cfg):
    """Sampled evaluation seeds each problem (vLLM's children take seed + j): one seed for every problem
    gave sample j of each problem the same noise, correlating pass@k's samples across problems."""
    from rlft.samplers.base import completion_seeds
    from rlft.training.evaluation import sampled_params

    params = sampled_params(compose_cfg(*TINY), num_problems=200, samples=8)
    seeds = completion_seeds(params)
    assert len(seeds) == 200 * 8 and len(set(seeds)) == len(seeds)
    assert len(set(sampled_params(compose_cfg(*TINY, "seed=2"), 200, 8).prompt_seeds) & set(params.prompt_seeds)) == 0
