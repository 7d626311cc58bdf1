"""Sampler/learner mismatch corrections: hand values, a slow loop implementation, and the config checks."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.algorithms import ROLLOUT_CORRECTIONS
from rlft.config import compose
from rlft.config.schemas.algo import AlgoConfig
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


def test_seq_geo_tis_hand_values():
    w, m = _run("seq_geo_tis", 0.5, 2.0)
    # row 0: exp((0.5 - 0.3 + 1.2) / 3) = exp(0.4667) = 1.595 kept; row 1: exp((-2 + 0.1) / 2) = 0.387 -> 0.5
    g0 = math.exp(1.4 / 3)
    want = [[g0] * 3, [0.5, 0.5, 0.0]]
    assert torch.allclose(w, torch.tensor(want), atol=1e-6)
    assert float(m["rollout/is_clipped_frac"]) == pytest.approx(2 / 5)
    assert float(m["rollout/is_weight_mean"]) == pytest.approx((3 * g0 + 1.0) / 5, abs=1e-6)


def test_seq_geo_mask_hand_values_geometric_mean_not_product():
    e = math.exp
    w, m = _run("seq_geo_mask", 0.2, 3.0)
    # The band seq_mask drops both rows with (products 4.06 and 0.150) keeps both on their geometric means
    # (1.595 and 0.387); the kept tokens carry token_tis's weight: e^1.2 = 3.32 -> 3, e^-2 = 0.135 -> 0.2.
    want = [[e(0.5), e(-0.3), 3.0], [0.2, e(0.1), 0.0]]
    assert torch.allclose(w, torch.tensor(want), atol=1e-6)
    assert float(m["rollout/is_masked_frac"]) == 0.0
    assert float(m["rollout/is_clipped_frac"]) == pytest.approx(2 / 5)
    assert float(m["rollout/is_weight_mean"]) == pytest.approx(sum(map(sum, want)) / 5, abs=1e-6)
    w, m = _run("seq_geo_mask", 0.5, 2.0)  # row 1's 0.387 < 0.5: dropped; row 0's e^1.2 clamped to 2
    want = [[e(0.5), e(-0.3), 2.0], [0.0, 0.0, 0.0]]
    assert torch.allclose(w, torch.tensor(want), atol=1e-6)
    assert float(m["rollout/is_masked_frac"]) == pytest.approx(2 / 5)
    assert float(m["rollout/is_clipped_frac"]) == pytest.approx(1 / 5)  # a dropped token is not also clipped


def test_the_product_band_punishes_length_and_the_geometric_mean_does_not():
    """Per-token log-ratio noise N(0, 0.05^2), the bf16 level the sync check measures: the band [0, 2] on the
    product drops P(Z > ln 2 / (0.05 sqrt T)) of the sequences, 0.026% at 16 tokens and 27.0% at 512 (measured
    here: 0.020% and 27.2%); the band [0.5, 2] on the geometric mean drops none at either length. A band tight
    enough to drop some geometric means, [0.98, 1.02], drops fewer at 512 tokens than at 16 (0 against 10.8%)."""
    g = torch.Generator().manual_seed(0)

    def dropped(mode, tokens, rows, low, high):
        diff = torch.randn(rows, tokens, generator=g) * 0.05
        zero, ones = torch.zeros(rows, tokens), torch.ones(rows, tokens)
        _, m = ROLLOUT_CORRECTIONS.get(mode)(diff, zero, ones, low, high)
        return float(m["rollout/is_masked_frac"])  # every row has the same length: the share of sequences

    assert 0 < dropped("seq_mask", 16, 30_000, 0.0, 2.0) < 0.001
    assert dropped("seq_mask", 512, 2_000, 0.0, 2.0) == pytest.approx(0.27, abs=0.03)
    # [0.5, 2] drops every sequence [0, 2] drops, and more
    assert dropped("seq_geo_mask", 16, 30_000, 0.5, 2.0) == dropped("seq_geo_mask", 512, 2_000, 0.5, 2.0) == 0.0
    tight_short, tight_long = (dropped("seq_geo_mask", n, 500, 0.98, 1.02) for n in (16, 512))
    assert tight_long <= tight_short and tight_short > 0.05


def test_a_sampler_minus_infinity_gives_finite_weights():
    sampler = SAMPLER.clone()
    sampler[0, 1] = float("-inf")
    for mode in ROLLOUT_CORRECTIONS.names():
        w, m = ROLLOUT_CORRECTIONS.get(mode)(OLD, sampler, MASK, 0.5, 2.0)
        assert torch.isfinite(w).all() and all(math.isfinite(float(v)) for v in m.values()), mode


def _slow(mode, old, sampler, mask, low, high):
    """Loops over rows and tokens with math.exp; the sequence ratio is the product of the token ratios
    (``seq_*``) or their geometric mean (``seq_geo_*``). Returns the weights, the share of loss tokens
    clipped (``*_tis``) or dropped (``*_mask``), the mean weight, and for ``seq_geo_mask`` the share of
    kept tokens whose token ratio was clamped."""
    rows, cols = old.shape
    w = [[0.0] * cols for _ in range(rows)]
    hit, count, clipped = 0.0, 0.0, 0.0
    for i in range(rows):
        toks = [t for t in range(cols) if mask[i, t] > 0]
        logs = [float(old[i, t] - sampler[i, t]) for t in toks]
        total = sum(logs) / len(logs) if mode.startswith("seq_geo") and logs else sum(logs)
        seq = math.exp(max(-20.0, min(20.0, total)))
        for t, d in zip(toks, logs):
            tok = math.exp(max(-20.0, min(20.0, d)))
            r = seq if mode.startswith("seq") else tok
            out = r < low or r > high
            if mode == "seq_geo_mask":
                w[i][t] = 0.0 if out else min(max(tok, low), high)
                clipped += not out and (tok < low or tok > high)
            elif mode.endswith("tis"):
                w[i][t] = min(max(r, low), high)
            else:
                w[i][t] = 0.0 if out else r
            hit += out
            count += 1
    mean = sum(map(sum, w)) / max(count, 1)
    return torch.tensor(w, dtype=torch.float64), hit / max(count, 1), mean, clipped / max(count, 1)


@pytest.mark.parametrize("mode", ["token_tis", "seq_tis", "token_mask", "seq_mask", "seq_geo_tis", "seq_geo_mask"])
@pytest.mark.parametrize("seed", [0, 2, 6])
def test_corrections_match_a_slow_loop(mode, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (7, 9)
    sampler = -torch.rand(shape, generator=g, dtype=torch.float64) * 5
    old = sampler + torch.randn(shape, generator=g, dtype=torch.float64) * 0.6
    lengths = torch.randint(0, 10, (7,), generator=g)
    mask = (torch.arange(9)[None, :] < lengths[:, None]).double()
    low, high = (0.0, 2.0) if mode in ("token_tis", "seq_tis") and seed == 0 else (0.6, 1.8)
    if mode.startswith("seq_geo"):  # a geometric mean of up to 9 ratios lies closer to 1
        low, high = 0.8, 1.2
    w, m = ROLLOUT_CORRECTIONS.get(mode)(old, sampler, mask, low, high)
    want_w, want_frac, want_mean, want_clipped = _slow(mode, old, sampler, mask, low, high)
    assert 0 < want_frac < 1  # some weights inside the band and some outside
    assert torch.allclose(w, want_w, atol=1e-9, rtol=1e-9)
    frac = m["rollout/is_clipped_frac" if mode.endswith("tis") else "rollout/is_masked_frac"]
    assert float(frac) == pytest.approx(want_frac, abs=1e-12)
    assert float(m["rollout/is_weight_mean"]) == pytest.approx(want_mean, abs=1e-9)
    if mode == "seq_geo_mask":
        assert float(m["rollout/is_clipped_frac"]) == pytest.approx(want_clipped, abs=1e-12)
    assert not w.requires_grad


def test_tis_cap_is_token_tis_with_its_cap():
    assert AlgoConfig(tis_cap=3.0).correction == ("token_tis", 0.0, 3.0)
    assert AlgoConfig(rollout_correction="seq_mask", rollout_is_low=0.5).correction == ("seq_mask", 0.5, 2.0)
    assert AlgoConfig().correction[0] == "none"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["algo.rollout_correction=seq_tiss"],
         "algo.rollout_correction='seq_tiss'; valid choices: none, seq_geo_mask, seq_geo_tis, seq_mask, seq_tis, "
         "token_mask, token_tis"),
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


def test_a_dropped_sequence_stays_in_the_loss_denominator():
    """rlft keeps a dropped token in the aggregation's denominator (TRL, OpenRLHF): update_policy takes the
    mini-batch totals from the response mask (_RowFacts) before any forward pass, and the correction only
    weights the per-token loss (test_learner checks that _policy_loss multiplies by the weight). verl's
    rejection would divide by the kept tokens (token-mean) or the kept sequences instead."""
    from rlft.algorithms import LOSS_AGGREGATIONS, LossNorm
    from rlft.training.batch import RolloutBatch, pack
    from rlft.training.learner import _RowFacts

    ids, start, length, mask = pack([[7, 8], [9], [10, 11], [12]], [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]], pad_id=0)
    batch = RolloutBatch(ids, start, length, mask, torch.tensor([0, 0, 1, 1]), torch.zeros(4), torch.zeros(4).bool())
    g = torch.Generator().manual_seed(3)
    batch.advantages = (torch.randn(4, generator=g)[:, None] + 2.0) * mask
    batch.old_logp = -torch.rand(mask.shape, generator=g) * mask
    shift = torch.tensor([0.0, 1.0, 0.3, -0.1])[:, None]  # old - sampler per row: row 1's mean e^1 > 2 is dropped
    batch.sampler_logp = (batch.old_logp - shift) * mask
    weight, m = ROLLOUT_CORRECTIONS.get("seq_geo_mask")(batch.old_logp, batch.sampler_logp, mask, 0.5, 2.0)
    per_token = -batch.advantages * weight  # the clipped loss at the rollout policy (ratio 1), weighted
    norm = LossNorm(float(batch.size), _RowFacts.of(batch).tokens(list(range(batch.size))), 4.0)
    kept = torch.tensor([1.0, 0.0, 1.0, 1.0])[:, None] * mask
    assert torch.equal(batch.response_mask, mask) and torch.equal(weight == 0, kept == 0)
    assert norm.num_tokens == float(mask.sum()) == 10.0 and float(kept.sum()) == 8.0
    kept_sum = float((per_token * kept).sum())
    loss = float(LOSS_AGGREGATIONS.get("token-mean")(per_token, mask, norm))
    assert loss == pytest.approx(kept_sum / 10.0, abs=1e-6) and loss != pytest.approx(kept_sum / 8.0, abs=1e-3)
    row_means = (per_token * kept).sum(1) / mask.sum(1)
    loss = float(LOSS_AGGREGATIONS.get("seq-mean-token-mean")(per_token, mask, norm))
    assert loss == pytest.approx(float(row_means.sum()) / 4, abs=1e-6)  # the dropped row counts as a 0 of 4
    assert float(m["rollout/is_masked_frac"]) == pytest.approx(2 / 10)
