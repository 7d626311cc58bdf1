"""rlft check: verdicts on configs built to trigger each (the tiny random model, real sampling, scoring and
update), none on a config that can learn, the restored training state, and the CLI (exit codes 0/1/2, --json,
nothing left on disk)."""

from __future__ import annotations

import json

import pytest
import torch

from rlft.check.measure import check
from rlft.check.render import rows
from rlft.check.report import Report, Verdict, distribution, equal_groups
from rlft.check.verdicts import verdicts
from rlft.config import compose
from tests.support import ROOT, TINY, one_error_line, run_cli, write_eos_model

CHECK = [*TINY, "model.dtype=fp32", "trainer.threads=1"]


def _check(*overrides: str, prompts: int = 2) -> Report:
    return check(compose([*CHECK, *overrides])[0], prompts)


def _keys(r: Report) -> dict[str, bool]:
    return {v.key: v.blocks for v in r.verdicts}


@pytest.fixture(scope="module")
def eos_model(tmp_path_factory):
    """The tiny model that ends most of its replies with EOS (the plain random one never stops)."""
    path = tmp_path_factory.mktemp("eos")
    write_eos_model(path, eos_logit=14.0)
    return path


def test_a_constant_reward_blocks_with_the_groups_counted():
    r = _check("reward.fns=[tests.helpers:one]", "reward.weights=[1]")
    assert _keys(r)["no_signal"] is True and r.blocked
    (v,) = [v for v in r.verdicts if v.key == "no_signal"]
    assert "2 of 2 groups score the same (all 1)" in v.message and "algo=grpo" in v.message
    assert "raise sampler.n or sampler.temperature" in v.fix
    assert r.signal["groups_with_gradient"] == 0 and r.signal["update_skipped"] is False  # GRPO's KL term still steps
    assert r.signal["scorers"]["tests.helpers:one"]["values"] == [1.0]


def test_dapo_says_its_dynamic_sampling_drops_every_group():
    r = _check("algo=dapo", "reward.fns=[tests.helpers:one]", "reward.weights=[1]", "algo.max_sampling_rounds=3")
    (v,) = [v for v in r.verdicts if v.key == "no_signal"]
    assert v.blocks and "dynamic sampling drops such groups" in v.message
    assert r.cost["rounds"] == 3  # every step would draw all its rounds


def test_a_reward_with_variance_gives_no_verdict(eos_model):
    """The EOS tiny model (replies end before max_new_tokens), a length-based reward: every group differs."""
    r = _check("model=local", f"model.path={eos_model}", "sampler.max_new_tokens=16", "reward.fns=[tests.helpers:char_count]",
               "reward.weights=[1]", prompts=4)
    assert r.verdicts == [], [v.message for v in r.verdicts]
    assert r.signal["groups_with_gradient"] == 4 and r.signal["equal_groups"]["count"] == 0
    assert r.cost["memory"] is None  # the GPU memory arithmetic and peak: CUDA only (tests/gpu/test_cuda_check.py)
    assert r.lengths["truncated_share"] < 0.5 and r.lengths["stopped_share"] > 0.5
    assert all(s["passed"] for s in r.cost["sync_check"].values()) and "after the update" in r.cost["sync_check"]
    assert r.cost["seconds"]["update"] > 0 and r.cost["projected_s"] == pytest.approx(r.cost["step_s"] * 2)  # TINY: trainer.steps=2


def test_a_tiny_max_new_tokens_is_named():
    r = _check("sampler.max_new_tokens=2", "reward.fns=[tests.helpers:char_count]", "reward.weights=[1]",
               "trainer.max_minutes=0.0001")
    (v,) = [v for v in r.verdicts if v.key == "truncated"]
    assert "100% of replies reach sampler.max_new_tokens=2" in v.message and not v.blocks
    assert r.lengths["reply_tokens"]["max"] == 2.0
    # The run ends after the step that crosses trainer.max_minutes: one step here.
    assert r.cost["steps"] == 1 and r.cost["projected_s"] == pytest.approx(r.cost["step_s"])


def test_truncation_blocks_when_the_overlong_filter_masks_every_reply():
    r = _check("algo=dapo", "sampler.max_new_tokens=2", "reward.fns=[tests.helpers:char_count]", "reward.weights=[1]",
               "algo.overlong_penalty=false")
    (v,) = [v for v in r.verdicts if v.key == "truncated"]
    assert v.blocks and "algo.overlong_filter masks every one" in v.message


def test_a_judge_that_never_parses():
    """The tiny random judge repeats the rubric's last token: no reply of it parses, so nothing is scored."""
    r = _check("reward.fns=[]", "reward.weights=[]", "reward.judges=[{model:tiny,max_new_tokens:4}]")
    keys = _keys(r)
    assert keys["unscored"] is True and keys["judge_unparsed"] is False
    (v,) = [v for v in r.verdicts if v.key == "judge_unparsed"]
    assert "the judge's output did not parse in 8 of 8 replies" in v.message
    assert r.signal["events"] == {"judge/unparsed": 8} and r.signal["unscored_share"] == 1.0


