"""The sync check's weight comparison: the weights a sampler serves against the learner's, rounded alike.

The probe's log-probs (rlft/sync/verify.py) see a missed update only as far as it moves them, which at a
default learning rate stays under the rounding of bf16 for many steps (issue 35: a no-op sync moved the
probe by 7.3e-4 after one step, 2.6e-2 after 50, against a bf16 tolerance of 0.25). Here the sampler reads
back what it serves (rlft/samplers/readback.py) and each element must equal what the learner would have
it serve:

- merged weights (``sync=merged``, the hf sampler, full fine-tuning): four input columns of every synced
  linear weight, ``base + (B @ A) * scaling`` computed by the learner in fp32; a served element must be
  that value rounded to the coarser of the sampler's dtype and the learner's base dtype (within half a
  step of it, +16 fp32 steps, + the rounding of ``B @ A``: the learner sums it over a slice, the sampler
  over the whole weight, in another order, each off by up to ``r`` fp32 steps of ``|B| @ |A| * scaling``;
  where base and delta nearly cancel, as in one element of 7,168 after one fp32 update of the tiny test
  model, that is 128 steps of the value). The coarser one,
  because an fp32 engine starts from the model's fp32 files while a bf16 learner holds the same base
  rounded to bf16;
- an adapter (``sync=adapter``): every element of A and of B * scaling, cast to the engine's dtype as
  vLLM casts them, exactly.

Compared: the LoRA layers on linear modules (under full fine-tuning every linear layer but the LM head).
LoRA on embeddings and GPT-2-style Conv1D layers (``fan_in_fan_out``), biases, norms and the LM head are
left to the probe. One update at lr 2e-4 moves 20-65% of a layer's bf16 elements by a rounding step
(tests/test_sync_check.py), so a sync that delivers nothing, a part, or an earlier step's weights differs
in hundreds of read elements at the first check after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from rlft.models.policy import base_name
from rlft.parallel.fsdp import full, full_columns
from rlft.samplers.readback import column_index

if TYPE_CHECKING:
    from rlft.models import Policy

MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}
FP32_MIN_EXPONENT = -125  # frexp's exponent of the smallest normal fp32 value


class Merged(NamedTuple):
    """What a sampler should serve of a merged weight's read columns (N, 4) fp32, and by how much more than the
    rounding to the compared dtype it may differ (the rounding of the sum the learner and the sampler each
    compute in fp32), same shape."""

    columns: Tensor
    slack: Tensor


def synced_modules(policy: Policy) -> dict[str, Any]:
    """The modules whose served weights are compared, by base-model name: the LoRA layers on linear
    modules under LoRA, else every linear layer but the LM head."""
    if policy.lora:
        from peft.tuners.lora import LoraLayer  # peft imports transformers (seconds): only with a model

        return {base_name(n): m for n, m in policy.model.named_modules()
                if isinstance(m, LoraLayer) and isinstance(m.get_base_layer(), torch.nn.Linear)
                and "default" in m.lora_A and not getattr(m, "fan_in_fan_out", False)}
    return {n: m for n, m in policy.model.named_modules()
            if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")}


def compare_dtype(policy: Policy, modules: dict[str, Any], sampler_dtype: torch.dtype) -> torch.dtype:
    """The coarser of the sampler's dtype and the dtype the learner holds the synced ``modules`` in."""
    held = next((m.get_base_layer() if policy.lora else m for m in modules.values()), None)
    dtypes = [sampler_dtype] + ([held.weight.dtype] if held is not None else [])
    return min(dtypes, key=lambda d: MANTISSA_BITS.get(d, 23))


