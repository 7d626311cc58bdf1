"""One place for each error class (rlft/errors.py) and its exit code; imports that flow one way."""

from __future__ import annotations

import ast
import builtins
import importlib.util
import subprocess
import sys

import pytest

from rlft import errors
from rlft.commands.jobs import failed
from rlft.errors import RlftError
from tests.support import ROOT

# The exit codes docs/guide/runs.md#exit-codes ("Exit codes") gives each user-facing error.
DOCUMENTED = {"ConfigError": 2, "DataError": 2, "ModelError": 2, "CheckpointError": 2, "RewardError": 1,
              "RewardNameError": 2, "EnvError": 1, "SyncError": 1}


def _import_stats():
    spec = importlib.util.spec_from_file_location("import_stats", ROOT / "scripts" / "import_stats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _exception_classes(tree: ast.AST) -> list[str]:
    """Classes whose bases name an exception (a built-in one, ``...Error``, ``...Exception``, or one of these)."""
    def is_exception(name: str) -> bool:
        builtin = getattr(builtins, name, None)
        return (isinstance(builtin, type) and issubclass(builtin, BaseException)) or name.endswith(("Error", "Exception"))

    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
            if any(is_exception(b) or b in found for b in bases):
                found.append(node.name)
    return found


def test_every_exception_class_is_defined_in_rlft_errors():
    elsewhere = {str(p.relative_to(ROOT)): names for p in sorted((ROOT / "rlft").rglob("*.py"))
                 if p.name != "errors.py" and (names := _exception_classes(ast.parse(p.read_text())))}
    assert elsewhere == {}
    assert set(DOCUMENTED) <= set(_exception_classes(ast.parse((ROOT / "rlft" / "errors.py").read_text())))


def test_exit_codes_are_as_documented():
    user_facing = {name for name, cls in vars(errors).items()
                   if isinstance(cls, type) and issubclass(cls, RlftError) and cls is not RlftError}
    assert user_facing == set(DOCUMENTED)  # a new class gets its line in docs/guide/runs.md#exit-codes and here
    assert {name: getattr(errors, name).exit_code for name in DOCUMENTED} == DOCUMENTED
    assert "rlft/errors.py" in (ROOT / "docs" / "guide" / "runs.md").read_text()
    # A reward entry that names nothing is the config's fault (2), though it is also a RewardError.
    assert issubclass(errors.RewardNameError, errors.RewardError)
    assert issubclass(errors.RewardNameError, errors.ConfigError)


def test_old_import_paths_still_work():
    from rlft.config import ConfigError
    from rlft.data import DataError
    from rlft.errors import ConfigError as SchemaConfigError
    from rlft.models import ModelError
    from rlft.rewards import RewardError
    from rlft.rewards.countdown import UnsafeExpression
    from rlft.rewards.functions import RewardNameError
    from rlft.state.checkpoint import CheckpointError
    from rlft.workers.user_calls import CallDied, CallFailed, CallTimeout

    assert (ConfigError, SchemaConfigError, DataError, ModelError, CheckpointError, RewardError, RewardNameError) == (
        errors.ConfigError, errors.ConfigError, errors.DataError, errors.ModelError, errors.CheckpointError,
        errors.RewardError, errors.RewardNameError)
    assert (CallDied, CallFailed, CallTimeout, UnsafeExpression) == (
        errors.CallDied, errors.CallFailed, errors.CallTimeout, errors.UnsafeExpression)


def test_any_rlft_error_is_one_job_status_line_with_its_class_exit_code():
    class NewError(RlftError):  # a class commands/train.py and cli.py have never heard of
        exit_code = 3

    assert failed(NewError("what went wrong")) == {"status": "failed", "exit_code": 3, "error": "what went wrong"}
    assert failed(errors.RewardError("r")) == {"status": "failed", "exit_code": 1, "error": "r"}
    assert failed(errors.RewardNameError("n"))["exit_code"] == 2


@pytest.mark.parametrize("module", ["commands/train.py", "cli.py"])
def test_app_and_cli_keep_no_per_class_list(module):
    """They catch RlftError; only precheck names ConfigError, to put the sweep job's name in front of it."""
    tree = ast.parse((ROOT / "rlft" / module).read_text())
    named = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name != "precheck":
            for handler in (n for n in ast.walk(fn) if isinstance(n, ast.ExceptHandler) and n.type is not None):
                names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
                named |= {ast.unparse(n) for n in names}
    assert named & set(vars(errors)) <= {"RlftError"}
    assert "RlftError" in named


def test_no_import_circles():
    module_level, with_inner, counts, with_types = _import_stats().report(ROOT)
    assert module_level == []
    assert with_inner == []  # nor when the imports inside functions count
    assert with_types == []  # nor when the type-only ones do (two modules naming each other's types)
    # Most in-function imports existed to dodge circles; those left keep torch and transformers out of the
    # CLI's start (rlft.cli, rlft.commands.train, the rm, sft and check commands: 31 of them) or import optional
    # libraries.
    assert sum(counts.values()) < 69


def test_import_stats_finds_a_circle(tmp_path):
    pkg = tmp_path / "rlft"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from rlft.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from rlft.sub import y\n")
    (pkg / "sub" / "__init__.py").write_text("import rlft.a\n")
    module_level, with_inner, counts, with_types = _import_stats().report(tmp_path)
    assert module_level == []
    assert with_inner == [["rlft.a", "rlft.b", "rlft.sub"]]
    assert counts == {"rlft": 0, "rlft.a": 0, "rlft.b": 1, "rlft.sub": 0}


def test_import_stats_finds_a_circle_through_type_only_imports(tmp_path):
    pkg = tmp_path / "rlft"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from rlft.b import x\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlft.a import A\n")
    module_level, with_inner, _, with_types = _import_stats().report(tmp_path)
    assert module_level == [] and with_inner == []
    assert with_types == [["rlft.a", "rlft.b"]]


def test_cli_imports_neither_torch_nor_hydra_nor_transformers():
    code = ("import sys, rlft.cli\n"
            "print(sorted(m for m in ('torch', 'hydra', 'omegaconf', 'transformers', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
