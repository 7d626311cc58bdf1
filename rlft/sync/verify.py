"""The sync check: after each weight sync the sampler must score a fixed probe as the learner does.

A weight sync that silently does nothing trains on stale rollouts without any error: verl's LoRA
never reached vLLM in async mode (verl #7495), unsloth-zoo loaded every layer but ``up_proj``
(unsloth-zoo #941); their users found out weeks later from flat reward curves. Here, wherever the
sampler's weights are set (start-up, resume, each step's sync, ``rlft eval``), the sampler scores one
short probe sequence (:meth:`rlft.samplers.base.Sampler.score`, its own weights and kernels) and
the learner scores the same tokens; their log-probs must agree within a tolerance set by the
dtypes. That tolerance hides a small missed update (at the default lr a step moves the probe less than
bf16 rounds it), so the sampler also reads back the weights it serves and every element must be the
learner's, rounded alike (rlft/sync/served_weights.py). Costs: scripts/bench_sync_check.py
(docs/reference/internals/sync.md).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from rlft.config.schemas.sampler import SamplerConfig
from rlft.config.validation import resolve_sampler_name
from rlft.data.chat import problem_ids
from rlft.errors import ConfigError, SyncError
from rlft.parallel.distributed import SINGLE, DataParallel
from rlft.sync.served_weights import compare_dtype, differing, expected, synced_modules
from rlft.training.batch import RolloutBatch, pack
from rlft.training.logprobs import token_logprobs

if TYPE_CHECKING:
    from rlft.config.schemas import Config
    from rlft.data import Task
    from rlft.models import Policy
    from rlft.samplers import Sampler

# The probe's completion: a fixed sentence of ~14 tokens, scored after the tail of a real prompt, so the
# chat template's special tokens and ordinary text both pass through every layer and every adapter.
PROBE_TEXT = " The quick brown fox jumps over the lazy dog near the river bank."
PROMPT_TAIL = 16
"""Tokens of the first training prompt kept before the probe sentence."""

# Honest mismatches measured (docs/reference/internals/sync.md): fp32 tiny model hf <= 4e-7, vLLM
# adapter <= 5e-7, vLLM merged < 3.3e-4 (max); bf16 SmolLM2-135M mean 0.03-0.053 (hf and vLLM merged).
TOL_FP32 = 1e-3
TOL_LOW_PRECISION = 0.25

METRICS = ("sync/logp_abs_diff_mean", "sync/logp_abs_diff_max", "sync/weights_read", "sync/weights_differ",
           "time/sync_check_s")


@dataclass(frozen=True)
class Probe:
    """Token ids scored on both sides: log-probs of ``completion`` given ``prompt``."""

    prompt: list[int]
    completion: list[int]


@dataclass(frozen=True)
class SyncCheck:
    """What a run checks after each sync, and what it does on a mismatch."""

    probe: Probe
    mode: str
    """sampler.sync_check: error, warn or off."""
    tol: float
    """Largest mean |log-prob difference| that passes."""
    tol_source: str
    """Where ``tol`` comes from, for the message: the dtype, or sampler.sync_check_tol."""
    where: str
    """The sampler and its sync mode, e.g. 'sampler=vllm, sync=adapter'."""
    modules: tuple[str, ...] = ()
    """The synced modules whose served weights are read back and compared (rlft/sync/served_weights.py)."""
    compare: torch.dtype = torch.float32
    """The dtype merged weights are compared in: the coarser of the sampler's and the learner's."""
    synced: int = 0
    """Modules a full read-back would compare (``modules`` is empty where the sampler cannot read)."""
    notes: dict[str, str] = field(default_factory=dict)
    """What the run keeps to say once: the first read-back failure ("read_error"), and that it was said."""
    cache: dict = field(default_factory=dict)
    """The learner side's lookups kept between checks (rlft/sync/served_weights.py: expected), the checks run so
    far ("checks") and whether a read-back failed ("probe_always")."""
    covered: bool = False
    """Whether the read-back covers every weight the learner trains (then the probe may skip checks)."""
    probe_every: int = 1
    """sampler.sync_probe_every: under ``covered``, the probe runs at the first check and every N-th after."""


def make_probe(tokenizer: Any, first_prompt: list[int]) -> Probe:
    completion = list(tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
    # Something must precede the first scored token (an empty raw-text prompt has no token at all).
    return Probe(list(first_prompt[-PROMPT_TAIL:]) or [tokenizer.eos_token_id], completion)


def tolerance(tol: float | None, dtypes: list[torch.dtype]) -> tuple[float, str]:
    """``tol`` when set, else by dtype: bf16 and fp16 round each logit to 2^-8 relative, fp32 to 2^-24."""
    if tol is not None:
        return tol, "sampler.sync_check_tol"
    if all(d == torch.float32 for d in dtypes):
        return TOL_FP32, "fp32"
    low = next(d for d in dtypes if d != torch.float32)
    return TOL_LOW_PRECISION, str(low).removeprefix("torch.").replace("bfloat16", "bf16").replace("float16", "fp16")


def sync_mode(sampler: Sampler, policy: Policy) -> str:
    """How the policy reaches the sampler: its adapter, the adapter merged into the base, or all weights."""
    if sampler.serves_adapter:
        return "adapter"
    return "merged" if policy.lora else "full weights"


def build_check(cfg: Config, policy: Policy, sampler: Sampler, task: Task) -> SyncCheck:
    """The run's check: the probe after the first training prompt, the tolerance for the learner's and
    the sampler's dtypes."""
    first = task.batch(0, 1)[0]
    probe = make_probe(policy.tokenizer, problem_ids(policy.tokenizer, first, cfg.data))
    tol, source = tolerance(cfg.sampler.sync_check_tol, [policy.compute_dtype, sampler.dtype])
    where = f"sampler={resolve_sampler_name(cfg.sampler.name)}, sync={sync_mode(sampler, policy)}"
    # Under tensor parallelism each vLLM worker holds a slice of every layer: nothing to read back whole.
    readable = getattr(sampler, "tensor_parallel", 1) == 1
    synced = synced_modules(policy)
    covered = readable and covers_training(policy, synced)
    every = cfg.sampler.sync_probe_every
    # (the default and 1 say nothing a setup without the cover contradicts; another value would do nothing)
    if not covered and every not in (1, SamplerConfig.sync_probe_every) and cfg.sampler.sync_check != "off":
        raise ConfigError(f"sampler.sync_probe_every={every} does nothing here: the read-back does not cover every "
                          f"weight the learner trains ({where}{'' if readable else ', tensor parallel'}, "
                          f"{'LoRA on ' + ', '.join(cfg.model.lora.target_modules) if policy.lora else 'full fine-tuning'}), "
                          "so the probe runs at every check; drop it")
    return SyncCheck(probe, cfg.sampler.sync_check, tol, source, where, tuple(synced) if readable else (),
                     compare_dtype(policy, synced, sampler.dtype), len(synced), cache={"modules": synced},
                     covered=covered, probe_every=every)