def test_tools_never_called():
    r = _check("tools=[calculator]", "episode.max_turns=2", "reward.fns=[tests.helpers:char_count]", "reward.weights=[1]")
    (v,) = [v for v in r.verdicts if v.key == "no_tool_calls"]
    assert v.message.startswith("no reply called a tool (calculator)")
    ep = r.lengths["episodes"]
    assert ep["tools"] == ["calculator"] and ep["events"].get("tool_calls", 0) == 0 and ep["turns"]["max"] == 1.0
    assert ep["count"] == 8  # 2 prompts x sampler.n=4
    assert ("lengths", "tool calls", "0 over 8 episodes (calculator); errors 0: none") in rows(r)
    assert "calculator" in r.rendering["first_prompt"]  # the tools' description is part of what the policy reads
    assert "turn_suffix" in r.rendering


def test_reward_calls_that_time_out_are_counted_and_named(eos_model):
    """A reward that hangs on odd-length replies, scored reward.on_timeout: the signal's timed-out share is
    the share of those replies, and a verdict names the function."""
    r = _check("model=local", f"model.path={eos_model}", "sampler.max_new_tokens=16",
               "reward.fns=[tests.helpers:hangs_on_odd_length]", "reward.weights=[1]", "reward.timeout_s=1",
               "reward.on_timeout=-1", "reward.num_workers=4")
    share, name = r.signal["timed_out_share"], "tests.helpers:hangs_on_odd_length"
    assert 0 < share < 1 and r.signal["events"][f"{name}/timed_out"] == round(share * r.run["samples"])
    assert r.signal["scorers"][name]["min"] == -1.0  # what the timed-out ones scored
    (v,) = [v for v in r.verdicts if v.key == "reward_timed_out"]
    assert not v.blocks and "tests.helpers:hangs_on_odd_length timed out or died on" in v.message
    assert "reward.timeout_s" in v.fix
    assert any(k == "timed out" and "of reward function scores" in text for _, k, text in rows(r))
    assert _check("reward.fns=[tests.helpers:char_count]", "reward.weights=[1]").signal["timed_out_share"] is None


def test_a_template_without_a_generation_prompt(tmp_path):
    from rlft.models.loading import load_base

    cfg, _, _ = compose(CHECK)
    model, tok = load_base(cfg.model, torch.float32, 0)
    tok.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    r = _check("model=local", f"model.path={tmp_path}", "reward.fns=[tests.helpers:char_count]", "reward.weights=[1]")
    (v,) = [v for v in r.verdicts if v.key == "no_generation_prompt"]
    assert "the prompt ends inside the user's turn" in v.message
    assert r.rendering["generation_prompt"] is False and r.rendering["first_prompt"].endswith("<|im_end|>\n")
    assert _check("reward.fns=[tests.helpers:char_count]", "reward.weights=[1]").rendering["generation_prompt_text"] \
        == "<|im_start|>assistant\n"


def test_the_update_leaves_the_training_state_as_it_found_it():
    """At lr 0.1 a kept update would move every trainable weight; check() puts them back."""
    from rlft.training.components import build_components

    cfg = compose([*CHECK, "optim.lr=0.1", "reward.fns=[tests.helpers:char_count]", "reward.weights=[1]"])[0]
    c = build_components(cfg)
    before = {n: p.detach().clone() for n, p in c.policy.model.named_parameters() if p.requires_grad}
    r = check(cfg, 2, c)
    assert r.signal["update_skipped"] is False and r.signal["groups_with_gradient"] > 0
    after = dict(c.policy.model.named_parameters())
    assert before and all(torch.equal(after[n], p) for n, p in before.items())


def test_the_check_learns_with_the_steps_own_code_and_leaves_the_callers_config(monkeypatch):
    """The update it times is train_step's (rlft.training.learner.learn: a warm-up on one group, then the batch), and
    a run under trainer.strategy=fsdp2 is checked in one process without the caller's config changing."""
    import rlft.check.measure as measure
    from rlft.training.learner import learn

    seen = []

    def counted(c, batch, cfg):
        seen.append(batch.input_ids.shape[0])
        return learn(c, batch, cfg)

    monkeypatch.setattr(measure, "learn", counted)
    cfg = compose([*CHECK, "trainer.strategy=fsdp2", "model.dtype=auto", "reward.fns=[tests.helpers:char_count]",
                   "reward.weights=[1]"])[0]
    r = check(cfg, 2)
    assert cfg.trainer.strategy == "fsdp2" and cfg.model.dtype == "auto"  # not what the check resolved it to
    n = cfg.sampler.n
    assert seen == [n, 2 * n] and r.cost["seconds"]["update"] > 0


