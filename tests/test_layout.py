"""The package's layout and its public surface: what stays at the root, what pip installs, what the worker server
imports, and the names users write (the CLI entry point, conf/'s ``_target_``s, the documented imports)."""

from __future__ import annotations

import importlib
import importlib.util
import pickle
import subprocess
import sys

import tomllib
import yaml

from tests.support import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (pyproject allows it): pip's vendored copy reads the same TOML
    from pip._vendor import tomli as tomllib

ROOT_MODULES = {"__init__", "__main__", "cli", "errors", "paths", "registry", "sweep"}
"""The root's modules: the entry points, the leaves every folder uses, and the Hydra callback conf/ names."""


def test_the_root_keeps_a_handful_of_modules():
    found = {p.stem for p in (ROOT / "rlft").glob("*.py")}
    assert found == ROOT_MODULES, f"a new module at the root belongs in a folder by role: {found - ROOT_MODULES}"


def test_pip_installs_every_package():
    """pyproject lists the packages one by one (conf/ ships as rlft.conf): a folder missing there is missing from a
    wheel, while an editable install (the tests') still finds it."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "rlft").rglob("__init__.py")}
    assert found <= listed, f"not in pyproject.toml's packages: {sorted(found - listed)}"
    assert {p for p in listed if p != "rlft.conf" and not p.startswith("rlft.conf.")} == found


def _fresh(code: str, stdin: bytes | None = None) -> str:
    proc = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return proc.stdout.decode()


def test_a_fresh_interpreter_imports_everything_the_worker_server_preloads():
    """CPython's forkserver skips a preload that raises ImportError: a module renamed without its name in _PRELOAD
    would only show as workers that each import it again (or die unpickling). Imported here as the server does."""
    from rlft.workers.server import _PRELOAD

    assert _PRELOAD and all(isinstance(m, str) for m in _PRELOAD)
    out = _fresh("import importlib, sys\n"
                 f"for m in {list(_PRELOAD)!r}:\n"
                 "    importlib.import_module(m)\n"
                 "print(sorted(sys.modules.keys() & " + repr(set(_PRELOAD)) + "))")
    assert out.strip() == repr(sorted(_PRELOAD))


def test_the_functions_handed_to_workers_unpickle_by_name_in_a_fresh_interpreter():
    """What a pool hands the server is pickled by reference (module and name): each must load there."""
    import functools

    from rlft.episodes.env_in_worker import env_call
    from rlft.tools.outcomes import call_user
    from rlft.workers.in_worker import serve
    from rlft.workers.server import not_fresh

    for fn in (serve, env_call, call_user):
        assert not_fresh(fn.__module__) is None, fn
    blob = pickle.dumps([serve, functools.partial(env_call, dict), functools.partial(call_user, {})])
    out = _fresh("import pickle, sys\nfns = pickle.loads(sys.stdin.buffer.read())\n"
                 "print([getattr(f, 'func', f).__module__ + '.' + getattr(f, 'func', f).__name__ for f in fns])",
                 stdin=blob)
    assert out.strip() == repr(["rlft.workers.in_worker.serve", "rlft.episodes.env_in_worker.env_call",
                                "rlft.tools.outcomes.call_user"])


def _targets(node: object) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "_target_"] + [t for v in node.values() for t in _targets(v)]
    if isinstance(node, list):
        return [t for v in node for t in _targets(v)]
    return []


def test_the_public_names_resolve():
    """The CLI's entry point, every ``_target_`` in conf/ (what saved sweep configs and users' own YAML name), and
    the imports the docs give users."""
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["rlft"]
    module, name = script.split(":")
    assert callable(getattr(importlib.import_module(module), name))
    targets = [t for f in sorted((ROOT / "conf").rglob("*.yaml")) for t in _targets(yaml.safe_load(f.read_text()))]
    assert "rlft.sweep.SweepSummary" in targets
    for target in targets:
        module, _, name = target.rpartition(".")
        assert hasattr(importlib.import_module(module), name), target
    from rlft.episodes.env import Environment, Step  # docs: an episode.env environment
    from rlft.tools.builtin import run_python  # docs: a user tool that runs the policy's code

    assert Step(done=True, reward=1.0).done and callable(run_python) and Environment


def test_the_config_reference_page_is_generated_from_the_schemas():
    """docs/reference/config.md is what scripts/config_reference.py makes of the schemas now: a key added, renamed or
    re-documented without regenerating the page fails here."""
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.page()
    assert "`trainer.max_minutes`" in text and "`episode.worker_start`" in text and "## rlft rm" in text
    assert (ROOT / "docs" / "reference" / "config.md").read_text() == text, \
        "docs/reference/config.md is stale: run python scripts/config_reference.py"


def _code_map() -> set[str]:
    """The modules the README's code map names, as paths (``rlft/state/checkpoint.py``), from its indented tree."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("```\nrlft/\n") + 4:]
    block = block[:block.index("```")]
    stack: list[str] = []
    found = set()
    for line in block.splitlines():
        if not line.strip() or line.startswith(" " * 22):  # a description's second line
            continue
        depth, name = (len(line) - len(line.lstrip())) // 2, line.split()[0]
        stack[depth:] = [name.rstrip("/")]
        if name.endswith(".py"):
            found.add("/".join(stack))
    return found


def test_the_readme_code_map_names_every_module_once_and_stays_short():
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "rlft").rglob("*.py") if p.name != "__init__.py"}
    named = _code_map()
    assert sorted(modules - named) == [], "modules missing from the README's code map"
    assert sorted(named - modules) == [], "the README's code map names modules that do not exist"
    assert len((ROOT / "README.md").read_text().encode()) < 12_500