def covers_training(policy: Policy, synced: dict[str, Any]) -> bool:
    """Whether every weight the learner trains is one the read-back compares: the LoRA A and B of linear
    layers (not full fine-tuning's norms, embeddings and LM head, nor LoRA on an embedding)."""
    if not policy.lora:
        return False
    read = {id(p) for m in synced.values() for p in (m.lora_A["default"].weight, m.lora_B["default"].weight)}
    return all(id(p) in read for p in policy.trainable_parameters())


def learner_logprobs(policy: Policy, probe: Probe) -> Tensor:
    """The probe's completion log-probs under the policy (eval mode, no gradient, temperature 1), by the
    learner's own log-prob code. Returns (T,) fp32 on the CPU."""
    ids, start, length, mask = pack([probe.prompt], [probe.completion], 0)
    n = len(probe.completion)
    batch = RolloutBatch(ids, start, length, mask, torch.zeros(1), torch.zeros(1),
                         torch.zeros(1, dtype=torch.bool)).to(policy.device)
    training = policy.model.training
    policy.model.eval()  # no dropout: the sampler has none
    try:
        with torch.no_grad(), policy.autocast():
            # One row: a whole-row forward is one decoder call, not the prompt pass and the completion
            # pass (SmolLM2, 30 tokens: 0.19 s -> 0.12 s); equal values (tests/test_learner.py).
            logp, _ = token_logprobs(policy.model, batch, 1.0, whole_rows=True)
    finally:
        policy.model.train(training)
    return logp[0, :n].float().cpu()


def measure(check: SyncCheck, sampler: Sampler, policy: Policy, dp: DataParallel = SINGLE) -> dict[str, float]:
    """The check's metrics: mean and max |learner - sampler| log-prob over the probe (over ranks: the
    mean of the ranks' means, the max of their maxima, so every rank decides alike), the synced modules
    whose served weights were read and how many of them differ from the learner's (over ranks: the
    fewest read, the most differing), and its time."""
    return _measure(check, sampler, policy, dp)[0]