# Pure verdict logic on hand-made reports: thresholds and wording.

def _report(**signal) -> Report:
    totals = signal.pop("totals", [0.0, 1.0, 0.0, 1.0])
    groups = signal.pop("groups_of", [0, 0, 1, 1])
    s = {"total": distribution(totals), "scorers": {"f": distribution(totals)}, "equal_groups": equal_groups(totals, groups),
         "groups_with_gradient": 2, "groups": len(set(groups)), "learns_from_zero_advantages": False,
         "dynamic_sampling": False, "unscored_share": 0.0, "events": {}, "events_share": {}, "update_skipped": False}
    s.update(signal)
    lengths = {"prompt_tokens": {"min": 5, "mean": 5, "max": 5}, "max_prompt_tokens": 0, "sampler_room": None,
               "dropped": None, "reply_tokens": {"min": 1, "mean": 2, "max": 3}, "max_new_tokens": 8,
               "truncated_share": 0.0, "stopped_share": 1.0}
    return Report({"algo": "grpo"}, s, lengths, {"generation_prompt": True}, {"sync_check": {}})


def test_verdict_thresholds():
    assert verdicts(_report()) == []
    weak = verdicts(_report(totals=[0, 0, 0, 1, 1, 1], groups_of=[0, 0, 1, 1, 2, 2], groups_with_gradient=1))
    assert [(v.key, v.blocks) for v in weak] == [("weak_signal", False)]
    assert "2 of 3 groups score the same (1 at 0, 1 at 1)" in weak[0].message
    # PPO (GAE with a critic): groups that score alike still carry advantages, and differ from each other.
    assert verdicts(_report(totals=[0, 0, 0, 0, 1, 1], groups_of=[0, 0, 1, 1, 2, 2], groups_with_gradient=3,
                            learns_from_zero_advantages=True)) == []
    unscored = verdicts(_report(totals=[float("nan")] * 4))
    assert [(v.key, v.blocks) for v in unscored] == [("unscored", True)]
    r = _report()
    r.cost["sync_check"] = {"start-up": {"passed": False, "message": "by mean 3"}}
    assert [(v.key, v.blocks) for v in verdicts(r)] == [("sync", True)]
    r = _report()
    r.lengths["episodes"] = {"tools": ["python"], "events": {"tool_calls": 4, "tool_errors": 3, "tool_errors/timeout": 2,
                                                            "tool_errors/raised": 1}}
    (v,) = verdicts(r)
    assert v.key == "tool_errors" and "3 of 4 tool calls came back as errors (timeout 2, raised 1)" in v.message


def test_blocking_verdicts_come_first():
    r = _report(totals=[0.0] * 4, groups_with_gradient=0)
    r.lengths["truncated_share"] = 0.75
    assert [(v.key, v.blocks) for v in verdicts(r)] == [("no_signal", True), ("truncated", False)]
    assert isinstance(verdicts(r)[0], Verdict)


# The command line.

@pytest.mark.slow
def test_cli_exit_codes_json_and_nothing_left_behind(tmp_path, eos_model):
    ok = run_cli(["check", *CHECK, "model=local", f"model.path={eos_model}", "sampler.max_new_tokens=16",
                  "reward.fns=[tests.helpers:char_count]", "reward.weights=[1]", "--prompts", "3",
                  "--json", "out/ok.json"], tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "nothing blocks learning" in ok.stdout and "groups carrying a gradient" in ok.stdout
    data = json.loads((tmp_path / "out" / "ok.json").read_text())
    assert data["blocked"] is False and data["verdicts"] == [] and data["run"]["prompts"] == 3
    assert set(data) >= {"run", "signal", "lengths", "rendering", "cost"}
    assert data["cost"]["dtype"] == "fp32" and data["rendering"]["first_prompt"].startswith("<|im_start|>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no outputs/, no checkpoints

    bad = run_cli(["check", *CHECK, "reward.fns=[tests.helpers:one]", "reward.weights=[1]", "--json=b.json"], tmp_path)
    assert bad.returncode == 1, bad.stderr[-2000:]
    assert "BLOCKS" in bad.stdout and "no signal" in bad.stdout and "Traceback" not in bad.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["blocked"] is True and data["verdicts"][0]["key"] == "no_signal"

    assert "sampler.nn" in one_error_line(run_cli(["check", *CHECK, "sampler.nn=3"], tmp_path), 2)
    assert "--prompts 0" in one_error_line(run_cli(["check", *CHECK, "--prompts", "0"], tmp_path), 2)
    cfg = run_cli(["check", *CHECK, "--cfg"], ROOT)
    assert cfg.returncode == 0 and "max_new_tokens: 8" in cfg.stdout
