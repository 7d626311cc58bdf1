"""Checkpoint directories on disk: atomic writes, completeness checks, discovery and pruning.

A checkpoint is ``checkpoints/step_NNNNNN/`` holding safetensors files, JSON files and a
``manifest.json`` written last that lists every file with its size. It is assembled in a
hidden temporary directory, fsynced, then renamed into place, so a process killed at any
moment leaves either a complete checkpoint or nothing that :func:`latest_checkpoint` would
return. Re-saving a step swaps the new copy in atomically, and pruning removes only the
leftovers of writers that are gone. Nothing here unpickles: tensors are safetensors,
everything else is JSON.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file
from torch import Tensor

from rlft.errors import CheckpointError

MANIFEST = "manifest.json"
STATE = "trainer_state.json"
_NAME = re.compile(r"^step_(\d{6,})$")
# Tests kill the process inside a write: this many seconds pass between the first file and the manifest.
FAULT_DELAY_ENV = "RLFT_FAULT_SAVE_DELAY"
# ... and between a re-saved step's new copy taking its place and the previous copy's removal.
FAULT_SWAP_DELAY_ENV = "RLFT_FAULT_SWAP_DELAY"
_LEFTOVER = re.compile(r"^\.(?:tmp|old)-step_\d{6,}-(\d{1,9})$")


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_step(path: Path) -> int | None:
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else None


def write_checkpoint(
    root: Path, step: int, tensors: dict[str, dict[str, Tensor]], jsons: dict[str, Any],
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``root/step_NNNNNN`` atomically.

    Args:
        root: The run's ``checkpoints`` directory (created if needed).
        step: Training step the checkpoint captures.
        tensors: ``{file name: {tensor name: tensor}}``, each saved as a safetensors file.
        jsons: ``{file name: object}``, each saved as JSON (or as text when the object is a str).
        extra: Writes more files into the directory (e.g. a peft adapter), before the manifest.

    Returns:
        The final checkpoint directory.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for i, (name, tensor_dict) in enumerate(tensors.items()):
        # Host copies: a checkpoint written from CUDA tensors loads anywhere (and is mapped onto the
        # resuming run's device by run_state.apply).
        save_file({k: v.detach().to("cpu").contiguous() for k, v in tensor_dict.items()}, str(tmp / name))
        if i == 0:
            _fault_pause(FAULT_DELAY_ENV)
    for name, obj in jsons.items():
        (tmp / name).write_text(obj if isinstance(obj, str) else json.dumps(obj, indent=1))
    if extra is not None:
        extra(tmp)
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {"step": step, "files": {str(p.relative_to(tmp)): p.stat().st_size for p in files}}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    for p in [*files, tmp / MANIFEST]:
        _fsync(p)
    _fsync(tmp)
    _put_in_place(tmp, final)
    _fsync(root)
    return final


def _put_in_place(tmp: Path, final: Path) -> None:
    """Rename the complete ``tmp`` to ``final``; when re-saving a step, replace the existing copy.

    No portable call replaces a non-empty directory, and renaming the old copy aside first leaves an
    instant with no ``final``; Linux's RENAME_EXCHANGE swaps the two names atomically, so a complete
    copy of the step is always in place. Elsewhere (or on a filesystem that refuses the swap) the
    two renames remain, with that short gap.
    """
    if not final.exists():
        os.rename(tmp, final)
        return
    if _exchange(tmp, final):
        _fault_pause(FAULT_SWAP_DELAY_ENV)
        shutil.rmtree(tmp)  # now the previous copy
        return
    old = final.parent / f".old-{final.name}-{os.getpid()}"
    os.rename(final, old)
    _fault_pause(FAULT_SWAP_DELAY_ENV)
    os.rename(tmp, final)
    shutil.rmtree(old)


_RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with renameat2(2); False where the kernel, libc or filesystem cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # glibc < 2.28, or a libc without the wrapper
        return False
    at_cwd = -100  # AT_FDCWD: the paths are absolute or relative to the working directory
    if renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _fault_pause(env: str) -> None:
    if os.environ.get(env):
        time.sleep(float(os.environ[env]))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_complete(path: Path) -> bool:
    """The manifest exists and every file it lists is there with its recorded size."""
    # A re-save of this step may swap the directory between our reading its manifest and its files;
    # a second look then sees the new copy whole.
    return _complete(path) or _complete(path)


def _complete(path: Path) -> bool:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        return all((path / f).stat().st_size == size for f, size in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is not None and is_complete(p)]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def latest_in(root: Path) -> Path | None:
    """The newest complete checkpoint directly under ``root``."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def latest_checkpoint(run_dir: Path) -> Path | None:
    return latest_in(run_dir / "checkpoints")


def prune(root: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints, and leftovers of writes that died."""
    removed = []
    for p in root.iterdir() if root.is_dir() else []:
        m = _LEFTOVER.match(p.name)
        if m and not _writing(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
    if keep_last > 0:
        for p in list_checkpoints(root)[:-keep_last]:
            shutil.rmtree(p)
            removed.append(p)
    return removed


def _writing(pid: int) -> bool:
    """Whether another process named ``pid`` may still be writing its ``.tmp-``/``.old-`` directory.

    Our own leftovers are dead: prune runs after our write returned. Signal 0 only checks that the
    pid exists. A reused pid keeps a leftover until that process ends (a leak, never a loss); a
    writer in another pid namespace or on another host sharing the directory is taken for dead.
    """
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def resolve(spec: str, run_dir: Path, label: str = "trainer.resume=") -> Path | None:
    """``trainer.resume``: '' (fresh), 'auto' (newest in run_dir, or fresh), or a checkpoint or run directory.

    Raises:
        CheckpointError: PATH does not exist or holds no complete checkpoint.
    """
    if spec in ("", "none", "None"):
        return None
    if spec == "auto":
        return latest_checkpoint(run_dir)
    path = Path(spec).expanduser()
    if not path.exists():
        raise CheckpointError(f"{label}{spec}: no such checkpoint or run directory")
    if checkpoint_step(path) is not None:
        if not is_complete(path):
            raise CheckpointError(f"{label}{spec}: checkpoint is incomplete (its write was interrupted)")
        return path
    found = latest_checkpoint(path) or latest_in(path)  # a run directory, or its checkpoints/ directory
    if found is None:
        raise CheckpointError(f"{label}{spec}: no complete checkpoint in this directory")
    return found


def check_fresh(run_dir: Path, spec: str) -> None:
    """A fresh start must not bury an earlier run's checkpoints under new ones."""
    found = latest_checkpoint(run_dir)
    if found is not None and spec != "auto":
        raise CheckpointError(
            f"{run_dir} already holds checkpoints (newest: {found.name}): pass trainer.resume=auto to continue "
            "that run, or choose another hydra.run.dir"
        )


def read_tensors(path: Path, name: str) -> dict[str, Tensor]:
    return load_file(str(path / name))


def read_json(path: Path, name: str) -> Any:
    return json.loads((path / name).read_text())


def kind(path: Path) -> str | None:
    """Which command wrote the checkpoint at ``path``: its trainer state's ``kind`` (``reward_model``, ``sft``),
    None for ``rlft train``'s (which writes none) or an unreadable state."""
    try:
        return json.loads((path / STATE).read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        return None