def _measure(check: SyncCheck, sampler: Sampler, policy: Policy, dp: DataParallel) -> tuple[dict[str, float], str]:
    """:func:`measure`'s metrics and the differing modules on this rank, for the message."""
    t0 = time.perf_counter()
    probe = _probe_due(check)
    with one_cpu_thread(policy.device):
        diff, counts = _both_sides(check, sampler, policy, dp) if probe else (None, _read_back(check, sampler, policy))
        bad = {name: c for name, c in counts.items() if c[0] > 0}
        ranks = dp.all_gather((_stats(diff), len(counts), len(bad)))
        if not probe and min(r[1] for r in ranks) < check.synced:
            # A read-back failed on some rank: the probe checks now and at every check from here on.
            check.cache["probe_always"] = True
            diff = _probe_diff(learner_logprobs(policy, check.probe), sampler.score(*_tokens(check)))
            ranks = dp.all_gather((_stats(diff), len(counts), len(bad)))
    metrics = {
        "sync/weights_read": float(min(r[1] for r in ranks)),
        "sync/weights_differ": float(max(r[2] for r in ranks)),
        "time/sync_check_s": time.perf_counter() - t0,
    }
    if ranks[0][0] is not None:
        metrics["sync/logp_abs_diff_mean"] = sum(r[0][0] for r in ranks) / len(ranks)
        metrics["sync/logp_abs_diff_max"] = max(r[0][1] for r in ranks)
    detail = ", ".join(f"{name} ({n} of {total} read elements)" for name, (n, total) in list(bad.items())[:3])
    return metrics, detail


def _probe_due(check: SyncCheck) -> bool:
    """Whether this check runs the probe: always where the read-back leaves trained weights unread (or
    failed once); else at the first check and every ``probe_every``-th. Every rank counts alike. Where the
    read-back covers them, a missed or partial sync shows there exactly, and the probe's log-probs measure
    what no sync changes (kernels, dtype, the chat template's tokens)."""
    n = check.cache.get("checks", 0)
    check.cache["checks"] = n + 1
    # (a count kept in the check: it restarts at a resume, whose first check then runs the probe)
    return not check.covered or check.cache.get("probe_always", False) or n % check.probe_every == 0


def _tokens(check: SyncCheck) -> tuple[list[int], list[int]]:
    return check.probe.prompt, check.probe.completion


def _probe_diff(mine: Tensor, theirs: list[float]) -> Tensor:
    diff = (mine - torch.tensor(theirs, dtype=torch.float32)).abs()
    # A NaN anywhere must fail the check: nan_to_num maps it to +inf, which no tolerance passes.
    return torch.nan_to_num(diff, nan=math.inf)


def _stats(diff: Tensor | None) -> tuple[float, float] | None:
    return None if diff is None else (diff.mean().item(), diff.max().item())


def _read_back(check: SyncCheck, sampler: Sampler, policy: Policy) -> dict[str, tuple[int, int]]:
    """The read-back alone (a check without the probe). A served adapter is loaded by the engine on its
    first request after a sync, so one one-token request makes it active first (the next rollout would
    have loaded it)."""
    adapter = _adapter_served(sampler)
    if adapter:
        sampler.score(check.probe.prompt[-1:], check.probe.completion[:1])
    wanted = expected(policy, check.modules, sampler.dtype, adapter, check.cache)
    return differing(wanted, _read_served(check, sampler), check.compare)


def _both_sides(check: SyncCheck, sampler: Sampler, policy: Policy,
                dp: DataParallel) -> tuple[Tensor, dict[str, tuple[int, int]]]:
    """The probe's |learner - sampler| log-prob per token, and per synced module read back (elements that
    differ, elements read). The learner's forward runs in a fresh thread while this one (the sampler's
    engine may expect the main thread) scores the probe, reads back what the sampler serves (after the
    probe's request has made a served adapter active), computes what the learner expects served and
    compares. Each probe pass is one ~30-token forward on one CPU thread, so two cores run them side by
    side (SmolLM2 bf16, one thread each: hf 0.215 -> 0.136 s, vLLM 0.204 -> 0.156 s; the GIL serialises
    only their Python parts). The learner's LoRA forward is the longer side (SmolLM2 hf bf16: 145 ms
    against the sampler's 65 + 16 ms read-back), so the expected weights and the comparison (10 + 14 ms)
    ride on the shorter one; over several ranks they stay in the learner's thread before its forward,
    because under FSDP2 both gather and every rank must call collectives in one order. A fresh thread
    takes the thread count set now (torch reads it at a thread's first parallel op); on CUDA it needs the
    learner's device made current (a new thread starts on cuda:0)."""
    adapter = _adapter_served(sampler)

    def want() -> dict[str, tuple[Tensor, ...]]:
        return expected(policy, check.modules, sampler.dtype, adapter, check.cache)

    def learner() -> tuple[Tensor, dict | None]:
        with torch.cuda.device(policy.device) if policy.device.type == "cuda" else contextlib.nullcontext():
            wanted = want() if dp.active else None
            return learner_logprobs(policy, check.probe), wanted

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlft-sync-check") as pool:
        mine = pool.submit(learner)
        theirs = sampler.score(*_tokens(check))
        served = _read_served(check, sampler)
        counts = None if dp.active else differing(want(), served, check.compare)
        logp, wanted = mine.result()
    return _probe_diff(logp, theirs), counts if counts is not None else differing(wanted, served, check.compare)


