"""Figures about a checkout of rlft, each a function of the checkout's path (so that an old commit,
checked out with `git worktree add` or unpacked with `git archive`, can be measured the same way).

    python scripts/code_stats.py [ROOT]                   every figure
    python scripts/code_stats.py yaml-defaults [ROOT]     YAML keys in conf/ that repeat a schema default
    python scripts/code_stats.py layout [ROOT] [-v]       modules at the root, the largest modules, README and docs sizes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

# Run in a fresh interpreter on the checkout's own package: its schema, not the one importing this.
_DEFAULTS = """
import dataclasses, json
from rlft.config.schemas import Config
print(json.dumps(dataclasses.asdict(Config())))
"""


def schema_defaults(root: Path) -> dict[str, Any]:
    """The defaults of ``rlft.config.schemas.Config`` in the checkout at ``root``, as nested dicts."""
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", _DEFAULTS], cwd=root, env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def _package(path: Path, conf: Path) -> list[str]:
    """Where Hydra merges a conf/ file: the top level for config.yaml and ``# @package _global_``
    files, else the group's section."""
    first = path.read_text().lstrip().splitlines()[:1]
    if path.parent == conf or first == ["# @package _global_"]:
        return []
    return list(path.relative_to(conf).parent.parts)


def _leaves(node: Any, prefix: list[str]) -> list[tuple[list[str], Any]]:
    if not isinstance(node, dict):
        return [(prefix, node)]
    return [leaf for k, v in node.items() if k != "defaults" for leaf in _leaves(v, [*prefix, str(k)])]


def _lookup(defaults: dict[str, Any], path: list[str]) -> tuple[bool, Any]:
    node: Any = defaults
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return not isinstance(node, dict), node


def _same(a: Any, b: Any) -> bool:
    """Equal as config values: 32 and 32.0 are, True and 1 are not."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def yaml_default_repeats(root: str | Path) -> list[str]:
    """Each key of a YAML file in ``root``/conf that sets a schema key to its schema default,
    as ``FILE: KEY`` (FILE relative to conf/, KEY the full config path)."""
    root = Path(root).resolve()
    conf, defaults = root / "conf", schema_defaults(root)
    out = []
    for path in sorted(conf.rglob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        for key, value in _leaves(data, _package(path, conf)):
            known, default = _lookup(defaults, key)
            if known and _same(value, default):
                out.append(f"{path.relative_to(conf)}: {'.'.join(key)}")
    return out


def _print_yaml_defaults(root: Path, verbose: bool) -> None:
    repeats = yaml_default_repeats(root)
    algo = [r for r in repeats if r.startswith("algo/")]
    print(f"yaml keys repeating a schema default: {len(repeats)} "
          f"({len(algo)} in conf/algo/, the recipes; {len(repeats) - len(algo)} elsewhere)")
    for r in repeats if verbose else []:
        print(f"  {r}")


def _print_layout(root: Path, verbose: bool) -> None:
    """The package's shape (modules at the root, folders, the largest modules) and the size of what users read."""
    pkg = root / "rlft"
    modules = {p: len(p.read_text().splitlines()) for p in sorted(pkg.rglob("*.py"))}
    at_root = sorted(p.stem for p in pkg.glob("*.py"))
    folders = sorted(d.name for d in pkg.iterdir() if (d / "__init__.py").is_file())
    largest = sorted(modules.items(), key=lambda kv: -kv[1])
    docs = {p: p.stat().st_size for p in sorted((root / "docs").rglob("*.md"))}
    big_doc = max(docs.items(), key=lambda kv: kv[1])
    print(f"modules at the root: {len(at_root)} ({', '.join(at_root) if verbose else 'list with -v'}); "
          f"folders: {len(folders)}; modules in all: {len(modules)}, {sum(modules.values())} lines")
    print(f"largest module: {largest[0][0].relative_to(root)} ({largest[0][1]} lines); "
          f"modules over 300 lines: {sum(n > 300 for n in modules.values())}")
    for path, n in largest[:10] if verbose else []:
        print(f"  {n:5d}  {path.relative_to(root)}")
    print(f"README.md: {(root / 'README.md').stat().st_size / 1000:.1f} KB; docs: {len(docs)} pages, "
          f"{sum(docs.values()) / 1000:.0f} KB, the largest {big_doc[0].relative_to(root)} ({big_doc[1] / 1000:.0f} KB)")


# Each figure: a name for the command line and a function printing it for a checkout.
FIGURES = {"yaml-defaults": _print_yaml_defaults, "layout": _print_layout}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage="%(prog)s [FIGURE] [ROOT] [-v]")
    parser.add_argument("args", nargs="*", metavar="[FIGURE] [ROOT]",
                        help=f"FIGURE: {', '.join(FIGURES)} (default: all); ROOT: a checkout (default: this one)")
    parser.add_argument("-v", "--verbose", action="store_true", help="list what is counted")
    parsed = parser.parse_args(argv)
    args, verbose = list(parsed.args), parsed.verbose
    names = [args.pop(0)] if args and args[0] in FIGURES else list(FIGURES)
    root = Path(args.pop(0) if args else Path(__file__).resolve().parent.parent)
    if args or not (root / "conf").is_dir():
        print(f"code_stats: error: expected [FIGURE] [ROOT], FIGURE one of {', '.join(FIGURES)} and ROOT a "
              f"checkout with a conf/ folder; got {' '.join(parsed.args)}", file=sys.stderr)
        return 2
    for name in names:
        FIGURES[name](root, verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
