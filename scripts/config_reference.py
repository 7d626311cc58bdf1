"""docs/reference/config.md: every config key of `rlft train`, `rlft rm` and `rlft sft`, generated from the schemas
(rlft/config/schemas/, rlft/config/rm_schema.py, rlft/config/sft_schema.py): its default, its valid values and its docstring.

    python scripts/config_reference.py          rewrite docs/reference/config.md
    python scripts/config_reference.py --check  exit 1 when the page is stale (tests/test_layout.py does the same)
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from pathlib import Path

from rlft.commands.help import field_docs
from rlft.config import GROUPS, Config, group_options
from rlft.config.loading import field_type
from rlft.config.rm_schema import RM_GROUPS, RMConfig
from rlft.config.schemas.fields import valid_values
from rlft.config.sft_schema import SFT_GROUPS, SFTConfig

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "config.md"

HEAD = """# Config keys

Every key of `rlft train`, `rlft rm` and `rlft sft`, with its default in the schema, its valid values and its meaning:
generated from the schemas (`rlft/config/schemas/`, `rlft/config/rm_schema.py`, `rlft/config/sft_schema.py`) by
`python scripts/config_reference.py`; tests/test_layout.py fails when this page is stale. A group option
(`algo=dapo`, `model=smollm2_135m`) sets some keys to other values: `rlft train --help SECTION [KEY=VALUE ...]`
prints the values of a given run, and `rlft train --cfg job` the whole composed config.
"""


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        return "(its section)" if dataclasses.is_dataclass(value) else repr(value)
    return "(required)"


def _keys(cls: type, prefix: str) -> list[str]:
    """One line per key of section ``cls`` (its own keys before a base's), nested sections flattened."""
    docs, own, out = field_docs(cls), inspect.get_annotations(cls), []
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.name not in own):
        key, sub = f"{prefix}{f.name}", field_type(cls, f.name)
        if dataclasses.is_dataclass(sub):
            out += _keys(sub, f"{key}.")
            continue
        valid = valid_values(cls, f.name)
        doc = " ".join(docs.get(f.name, "").split())
        out.append(f"- `{key}` = `{_default(f)}`{f' ({valid})' if valid else ''}: {doc}")
        entry = next(iter(typing.get_args(sub)), None)
        if dataclasses.is_dataclass(entry):  # a list of sections (reward.judges): each entry's keys
            out += ["  " + line for line in _keys(entry, f"{key}[i].")]
    return out


def _command(title: str, root: type, groups: tuple[str, ...], options: typing.Callable[[str], list[str]]) -> list[str]:
    lines = [f"## {title}", ""]
    loose = []
    for f in dataclasses.fields(root):
        sub = field_type(root, f.name)
        if not dataclasses.is_dataclass(sub):
            loose.append(f)
            continue
        doc = (sub.__doc__ or "").strip()
        lines += [f"### {f.name}", ""]
        if doc and not doc.startswith(sub.__name__ + "("):
            lines += [" ".join(doc.split("\n\n")[0].split()), ""]
        if f.name in groups:
            lines += [f"Options (`{f.name}=OPTION`, conf/{f.name}/): {', '.join(options(f.name))}.", ""]
        lines += [*_keys(sub, f"{f.name}."), ""]
    if loose:
        docs = field_docs(root)
        lines += ["### Top-level keys", ""]
        for f in loose:
            valid = valid_values(root, f.name)
            lines.append(f"- `{f.name}` = `{_default(f)}`{f' ({valid})' if valid else ''}: "
                         f"{' '.join(docs.get(f.name, '').split())}")
        lines.append("")
    return lines


def page() -> str:
    """The page, as generated from the schemas now."""
    lines = [HEAD, *_command("rlft train", Config, GROUPS, group_options),
             *_command("rlft rm", RMConfig, RM_GROUPS, group_options),
             *_command("rlft sft", SFTConfig, SFT_GROUPS, group_options)]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = page()
    if "--check" in argv:
        stale = not PAGE.is_file() or PAGE.read_text() != text
        print(f"{PAGE}: {'stale: run python scripts/config_reference.py' if stale else 'up to date'}")
        return int(stale)
    PAGE.write_text(text)
    print(f"wrote {PAGE} ({len(text) / 1000:.0f} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