def _read_served(check: SyncCheck, sampler: Sampler) -> dict[str, tuple[Tensor, ...]]:
    """The sampler's read-back, or nothing when its engine's internals are not what the read-back
    expects (another vLLM version): the probe then checks alone, and the run says so once."""
    if not check.modules:
        return {}
    try:
        return sampler.read_served(list(check.modules))
    except (AttributeError, KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
        check.notes.setdefault("read_error", f"read-back failed: {type(e).__name__}: {e}")
        return {}


def _adapter_served(sampler: Sampler) -> bool:
    """Whether the sampler serves an adapter now (before the first sync a vLLM engine serves its base)."""
    return sampler.serves_adapter and getattr(sampler, "adapter", None) is not None


@contextlib.contextmanager
def one_cpu_thread(device: torch.device) -> Iterator[None]:
    """Run the check's ~30-token passes on one CPU thread: ops this small gain nothing from a second
    one, and on a busy machine every parallel region waits for a descheduled thread (measured beside
    another job on 2 cores: 1.9 s on 2 threads, 15 ms on 1)."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    # torch._C's own setter: vLLM's CPU worker replaces torch.set_num_threads with a no-op once it has
    # bound its OpenMP threads to cores. Narrowing the team and widening it back keeps those threads.
    torch._C.set_num_threads(1)
    try:
        yield
    finally:
        torch._C.set_num_threads(threads)


def mismatch(check: SyncCheck, metrics: dict[str, float], when: str, detail: str = "") -> str | None:
    """The one-line message when the probe's mean difference exceeds the tolerance or a served weight
    differs from the learner's (None: it passed)."""
    mean, top = metrics.get("sync/logp_abs_diff_mean", 0.0), metrics.get("sync/logp_abs_diff_max", 0.0)
    differ = int(metrics.get("sync/weights_differ", 0))
    if mean <= check.tol and differ == 0:
        return None
    head = f"weight sync check failed {when} ({check.where}): "
    probe = (f"by mean {mean:.3g}, max {top:.3g} (tolerance {check.tol:g}, {check.tol_source})")
    stale = "the sampler is not sampling from the policy being trained"
    if differ:
        read = int(metrics["sync/weights_read"])
        return (head + f"{differ} of {read} synced weights the sampler serves differ from the learner's: "
                + (detail or "on another rank") + "; " + (f"the probe's log-probs differ {probe}; "
                                                          if "sync/logp_abs_diff_mean" in metrics else "") + stale)
    return head + f"the sampler's log-probs of a probe differ from the learner's {probe}; {stale}"


def verify(check: SyncCheck | None, sampler: Sampler, policy: Policy, dp: DataParallel, when: str,
           warn: Callable[[str], None] | None = None) -> dict[str, float]:
    """Run the check (unless off) after the sampler's weights were set ``when`` ("after the step 3 sync").

    Returns:
        Its metrics (:data:`METRICS`); empty when the check is off.

    Raises:
        SyncError: a mismatch under sampler.sync_check=error (under ``warn`` it goes to ``warn``, by
            default to stderr, and the run goes on).
    """
    if check is None or check.mode == "off":
        return {}
    metrics, detail = _measure(check, sampler, policy, dp)
    _note_unread(check, metrics, dp, warn)
    problem = mismatch(check, metrics, when, detail)
    if problem is None:
        return metrics
    if check.mode == "error":
        raise SyncError(problem + " (sampler.sync_check=warn: go on anyway)")
    (warn or _to_stderr)(problem)
    return metrics


def _note_unread(check: SyncCheck, metrics: dict[str, float], dp: DataParallel,
                 warn: Callable[[str], None] | None) -> None:
    """Say once per run, on the main rank, when synced weights were not read back: the probe alone
    checks them (vLLM under tensor parallelism, or an engine whose internals the read-back does not know)."""
    total = check.synced
    read = int(metrics["sync/weights_read"])
    if read >= total or "said" in check.notes:
        return
    why = check.notes.get("read_error", "")
    check.notes["said"] = "yes"
    if dp.main:
        (warn or _to_stderr)(f"sync check ({check.where}): the served weights of {total - read} of {total} synced "
                             f"modules cannot be read back{' (' + why + ')' if why else ''}; the probe alone checks "
                             "them")


def _to_stderr(message: str) -> None:
    print(f"rlft: warning: {message}", file=sys.stderr)
