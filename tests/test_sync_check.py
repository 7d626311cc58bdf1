"""The sync check (rlft/sync/verify.py): after each weight sync the sampler scores a probe as the learner does,
and a sync broken on purpose (tests/sync_break.py) stops the run in one line, warns, or is not looked at."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import rlft.training.components as components_mod
from rlft.config import compose
from rlft.config.validation import vllm_available
from rlft.data import build_task
from rlft.data.chat import problem_ids
from rlft.errors import ConfigError, SyncError
from rlft.models import build_policy
from rlft.models.policy import Policy
from rlft.parallel.distributed import DataParallel
from rlft.samplers import build_sampler, check_mergeable, sync_sampler
from rlft.samplers.readback import columns
from rlft.sync.served_weights import Merged, differing
from rlft.sync.verify import (
    PROMPT_TAIL,
    TOL_FP32,
    TOL_LOW_PRECISION,
    build_check,
    learner_logprobs,
    measure,
    mismatch,
    tolerance,
    verify,
)
from rlft.training.loop import train
from tests import sync_break
from tests.support import TINY, one_error_line, run_cli

# A reward that varies across random completions, so every step moves the adapters.
# The probe at every check (by default it skips checks where the read-back covers every trained weight).
FP32 = TINY + ["model.dtype=fp32", "optim.lr=3e-2", "reward.fns=[tests.helpers:char_count]",
               "sampler.sync_probe_every=1"]
# The unsloth-zoo #941 bug: one projection of one layer never reaches the sampler.
SKIP = "layers.1.mlp.up_proj"


def _setup(overrides: list[str]):
    cfg, _, _ = compose(overrides)
    policy, copy = build_policy(cfg.model, 0, need_reference=False)
    sampler = build_sampler(cfg.sampler, cfg.model, copy, policy.tokenizer, 0)
    return cfg, policy, sampler, build_check(cfg, policy, sampler, build_task(cfg.data, 0))


def _update(policy: Policy, scale: float = 0.05) -> None:
    """An update that moves every adapter (B starts at 0)."""
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p) * scale)


def _by_hand(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log_softmax(logits)[next token] from one plain forward of the whole sequence."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


@pytest.fixture(scope="module")
def fp32_hf():
    torch.manual_seed(0)
    return _setup(FP32)


def test_probe_is_the_first_prompts_tail_and_a_fixed_sentence(fp32_hf):
    cfg, policy, _, check = fp32_hf
    first = problem_ids(policy.tokenizer, build_task(cfg.data, 0).batch(0, 1)[0], cfg.data)
    assert check.probe.prompt == first[-PROMPT_TAIL:]
    assert 10 <= len(check.probe.completion) <= 20
    assert check.where == "sampler=hf, sync=merged" and check.mode == "error"
    assert (check.tol, check.tol_source) == (TOL_FP32, "fp32")


def test_both_sides_equal_a_plain_forward(fp32_hf):
    """Learner and sampler log-probs each match an independent computation (full logits, log_softmax, gather)."""
    _, policy, sampler, check = fp32_hf
    p, c = check.probe.prompt, check.probe.completion
    _update(policy)
    sync_sampler(sampler, policy)
    policy.model.train()  # the check must score in eval mode and leave the mode as it found it
    learner = learner_logprobs(policy, check.probe)
    assert policy.model.training
    policy.model.eval()
    torch.testing.assert_close(learner, _by_hand(policy.model, p, c), atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(sampler.score(p, c)), _by_hand(sampler.model, p, c), atol=1e-5, rtol=0)
    assert learner.shape == (len(c),) and (learner < 0).all()


def test_honest_fp32_sync_passes_and_a_stale_one_does_not(fp32_hf):
    _, policy, sampler, check = fp32_hf
    sync_sampler(sampler, policy)
    honest = measure(check, sampler, policy)
    assert honest["sync/logp_abs_diff_max"] < 1e-5 and mismatch(check, honest, "now") is None
    _update(policy)  # the policy moved, the sampler did not hear of it
    stale = measure(check, sampler, policy)
    assert stale["sync/logp_abs_diff_mean"] > 10 * TOL_FP32
    assert stale["sync/logp_abs_diff_max"] >= stale["sync/logp_abs_diff_mean"] > 0
    assert stale["time/sync_check_s"] > 0
    sync_sampler(sampler, policy)
    assert measure(check, sampler, policy)["sync/logp_abs_diff_max"] < 1e-5


def test_the_sides_run_side_by_side_and_either_ones_failure_reaches_the_caller(fp32_hf, monkeypatch):
    """The learner's pass runs in its own thread while the sampler scores in the caller's; an error on
    either side is raised by measure (no thread left behind) and the thread count comes back."""
    import threading

    import rlft.sync.verify as sync_check_mod

    _, policy, sampler, check = fp32_hf
    threads, where = torch.get_num_threads(), {}
    real_learner, real_score = sync_check_mod.learner_logprobs, sampler.score

    def learner(*args):
        where["learner"] = (threading.get_ident(), torch.get_num_threads())
        return real_learner(*args)

    def score(*args):
        where["sampler"] = threading.get_ident()
        return real_score(*args)

    monkeypatch.setattr(sync_check_mod, "learner_logprobs", learner)
    monkeypatch.setattr(sampler, "score", score)
    before = threading.active_count()
    measure(check, sampler, policy)
    assert where["sampler"] == threading.get_ident() and where["learner"][0] != threading.get_ident()
    assert where["learner"][1] == 1  # the fresh thread took the check's one-thread setting

    def broken(*_):
        raise RuntimeError("side failed")

    for side in ("learner", "sampler"):
        monkeypatch.setattr(sync_check_mod, "learner_logprobs", broken if side == "learner" else learner)
        monkeypatch.setattr(sampler, "score", broken if side == "sampler" else score)
        with pytest.raises(RuntimeError, match="side failed"):
            measure(check, sampler, policy)
        assert threading.active_count() == before and torch.get_num_threads() == threads


def test_a_sync_that_skips_one_projection_is_caught(fp32_hf, monkeypatch):
    _, policy, sampler, check = fp32_hf
    _break_in_process(monkeypatch)
    assert any(SKIP in n for n, _ in policy.model.named_parameters())
    _update(policy)
    sync_sampler(sampler, policy)
    with pytest.raises(SyncError) as e:
        verify(check, sampler, policy, DataParallel(), "after the step 7 sync")
    msg = str(e.value)
    assert "\n" not in msg and "after the step 7 sync (sampler=hf, sync=merged)" in msg
    assert "tolerance 0.001, fp32" in msg and "sampler.sync_check=warn" in msg
    assert "1 of 14 synced weights the sampler serves differ from the learner's: model.layers.1.mlp.up_proj (" in msg
    m = measure(check, sampler, policy)
    assert f"mean {m['sync/logp_abs_diff_mean']:.3g}, max {m['sync/logp_abs_diff_max']:.3g}" in msg
    monkeypatch.undo()
    sync_sampler(sampler, policy)  # the whole sync mends it
    assert verify(check, sampler, policy, DataParallel(), "now")["sync/logp_abs_diff_max"] < 1e-5


# Breaks at the default lr (2e-4): AdamW's first step moves each adapter weight by +-lr (m / sqrt(v) = sign(g)),
# which moves the probe's log-probs by less than either dtype's tolerance: only the served weights show the miss.
DEFAULT_LR = 2e-4
BREAKS = {
    "nothing": lambda sw: (lambda policy: iter(())),
    "one tensor": lambda sw: sync_break.skipping_weights(SKIP, sw),
    "one LoRA target": lambda sw: sync_break.skipping_weights("v_proj", sw),
    "one layer": lambda sw: sync_break.skipping_weights("layers.0.", sw),
    "the previous step's": sync_break.lagging,
}


def _adamw_first_step(policy: Policy, lr: float = DEFAULT_LR) -> None:
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p).sign() * lr)


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def hf_by_dtype(request):
    torch.manual_seed(0)
    return request.param, _setup(FP32 + [f"model.dtype={request.param}"])


@pytest.mark.parametrize("kind", list(BREAKS))
def test_a_broken_sync_at_the_default_lr_is_caught_at_the_next_check(hf_by_dtype, kind, monkeypatch):
    dtype, (_, policy, sampler, check) = hf_by_dtype
    monkeypatch.setattr(Policy, "sampler_weights", BREAKS[kind](Policy.sampler_weights))
    sync_sampler(sampler, policy)  # the lagging sync remembers this one
    _adamw_first_step(policy)
    sync_sampler(sampler, policy)
    with pytest.raises(SyncError, match="synced weights the sampler serves differ from the learner's") as e:
        verify(check, sampler, policy, DataParallel(), "after the step 3 sync")
    m = measure(check, sampler, policy)
    print(f"{dtype} {kind}: {m}")
    assert m["sync/logp_abs_diff_mean"] < check.tol, "the probe alone would have caught this"
    assert m["sync/weights_read"] == len(check.modules) == 14
    differ = {"nothing": 14, "one tensor": 1, "one LoRA target": 2, "one layer": 7, "the previous step's": 14}[kind]
    assert m["sync/weights_differ"] == differ and str(e.value).count(" read elements)") == min(differ, 3)
    monkeypatch.undo()
    sync_sampler(sampler, policy)
    assert verify(check, sampler, policy, DataParallel(), "now")["sync/weights_differ"] == 0


def test_the_probe_runs_every_nth_check_where_the_read_back_covers_training(monkeypatch):
    """sampler.sync_probe_every=3 under LoRA on linear layers: the probe's log-probs at checks 0, 3, 6, the
    read-back at every check, and a sync that delivers nothing caught at a check without the probe."""
    torch.manual_seed(0)
    _, policy, sampler, check = _setup(FP32 + ["sampler.sync_probe_every=3"])
    assert check.covered and check.probe_every == 3
    probed = []
    for _ in range(7):
        _adamw_first_step(policy)
        sync_sampler(sampler, policy)
        m = verify(check, sampler, policy, DataParallel(), "now")
        probed.append("sync/logp_abs_diff_mean" in m)
        assert (m["sync/weights_read"], m["sync/weights_differ"]) == (14, 0)
    assert probed == [True, False, False, True, False, False, True]
    monkeypatch.setattr(sampler, "load_weights", lambda weights: None)
    _adamw_first_step(policy)
    sync_sampler(sampler, policy)
    with pytest.raises(SyncError, match=r"14 of 14 synced weights the sampler serves differ from the learner's: "
                                        r"[^;]*; the sampler is not sampling"):
        verify(check, sampler, policy, DataParallel(), "after the step 8 sync")  # check 7: no probe
    monkeypatch.undo()

    def unreadable(names):
        raise RuntimeError("no such buffer")

    sync_sampler(sampler, policy)
    monkeypatch.setattr(sampler, "read_served", unreadable)
    m = measure(check, sampler, policy)  # check 8: the read-back fails, so the probe runs now and from then on
    assert m["sync/weights_read"] == 0 and m["sync/logp_abs_diff_max"] < 1e-5
    assert "sync/logp_abs_diff_mean" in measure(check, sampler, policy) and check.cache["probe_always"]


@pytest.mark.parametrize("extra, covered", [([], True), (["model.lora.enabled=false"], False),
                                            (["model.lora.target_modules=[q_proj,embed_tokens]"], False)])
def test_the_probe_runs_at_every_check_where_training_is_not_all_read_back(extra, covered):
    torch.manual_seed(0)
    cfg, policy, sampler, check = _setup(TINY + extra)
    assert check.covered is covered and check.probe_every == 10
    every = [("sync/logp_abs_diff_mean" in measure(check, sampler, policy)) for _ in range(3)]
    assert every == [True, not covered, not covered]
    if not covered:
        with pytest.raises(ConfigError, match=r"sampler.sync_probe_every=4 does nothing here: the read-back does not "
                                              r"cover every weight the learner trains \(sampler=hf"):
            build_check(dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, sync_probe_every=4)),
                        policy, sampler, build_task(cfg.data, 0))


def test_the_weight_comparison_is_exact_to_rounding(hf_by_dtype):
    """An honest sync reads back every element as the learner's value rounded to the sampler's dtype; a
    served weight one rounding step off (the smallest change a sync can miss) differs."""
    dtype, (_, policy, sampler, check) = hf_by_dtype
    _adamw_first_step(policy)
    sync_sampler(sampler, policy)
    assert measure(check, sampler, policy)["sync/weights_differ"] == 0
    w = sampler.model.get_parameter("model.layers.0.self_attn.o_proj.weight")
    col = columns(w.shape[1])[3]
    with torch.no_grad():
        w[5, col] = torch.nextafter(w[5, col].float(), torch.tensor(9.0)).to(w.dtype) if dtype == "fp32" else \
            (w[5, col].float() * (1 + 2**-7)).to(w.dtype)
    assert measure(check, sampler, policy)["sync/weights_differ"] == (1 if dtype == "bf16" else 0)
    if dtype == "fp32":  # past the 16 fp32 steps the learner's sum over a slice may move
        with torch.no_grad():
            w[5, col] = w[5, col] * (1 + 40 * 2**-24)
        assert measure(check, sampler, policy)["sync/weights_differ"] == 1
    sync_sampler(sampler, policy)


def test_rounding_comparison_by_hand():
    """A served element passes when it is the learner's fp32 value rounded to the comparison dtype: a bf16
    learner's base under an fp32 engine (the model's fp32 files) passes at bf16, not at fp32; a weight
    that must be 0 is 0."""
    def count(want, served, dtype):
        return differing({"w": Merged(want, torch.zeros_like(want))}, {"w": (served,)}, dtype)["w"]

    files = torch.tensor([[0.1234567, -0.7654321, 3.3e-3]])
    learner = files.to(torch.bfloat16).float()  # a bf16 learner holds its base rounded
    assert count(learner, files, torch.bfloat16) == (0, 3)
    assert count(learner, files, torch.float32) == (3, 3)
    assert count(learner, files.to(torch.bfloat16), torch.bfloat16) == (0, 3)
    off = learner.to(torch.bfloat16).view(torch.int16) + torch.tensor([[1, 0, -1]], dtype=torch.int16)
    assert count(learner, off.view(torch.bfloat16), torch.bfloat16) == (2, 3)  # one bf16 step
    zero = torch.zeros(1, 2)
    assert count(zero, torch.tensor([[0.0, 1e-3]]), torch.bfloat16) == (1, 2)
    assert count(zero, torch.zeros(2, 1), torch.bfloat16) == (2, 2)  # another shape: all differ


def test_a_merged_weight_where_base_and_delta_cancel_passes_at_its_sums_rounding():
    """Seen after one fp32 update of the tiny model: base + B @ A * scaling near 0, the learner's sum over four
    columns and the sampler's over the whole weight 128 fp32 steps of the value apart, 0.02 steps of the terms'
    magnitude. The slack covers the two sums' rounding (r steps each of |B| @ |A| * scaling), not an update."""
    torch.manual_seed(0)
    r, scaling = 8, 2.0
    b, a = torch.randn(1, r) * 0.05, torch.randn(r, 4) * 0.05
    delta = b @ a * scaling
    base = -delta + torch.tensor([[-2.29e-6, 1e-3, 0.0, 5e-7]])  # near cancellation
    want = base + delta
    slack = b.abs() @ a.abs() * scaling * 2 * r * 2.0 ** -24
    resummed = base + (b.double() @ a.double() * scaling).float()  # the same sum, rounded once
    off = want + torch.tensor([[2.9e-11, 0.0, 0.0, 0.0]])  # the seen difference
    for served in (resummed, off):
        assert differing({"w": Merged(want, slack)}, {"w": (served,)}, torch.float32)["w"] == (0, 4)
        assert differing({"w": Merged(want, torch.zeros_like(want))}, {"w": (off,)}, torch.float32)["w"][0] >= 1
    stale = base + delta * 0.999  # one more update's worth away from the served weights
    assert differing({"w": Merged(want, slack)}, {"w": (stale,)}, torch.float32)["w"][0] >= 3


