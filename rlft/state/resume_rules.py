"""Which config changes a resume allows: each key's resume class (the schema's ``knob(resume=...)``), the keys
whose class depends on the config, and the check of a checkpoint's saved config against the current one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rlft.config import Config
from rlft.config.schemas import resume_classes
from rlft.config.schemas.fields import HARMFUL, NUMERICS
from rlft.config.schemas.fields import HARMLESS as HARMLESS
from rlft.errors import ConfigError
from rlft.state import checkpoint as ckpt
from rlft.state.run_state import CONFIG

# What changing a key between a checkpoint and its resumption does to the run, and why: each schema
# field's ``resume`` (rlft.config.schemas), by its key; a section's row ends in "." and covers every key
# under it. tests/test_checkpoint_safety.py fails on a schema key with no row, so a new key needs one.
# HARMLESS and NUMERICS changes are allowed and reported; HARMFUL ones refuse the resume.
KEY_CLASSES: dict[str, tuple[str, str]] = resume_classes(Config)


def _steps_matter(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return any(c.get("optim.schedule") != "constant" for c in (old, new))


# Keys whose change is harmful only in some configs: (test on the saved and current flat configs, why).
CONDITIONS: dict[str, tuple[Callable[[dict, dict], bool], str]] = {
    "trainer.steps": (_steps_matter, "sets the length of the linear/cosine LR schedule, so every later LR"),
}


def rule(key: str, classes: dict[str, tuple[str, str]] | None = None) -> tuple[str, str] | None:
    """The row of ``classes`` (default :data:`KEY_CLASSES`) for ``key``: its exact row, else its section's."""
    classes = KEY_CLASSES if classes is None else classes
    if key in classes:
        return classes[key]
    sections = [p for p in classes if p.endswith(".") and key.startswith(p)]
    return classes[max(sections, key=len)] if sections else None


def classify(key: str, old: dict[str, Any], new: dict[str, Any],
             classes: dict[str, tuple[str, str]] | None = None) -> tuple[str, str]:
    """``(class, why)`` of a change of ``key`` between the flattened saved and current configs."""
    kind, why = rule(key, classes) or (HARMFUL, "not a known config key")
    test, harmful_why = CONDITIONS.get(key, (None, ""))
    return (HARMFUL, harmful_why) if test is not None and test(old, new) else (kind, why)


def config_changes(saved_yaml: str, current_yaml: str, trained_dtype: str | None = None,
                   classes: dict[str, tuple[str, str]] | None = None) -> tuple[list[str], list[str]]:
    """Keys whose values differ between two resolved configs, split into (harmful, allowed), each key
    classed by ``classes`` (default :data:`KEY_CLASSES`, ``rlft train``'s).

    Each entry reads ``key: old -> new (why)``; an allowed one that only changes numerics says so.
    ``trained_dtype`` is what ``model.dtype=auto`` resolved to in the checkpoint: ``auto`` on
    either side stands for it, so ``auto`` and the dtype it chose are no change.
    """
    old, new = _flatten(yaml.safe_load(saved_yaml) or {}), _flatten(yaml.safe_load(current_yaml) or {})
    for flat in (old, new):
        if trained_dtype and flat.get("model.dtype") == "auto":
            flat["model.dtype"] = trained_dtype
    harmful, allowed = [], []
    for k in sorted(set(old) | set(new)):
        if old.get(k) != new.get(k):
            kind, why = classify(k, old, new, classes)
            shown = f"{k}: {_show(old.get(k, '<unset>'))} -> {_show(new.get(k, '<unset>'))} "
            shown += f"({why})" if kind != NUMERICS else f"({NUMERICS}: {why})"
            (harmful if kind == HARMFUL else allowed).append(shown)
    return harmful, allowed


def check_compatible(path: Path, current_yaml: str, world_size: int = 1,
                     classes: dict[str, tuple[str, str]] | None = None) -> list[str]:
    """Fail when the config changed in a way that changes the run, naming each key and why; return the others
    (a change of the number of data-parallel ranks among them). ``classes``: as :func:`config_changes`."""
    harmful, allowed = config_changes((path / CONFIG).read_text(), current_yaml, trained_dtype(path), classes)
    try:
        saved_world = int(ckpt.read_json(path, ckpt.STATE).get("world_size", 1))
    except (OSError, ValueError):  # no trainer state to read (resolve() has checked the checkpoint is complete)
        saved_world = world_size
    if saved_world != world_size:
        allowed.append(f"data-parallel ranks: {saved_world} -> {world_size} ({NUMERICS}: the order of the gradient "
                       "sum; rollouts are seeded per prompt; new ranks start from rank 0's random state)")
    if harmful:
        shown = "; ".join(harmful[:4]) + (f"; and {len(harmful) - 4} more" if len(harmful) > 4 else "")
        raise ConfigError(
            f"cannot resume from {path}: the config changed in ways that change the run: {shown}; "
            "revert them or start a new run directory"
        )
    return allowed


def trained_dtype(path: Path) -> str | None:
    """The compute dtype a checkpoint was trained in: recorded since ``model.dtype=auto`` exists,
    else its config's explicit value (older checkpoints)."""
    try:
        recorded = ckpt.read_json(path, ckpt.STATE).get("compute_dtype")
    except (OSError, ValueError):  # no trainer state to read: the config is all there is
        recorded = None
    if recorded:
        return recorded
    saved = (yaml.safe_load((path / CONFIG).read_text()) or {}).get("model", {}).get("dtype")
    return saved if saved in ("bf16", "fp32") else None


def _show(value: Any) -> str:
    return str(value).replace("\n", "\\n")  # the message stays one line


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}."))
    return out
