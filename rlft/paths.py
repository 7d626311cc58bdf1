"""One rule for paths the user types (config values and command-line arguments)."""

from __future__ import annotations

import re
from pathlib import Path


def user_path(p: str | Path) -> Path:
    """``p`` with a leading ``~`` expanded; relative paths stay relative to the working directory."""
    return Path(p).expanduser()


_HOME_VALUE = re.compile(r"([^=\s'\"]+)=(~[^'\",\[\](){}\\]*)")


def quote_home(overrides: list[str]) -> list[str]:
    """KEY=~/PATH as KEY='~/PATH': Hydra's grammar rejects an unquoted '~', and user paths expand it."""
    return [f"{m[1]}='{m[2]}'" if (m := _HOME_VALUE.fullmatch(o)) else o for o in overrides]
