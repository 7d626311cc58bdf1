"""Sampler/learner mismatch corrections: hand values, a slow loop implementation, and the config checks."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.algorithms import ROLLOUT_CORRECTIONS
from rlft.config import compose
from rlft.config.schemas import AlgoConfig
from rlft.errors import ConfigError

# Two rows: row 0 has three tokens with log-ratios old - sampler = 0.5, -0.3, 1.2; row 1 two tokens
# with -2.0, 0.1 and one padding position (whose values must not matter).
DIFF = torch.tensor([[0.5, -0.3, 1.2], [-2.0, 0.1, 7.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
SAMPLER = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.2, -9.0]])
OLD = SAMPLER + DIFF


def _run(mode, low, high):
    return ROLLOUT_CORRECTIONS.get(mode)(OLD, SAMPLER, MASK, low, high)


def test_token_tis_hand_values():
    w, m = _run("token_tis", 0.0, 2.0)
    e = math.exp
    want = [[e(0.5), e(-0.3), 2.0], [e(-2.0), e(0.1), 0.0]]  # e^1.2 = 3.32 clamped to 2
    assert torch.allclose(w, torch.tensor(want), atol=1e-6)
    assert float(m["rollout/is_clipped_frac"]) == pytest.approx(1 / 5)
    assert float(m["rollout/is_weight_mean"]) == pytest.approx(sum(map(sum, want)) / 5, abs=1e-6)
    w, m = _run("token_tis", 0.5, 2.0)  # e^-2 = 0.135 is raised to 0.5
    assert float(w[1, 0]) == pytest.approx(0.5) and float(m["rollout/is_clipped_frac"]) == pytest.approx(2 / 5)


def test_seq_tis_hand_values():
    w, m = _run("seq_tis", 0.0, 2.0)
    # row 0: exp(0.5 - 0.3 + 1.2) = exp(1.4) = 4.06 -> 2; row 1: exp(-2 + 0.1) = 0.150 (padding's 7.0 ignored)
    want = [[2.0, 2.0, 2.0], [math.exp(-1.9), math.exp(-1.9), 0.0]]
    assert torch.allclose(w, torch.tensor(want), atol=1e-6)
    assert float(m["rollout/is_clipped_frac"]) == pytest.approx(3 / 5)  # the tokens of the clamped row
    assert float(m["rollout/is_weight_mean"]) == pytest.approx((6.0 + 2 * math.exp(-1.9)) / 5, abs=1e-6)


def test_token_mask_hand_values_icepop_band():
    w, m = _run("token_mask", 0.5, 2.0)
    e = math.exp
    # e^0.5 = 1.65 kept, e^-0.3 = 0.74 kept, e^1.2 = 3.32 dropped, e^-2 = 0.135 dropped, e^0.1 kept
    want = [[e(0.5), e(-0.3), 0.0], [0.0, e(0.1), 0.0]]
    assert torch.allclose(w, torch.tensor(want), atol=1e-6)
    assert float(m["rollout/is_masked_frac"]) == pytest.approx(2 / 5)
    assert "rollout/is_clipped_frac" not in m


def test_seq_mask_hand_values_product_not_geometric_mean():
    w, m = _run("seq_mask", 0.2, 3.0)
    # row 0's product exp(1.4) = 4.06 > 3 is dropped (its geometric mean exp(1.4/3) = 1.6 would be kept);
    # row 1's exp(-1.9) = 0.150 < 0.2 is dropped too
    assert torch.equal(w, torch.zeros_like(w))
    assert float(m["rollout/is_masked_frac"]) == pytest.approx(1.0)
    w, m = _run("seq_mask", 0.1, 5.0)  # both inside: each row keeps its ratio as the weight (TRL)
    want = [[math.exp(1.4)] * 3, [math.exp(-1.9)] * 2 + [0.0]]
    assert torch.allclose(w, torch.tensor(want), atol=1e-5)
    assert float(m["rollout/is_masked_frac"]) == 0.0
    _, m = _run("seq_mask", 0.1, 3.0)  # only row 0 (3 of the 5 loss tokens) dropped
    assert float(m["rollout/is_masked_frac"]) == pytest.approx(3 / 5)


def test_a_sampler_minus_infinity_gives_finite_weights():
    sampler = SAMPLER.clone()
    sampler[0, 1] = float("-inf")
    for mode in ROLLOUT_CORRECTIONS.names():
        w, m = ROLLOUT_CORRECTIONS.get(mode)(OLD, sampler, MASK, 0.5, 2.0)
        assert torch.isfinite(w).all() and all(math.isfinite(float(v)) for v in m.values()), mode


def _slow(mode, old, sampler, mask, low, high):
    """Loops over rows and tokens with math.exp; the sequence ratio is the product of the token ratios."""
    rows, cols = old.shape
    w = [[0.0] * cols for _ in range(rows)]
    hit, count = 0.0, 0.0
    for i in range(rows):
        toks = [t for t in range(cols) if mask[i, t] > 0]
        seq = math.exp(max(-20.0, min(20.0, sum(float(old[i, t] - sampler[i, t]) for t in toks))))
        for t in toks:
            r = seq if mode.startswith("seq") else math.exp(max(-20.0, min(20.0, float(old[i, t] - sampler[i, t]))))
            out = r < low or r > high
            if mode.endswith("tis"):
                w[i][t] = min(max(r, low), high)
            else:
                w[i][t] = 0.0 if out else r
            hit += out
            count += 1
    mean = sum(map(sum, w)) / max(count, 1)
    return torch.tensor(w, dtype=torch.float64), hit / max(count, 1), mean


@pytest.mark.parametrize("mode", ["token_tis", "seq_tis", "token_mask", "seq_mask"])
@pytest.mark.parametrize("seed", [0, 2, 6])
def test_corrections_match_a_slow_loop(mode, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (7, 9)
    sampler = -torch.rand(shape, generator=g, dtype=torch.float64) * 5
    old = sampler + torch.randn(shape, generator=g, dtype=torch.float64) * 0.6
    lengths = torch.randint(0, 10, (7,), generator=g)
    mask = (torch.arange(9)[None, :] < lengths[:, None]).double()
    low, high = (0.0, 2.0) if mode.endswith("tis") and seed == 0 else (0.6, 1.8)
    w, m = ROLLOUT_CORRECTIONS.get(mode)(old, sampler, mask, low, high)
    want_w, want_frac, want_mean = _slow(mode, old, sampler, mask, low, high)
    assert 0 < want_frac < 1  # some weights inside the band and some outside
    assert torch.allclose(w, want_w, atol=1e-9, rtol=1e-9)
    frac = m["rollout/is_clipped_frac" if mode.endswith("tis") else "rollout/is_masked_frac"]
    assert float(frac) == pytest.approx(want_frac, abs=1e-12)
    assert float(m["rollout/is_weight_mean"]) == pytest.approx(want_mean, abs=1e-9)
    assert not w.requires_grad


def test_tis_cap_is_token_tis_with_its_cap():
    assert AlgoConfig(tis_cap=3.0).correction == ("token_tis", 0.0, 3.0)
    assert AlgoConfig(rollout_correction="seq_mask", rollout_is_low=0.5).correction == ("seq_mask", 0.5, 2.0)
    assert AlgoConfig().correction[0] == "none"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["algo.rollout_correction=seq_tiss"],
         "algo.rollout_correction='seq_tiss'; valid choices: none, seq_mask, seq_tis, token_mask, token_tis"),
        (["algo.rollout_correction=seq_mask", "algo.tis_cap=2"], "algo.tis_cap=2.0 is the shorthand for"),
        (["algo.rollout_is_low=2", "algo.rollout_is_high=1"], "must satisfy 0 <= low < high"),
        (["algo.rollout_is_low=-0.1"], "algo.rollout_is_low=-0.1 must be >= 0"),
        (["algo.entropy_coef=-0.01"], "algo.entropy_coef=-0.01 must be >= 0"),
        (["sampler=hf", "algo.rollout_correction=seq_mask"],
         "algo.rollout_correction=seq_mask corrects the sampler's log-probs, which only sampler=vllm reports "
         "(this run samples with hf); set algo.rollout_correction=none or sampler=vllm"),
        (["sampler=hf", "algo.rollout_correction=token_mask"], "only sampler=vllm reports"),
        (["sampler=vllm", "algo.rollout_correction=seq_tis", "sampler.top_p=0.9"],
         "algo.rollout_correction=seq_tis needs untruncated sampling"),
        (["sampler=vllm", "algo.rollout_correction=token_mask", "sampler.top_k=20"],
         "or algo.rollout_correction=none"),
    ],
)
def test_correction_options_are_checked(overrides, expected):
    from rlft.config.validation import vllm_available

    if "sampler=vllm" in overrides and not vllm_available():
        pytest.skip("vLLM is not installed")
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_corrections_compose_with_vllm_and_untruncated_sampling():
    from rlft.config.validation import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed")
    for mode in ["none", *ROLLOUT_CORRECTIONS.names()]:
        cfg, _, _ = compose(["sampler=vllm", f"algo.rollout_correction={mode}", "algo.rollout_is_low=0.5"])
        assert cfg.algo.correction == (mode, 0.5, 2.0)