def test_full_fine_tuning_compares_every_linear_layer():
    """Without LoRA the read-back compares every linear weight but the LM head: a push that delivers nothing
    after an update differs in all 14, the honest push in none."""
    torch.manual_seed(0)
    _, policy, sampler, check = _setup(FP32 + ["model.lora.enabled=false"])
    assert len(check.modules) == 14 and not any("lm_head" in n for n in check.modules)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    assert measure(check, sampler, policy)["sync/weights_differ"] == 14
    sync_sampler(sampler, policy)
    assert measure(check, sampler, policy)["sync/weights_differ"] == 0


def test_lora_on_an_embedding_leaves_it_to_the_probe(tmp_path):
    """peft's LoRA embedding has no lora_A linear: the read-back compares the linear targets only (it
    raised KeyError before). The tiny model ties its embedding to the LM head, so the merged sync also
    changes the sampler's LM head, which the learner's adapter leaves alone: the probe sees that, and a run
    refuses such targets at start-up."""
    torch.manual_seed(0)
    _, policy, sampler, check = _setup(FP32 + ["model.lora.target_modules=[embed_tokens,q_proj]"])
    assert check.modules == ("model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj")
    _adamw_first_step(policy)
    sync_sampler(sampler, policy)
    m = measure(check, sampler, policy)
    assert (m["sync/weights_read"], m["sync/weights_differ"]) == (2, 0)
    assert m["sync/logp_abs_diff_mean"] > check.tol
    with pytest.raises(ConfigError, match=r"model.lora.target_modules has embed_tokens, which this model ties to its "
                                          r"LM head: a merged sync would change the sampler's LM head as well"):
        check_mergeable(policy, sampler)  # so a run refuses it at start-up (exit 2)
    proc = run_cli(["train", *FP32, "model.lora.target_modules=[embed_tokens,q_proj]",
                    f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert "ties to its LM head" in one_error_line(proc, 2)


def test_a_read_back_that_fails_leaves_the_probe_and_says_so_once(fp32_hf, monkeypatch):
    _, policy, sampler, check = fp32_hf

    def internals_moved(names):
        raise AttributeError("'LRUCacheWorkerLoRAManager' object has no attribute '_adapter_manager'")

    monkeypatch.setattr(sampler, "read_served", internals_moved)
    said = []
    for _ in range(2):
        m = verify(check, sampler, policy, DataParallel(), "now", said.append)
        assert m["sync/weights_read"] == 0 and m["sync/weights_differ"] == 0
    assert len(said) == 1 and "the served weights of 14 of 14 synced modules cannot be read back (read-back " \
        "failed: AttributeError: 'LRUCacheWorkerLoRAManager'" in said[0] and "the probe alone checks them" in said[0]


def test_tolerance_by_dtype():
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    assert tolerance(None, [f32, f32]) == (TOL_FP32, "fp32")
    assert tolerance(None, [bf16, bf16]) == (TOL_LOW_PRECISION, "bf16")
    assert tolerance(None, [f32, bf16]) == (TOL_LOW_PRECISION, "bf16")  # an fp32 learner, a bf16 engine
    assert tolerance(None, [f16, f32]) == (TOL_LOW_PRECISION, "fp16")
    assert tolerance(0.5, [f32, f32]) == (0.5, "sampler.sync_check_tol")


def test_bf16_run_checks_against_the_bf16_tolerance():
    _, policy, sampler, check = _setup(TINY + ["model.dtype=bf16"])
    assert (check.tol, check.tol_source) == (TOL_LOW_PRECISION, "bf16")
    _update(policy)
    sync_sampler(sampler, policy)
    honest = measure(check, sampler, policy)
    assert 0 < honest["sync/logp_abs_diff_mean"] < TOL_LOW_PRECISION / 10


class _Ranks(DataParallel):
    """A DataParallel whose all_gather answers as if the other ranks had measured ``others``."""

    def __init__(self, others):
        super().__init__(0, 1 + len(others))
        object.__setattr__(self, "others", others)

    def all_gather(self, obj):
        return [obj, *self.others]


def test_ranks_agree_mean_of_means_and_max_of_maxima(fp32_hf):
    _, policy, sampler, check = fp32_hf
    sync_sampler(sampler, policy)
    # ((mean, max) of the probe, modules read, modules differing) of the other ranks
    m = measure(check, sampler, policy, _Ranks([((0.3, 0.9), 14, 0), ((0.0, 0.1), 13, 2)]))
    assert m["sync/logp_abs_diff_mean"] == pytest.approx(0.1, abs=1e-5)
    assert m["sync/logp_abs_diff_max"] == 0.9
    assert (m["sync/weights_read"], m["sync/weights_differ"]) == (13, 2)
    with pytest.raises(SyncError):  # this rank's sync was fine; another rank's was not: every rank stops
        verify(check, sampler, policy, _Ranks([((0.3, 0.9), 14, 0), ((0.0, 0.1), 14, 0)]), "now")
    with pytest.raises(SyncError, match="2 of 14 synced weights the sampler serves differ from the learner's: on "
                                        "another rank; the probe's log-probs differ by mean"):
        verify(check, sampler, policy, _Ranks([((0.0, 0.0), 14, 2)]), "now")


def test_nan_fails_the_check(fp32_hf):
    _, _, _, check = fp32_hf
    metrics = {"sync/logp_abs_diff_mean": float("inf"), "sync/logp_abs_diff_max": float("inf")}
    assert "mean inf" in mismatch(check, metrics, "now")


@pytest.mark.parametrize("bad, expected", [
    ("sampler.sync_check=maybe", "sampler.sync_check='maybe'; valid choices: error, warn, off"),
    ("sampler.sync_check_tol=-1", "sampler.sync_check_tol=-1.0 must be > 0, or null"),
    ("sampler.sync_check=off sampler.sync_check_tol=0.1",
     "sampler.sync_check_tol=0.1 does nothing with sampler.sync_check=off"),
    ("sampler.sync_check=off sampler.sync_probe_every=2",
     "sampler.sync_probe_every=2 does nothing with sampler.sync_check=off"),
    ("sampler.sync_probe_every=0", "sampler.sync_probe_every=0 must be >= 1"),
])
def test_config_errors(bad, expected):
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.").replace("(", r"\(")):
        compose(TINY + bad.split())


def _break_in_process(monkeypatch):
    monkeypatch.setattr(Policy, "sampler_weights", sync_break.skipping_weights(SKIP, Policy.sampler_weights))


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_training_logs_the_check_and_stops_on_a_broken_sync(tmp_path, monkeypatch):
    cfg, _, _ = compose(FP32 + ["trainer.eval_at_start=true"])
    train(cfg, tmp_path / "ok", "seed: 0\n")
    rows = _rows(tmp_path / "ok")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:  # step 0: the start-up check, beside the baseline evaluation
        assert r["sync/logp_abs_diff_max"] < 1e-5 and r["time/sync_check_s"] > 0
    assert rows[1]["time/step_s"] > rows[1]["time/sync_check_s"]

    _break_in_process(monkeypatch)
    cfg, _, _ = compose(FP32)
    with pytest.raises(SyncError, match=r"after the step 1 sync \(sampler=hf, sync=merged\)"):
        train(cfg, tmp_path / "broken", "seed: 0\n")


def test_warn_mode_goes_on_and_off_looks_at_nothing(tmp_path, monkeypatch, capsys):
    _break_in_process(monkeypatch)
    cfg, _, _ = compose(FP32 + ["sampler.sync_check=warn", "logger.console=true"])
    train(cfg, tmp_path / "warn", "seed: 0\n")
    rows = _rows(tmp_path / "warn")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["sync/logp_abs_diff_mean"] < TOL_FP32  # at start-up nothing was synced yet
    assert all(r["sync/logp_abs_diff_mean"] > TOL_FP32 for r in rows[1:])
    out = capsys.readouterr()
    assert (out.out + out.err).count("warning: weight sync check failed after the step") == 2

    cfg, _, _ = compose([o for o in FP32 if "sync_probe_every" not in o] + ["sampler.sync_check=off"])
    train(cfg, tmp_path / "off", "seed: 0\n")
    assert not any(k.startswith("sync/") or k == "time/sync_check_s" for r in _rows(tmp_path / "off") for k in r)


def test_a_sampler_loaded_with_other_weights_fails_at_start_up(tmp_path, monkeypatch):
    real = components_mod.build_sampler

    def other_weights(*args, **kwargs):
        sampler = real(*args, **kwargs)
        with torch.no_grad():
            sampler.model.get_parameter("model.layers.0.mlp.down_proj.weight").mul_(3)
        return sampler

    monkeypatch.setattr(components_mod, "build_sampler", other_weights)
    cfg, _, _ = compose(FP32)
    with pytest.raises(SyncError, match="failed at start-up"):
        train(cfg, tmp_path / "run", "seed: 0\n")


def test_cli_stops_in_one_line_on_a_broken_sync(tmp_path, monkeypatch):
    """Through the CLI: exit 1, one line with the mismatch, the tolerance and the sync mode."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(sync_break.SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(hook))
    monkeypatch.setenv(sync_break.BREAK_ENV, SKIP)
    proc = run_cli(["train", *FP32, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    line = one_error_line(proc, 1)
    assert "weight sync check failed after the step 1 sync (sampler=hf, sync=merged)" in line
    assert "mean " in line and ", max " in line and "(tolerance 0.001, fp32)" in line
    job = json.loads((tmp_path / "run" / "job.json").read_text())
    assert job["exit_code"] == 1 and job["status"] == "failed"


# vLLM (slow): the real engine, fp32, each sync mode broken its own way.

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
VLLM_FP32 = [o for o in FP32 if not o.startswith("sampler=")] + [
    "sampler=vllm", "sampler.vllm.kv_cache_gb=0.25", "sampler.vllm.max_model_len=256",
]


@pytest.fixture(scope="module", params=[("merged", "fp32"), ("adapter", "fp32"), ("merged", "bf16"),
                                        ("adapter", "bf16")], ids="-".join)
def vllm_engine(request):
    """One engine at a time (a second one in the process would share, then tear down, vLLM's globals)."""
    torch.manual_seed(0)
    mode, dtype = request.param
    setup = _setup(VLLM_FP32 + [f"sampler.vllm.sync={mode}", f"model.dtype={dtype}"])
    yield mode, dtype, setup
    del setup


@pytest.mark.slow
@needs_vllm
def test_vllm_sync_check(vllm_engine, monkeypatch):
    """Honest syncs pass; a sync broken at the default lr (merged: one projection never pushed; adapter: its
    files carry that projection's previous B) is caught by the served weights, where the probe stays inside
    its tolerance."""
    import rlft.samplers.vllm as vllm_mod

    mode, dtype, (_, policy, sampler, check) = vllm_engine
    assert check.where == f"sampler=vllm, sync={mode}"
    start = measure(check, sampler, policy)  # the engine's weights from the model directory
    _update(policy)
    sync_sampler(sampler, policy)
    honest = measure(check, sampler, policy)
    print(f"vLLM {mode} {dtype} honest: start {start}, after a sync {honest}")
    for m in (start, honest):
        assert m["sync/logp_abs_diff_mean"] < check.tol / 3
        assert m["sync/weights_read"] == len(check.modules) == 14 and m["sync/weights_differ"] == 0
    if dtype == "fp32":  # vLLM's and the learner's log-probs of the probe agree with a plain forward's
        by_hand = _by_hand(policy.model, check.probe.prompt, check.probe.completion)
        theirs = torch.tensor(sampler.score(check.probe.prompt, check.probe.completion))
        assert (theirs - by_hand).abs().mean() < TOL_FP32 / 3

    if mode == "merged":  # a push that delivers nothing
        monkeypatch.setattr(sampler, "load_weights", lambda weights: None)
        differ, pattern = 14, "14 of 14"
    else:
        monkeypatch.setattr(vllm_mod, "_whole_adapters", sync_break.previous_adapter_target(SKIP, policy.model))
        differ, pattern = 1, f"1 of 14 .*{SKIP}"
    _adamw_first_step(policy)
    sync_sampler(sampler, policy)
    with pytest.raises(SyncError, match=rf"after the step 2 sync \(sampler=vllm, sync={mode}\): {pattern}"):
        verify(check, sampler, policy, DataParallel(), "after the step 2 sync")
    broken = measure(check, sampler, policy)
    print(f"vLLM {mode} {dtype} broken at lr {DEFAULT_LR}: {broken}")
    assert broken["sync/weights_differ"] == differ
    assert broken["sync/logp_abs_diff_mean"] < check.tol, "the probe alone would have caught this"
    # A check without the probe (sampler.sync_probe_every > 1): the read-back alone, on the adapter the
    # engine serves after the sync (its first request loads it), catches the same.
    quiet = dataclasses.replace(check, probe_every=10**6)
    _adamw_first_step(policy)
    sync_sampler(sampler, policy)
    alone = measure(quiet, sampler, policy)
    assert "sync/logp_abs_diff_mean" not in alone and alone["sync/weights_differ"] == differ
    monkeypatch.undo()
    sync_sampler(sampler, policy)
    assert measure(check, sampler, policy)["sync/weights_differ"] == 0
    assert measure(quiet, sampler, policy)["sync/weights_differ"] == 0
    if mode == "merged":  # one projection never pushed (unsloth-zoo #941); vLLM then serves that half of
        _break_in_process(monkeypatch)  # gate_up_proj far off, so the probe sees it too
        _adamw_first_step(policy)
        sync_sampler(sampler, policy)
        with pytest.raises(SyncError, match=rf"1 of 14 synced weights the sampler serves differ .*{SKIP}"):
            verify(check, sampler, policy, DataParallel(), "after the step 3 sync")
        monkeypatch.undo()
        sync_sampler(sampler, policy)
        assert measure(check, sampler, policy)["sync/weights_differ"] == 0


@pytest.mark.slow
@needs_vllm
def test_an_fp32_engine_under_a_bf16_learner_compares_at_bf16(tmp_path):
    """The engine loads the model's fp32 files, the learner holds the same base rounded to bf16: the
    served weights are compared at bf16 (at fp32 the start-up check failed on all 14 honest modules)."""
    from tests.support import write_eos_model

    write_eos_model(tmp_path / "model")  # saved in fp32
    torch.manual_seed(0)
    _, policy, sampler, check = _setup(VLLM_FP32 + ["model=local", f"model.path={tmp_path / 'model'}",
                                                    "model.dtype=bf16", "sampler.vllm.dtype=fp32"])
    assert sampler.dtype == torch.float32 and check.compare == torch.bfloat16
    for _ in range(2):
        m = verify(check, sampler, policy, DataParallel(), "now")
        assert (m["sync/weights_read"], m["sync/weights_differ"]) == (14, 0)
        _adamw_first_step(policy)
        sync_sampler(sampler, policy)
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(sampler, "load_weights", lambda weights: None)
    _adamw_first_step(policy)
    sync_sampler(sampler, policy)
    monkeypatch.undo()
    assert measure(check, sampler, policy)["sync/weights_differ"] == 14


@pytest.mark.slow
@needs_vllm
def test_honest_vllm_training_passes_every_check(tmp_path):
    run = tmp_path / "run"
    proc = run_cli(["train", *VLLM_FP32, f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = _rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["sync/logp_abs_diff_mean"] < TOL_FP32 / 3 for r in rows), rows
