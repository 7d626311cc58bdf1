"""Weight syncs broken on purpose, as real bugs broke them (unsloth-zoo #941: one projection never
loaded; verl #7495: the LoRA never delivered), for tests/test_sync_check.py.

In the test process the tests patch with pytest's monkeypatch (:func:`skipping_weights`,
:func:`previous_adapter_target`). A CLI child reads ``RLFT_TEST_BREAK_SYNC`` through :func:`install_from_env`,
which a ``sitecustomize.py`` the test writes on the child's PYTHONPATH calls at start-up.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

BREAK_ENV = "RLFT_TEST_BREAK_SYNC"
# A sitecustomize.py with this text, on a child's PYTHONPATH, breaks that child's syncs as $RLFT_TEST_BREAK_SYNC says.
SITECUSTOMIZE = "import tests.sync_break\ntests.sync_break.install_from_env()\n"


def skipping_weights(skip: str, sampler_weights: Callable[[Any], Iterator]) -> Callable[[Any], Iterator]:
    """``Policy.sampler_weights`` that never yields the weights whose name contains ``skip`` (the merged
    and the hf syncs then leave that layer as it was)."""

    def broken(policy: Any) -> Iterator:
        return ((name, w) for name, w in sampler_weights(policy) if skip not in name)

    return broken


def previous_adapter_target(skip: str, model: Any) -> Callable[[Any], dict | None]:
    """``rlft.samplers.vllm._whole_adapters`` whose files carry, for the modules whose name contains ``skip``,
    ``model``'s adapter as it is now (later updates of that target never served)."""
    held = {n: t.detach().clone() for n, t in model.state_dict().items() if "lora_" in n and skip in n}

    def broken(model: Any) -> dict:
        return {n: held.get(n, t.detach()) for n, t in model.state_dict().items() if "lora_" in n}

    return broken


def install_from_env() -> None:
    """Break this process's syncs if ``$RLFT_TEST_BREAK_SYNC`` names a weight: its merged weight is never pushed."""
    skip = os.environ.get(BREAK_ENV)
    if not skip:
        return
    from rlft.models.policy import Policy

    Policy.sampler_weights = skipping_weights(skip, Policy.sampler_weights)


def lagging(sampler_weights: Callable[[Any], Iterator]) -> Callable[[Any], Iterator]:
    """``Policy.sampler_weights`` that yields what the previous call yielded (the sampler serves the weights
    of one step before), and the current weights the first time."""
    held: list[tuple[str, Any]] = []

    def broken(policy: Any) -> Iterator:
        now = [(name, w.clone()) for name, w in sampler_weights(policy)]
        before = list(held) or now
        held[:] = now
        return iter(before)

    return broken