def expected(policy: Policy, names: tuple[str, ...], dtype: torch.dtype, adapter: bool,
             cache: dict[str, Any] | None = None) -> dict[str, tuple[Tensor, ...]]:
    """What the sampler should serve of the named synced modules, in the form its read-back takes:
    :class:`Merged`, or under ``adapter`` ``(A, B * scaling)`` in ``dtype``. Under FSDP2
    every rank calls this in the same order (it gathers). ``cache`` (one per run) keeps the module lookup
    and, under LoRA, the frozen base's columns from one check to the next."""
    cache = {} if cache is None else cache
    if "modules" not in cache:
        cache["modules"] = synced_modules(policy)
    modules, bases = cache["modules"], cache.setdefault("base_columns", {})
    out: dict[str, tuple[Tensor, ...]] = {}
    with torch.no_grad():
        for name in names:
            module = modules[name]
            if adapter:
                a, b = full(module.lora_A["default"].weight), full(module.lora_B["default"].weight)
                out[name] = (a.to(dtype).cpu(), (b.to(dtype) * module.scaling["default"]).cpu())
                continue
            if not policy.lora:
                cols = column_index(module.weight.shape[1])
                value = full_columns(module.weight, cols).float().cpu()
                out[name] = Merged(value, torch.zeros_like(value))  # a copy: only the dtype's rounding
                continue
            base = module.get_base_layer()
            cols = column_index(base.weight.shape[1])
            if name not in bases:  # the base is frozen under LoRA: its columns once per run
                bases[name] = full_columns(base.weight, cols).float()
            a, b = full_columns(module.lora_A["default"].weight, cols).float(), full(module.lora_B["default"].weight).float()
            scaling = module.scaling["default"]
            value = bases[name] + b @ a * scaling
            # each side's B @ A is off by up to r fp32 steps of |B| @ |A| (the base adds exactly, or within 16 steps)
            out[name] = Merged(value.cpu(), (b.abs() @ a.abs() * abs(scaling) * 2 * a.shape[0] * 2.0 ** -24).cpu())
    return out


def differing(want: dict[str, tuple[Tensor, ...]], served: dict[str, tuple[Tensor, ...]],
              dtype: torch.dtype) -> dict[str, tuple[int, int]]:
    """Per module read back, (elements that differ, elements read), merged weights compared in ``dtype``;
    a module whose read-back has another shape differs in all of them. Modules the sampler could not
    read are left out."""
    out: dict[str, tuple[int, int]] = {}
    merged = [n for n, mine in want.items() if n in served and isinstance(mine, Merged)]
    same_shape = [n for n in merged if served[n][0].shape == want[n][0].shape]
    out.update({n: (want[n][0].numel(), want[n][0].numel()) for n in merged if n not in same_shape})
    if same_shape:  # one pass over all modules' elements: ~200 small modules a check
        mine = torch.cat([want[n][0].flatten() for n in same_shape])
        theirs = torch.cat([served[n][0].flatten().float() for n in same_shape])
        slack = torch.cat([want[n].slack.flatten() for n in same_shape])
        sizes = [want[n][0].numel() for n in same_shape]
        bad = _rounding_mismatch(mine, theirs, dtype, slack)
        out.update({n: (int(c), size) for n, c, size in zip(same_shape, torch.stack(
            [part.sum() for part in bad.split(sizes)]).tolist(), sizes)})
    for name, mine_ab in want.items():
        if name in served and not isinstance(mine_ab, Merged):
            pairs = [_exact_mismatch(m, t) for m, t in zip(mine_ab, served[name], strict=True)]
            out[name] = (sum(p[0] for p in pairs), sum(p[1] for p in pairs))
    return out


def _rounding_mismatch(want: Tensor, served: Tensor, dtype: torch.dtype, slack: Tensor | None = None) -> Tensor:
    """Where ``served`` is not ``want`` (fp32) rounded to ``dtype``, give or take ``slack`` (a bool tensor of want's
    shape)."""
    _, exponent = torch.frexp(want)  # |want| = m * 2^exponent, m in [0.5, 1); frexp(0) gives 0
    exponent = torch.where(want == 0, FP32_MIN_EXPONENT, exponent)  # 0 rounds to 0 in any dtype
    # half a step of dtype plus 16 fp32 steps: 2^(e - 1 - p) / 2 + 16 * 2^(e - 24)
    tol = torch.ldexp(torch.full_like(want, 0.5 + 16 * 2.0 ** (MANTISSA_BITS.get(dtype, 23) - 23)),
                      exponent - 1 - MANTISSA_BITS.get(dtype, 23))
    return (served.float() - want).abs() > tol + (0 if slack is None else slack)


def _exact_mismatch(want: Tensor, served: Tensor) -> tuple[int, int]:
    """Elements that differ; vLLM pads an adapter's rank to its max_lora_rank with zeros."""
    r_rows, r_cols = want.shape
    if served.shape[0] < r_rows or served.shape[1] < r_cols:
        return want.numel(), want.numel()
    return int((served[:r_rows, :r_cols].to(want.dtype) != want).sum()), want.numel()
