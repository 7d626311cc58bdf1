"""One rule for paths the user types (config values and command-line arguments)."""

from __future__ import annotations

from pathlib import Path


def user_path(p: str | Path) -> Path:
    """``p`` with a leading ``~`` expanded; relative paths stay relative to the working directory."""
    return Path(p).expanduser()
