"""Workers kept for the run (tool calls, episode.env environments) come from the worker server, not the trainer
(rlft.workers.server): they do not hold the trainer's memory, they outlive a stop signal sent to the trainer's
whole process group, they end when the trainer is killed, and they do not run the trainer's script again.
Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
linux = pytest.mark.skipif(sys.platform != "linux", reason="/proc and the kernel's parent-death signal are Linux's")


def _settle(pool, n: int) -> dict:
    for key in range(n):
        pool.submit(key, ((key,), {}))
    got: dict = {}
    while len(got) < n:
        got.update(pool.poll(None))
    return {k: v for k, (v, _) in got.items()}


@linux
def test_kept_workers_do_not_share_the_trainers_memory():
    from rlft.workers.pool import Pool
    from tests.tool_helpers import own_memory

    held = bytearray(400 * 2**20)  # the trainer's weights, activations, the data's answers
    held[::4096] = b"\1" * len(held[::4096])
    served, forked = Pool(own_memory, 2, 60.0), Pool(lambda x: own_memory(x), 2, 60.0)
    try:
        for got in _settle(served, 2).values():
            parent, rss = map(int, got.split())
            assert parent != os.getpid() and rss < 200, got  # forked by the server: ~15 MiB
        for got in _settle(forked, 2).values():  # a closure cannot be sent to the server: forked from here
            parent, rss = map(int, got.split())
            assert parent == os.getpid() and rss >= 400, got
    finally:
        served.close()
        forked.close()
    assert held[4096] == 1


# The trainer: a script without an `if __name__ == "__main__":` guard (a worker that ran it again would start
# another pool); "SIGTERM" is printed by its handler, which lets the step finish, as rlft's does.
TRAINER = """
import os, signal, sys, time
from rlft.workers.pool import Pool
from tests.tool_helpers import naps
print("started", os.getpid(), flush=True)
signal.signal(signal.SIGTERM, lambda *a: print("SIGTERM", flush=True))
pool = Pool(naps, 2, 30.0)
pool.submit(0, ((float(sys.argv[1]),), {}))
pool.submit(1, ((float(sys.argv[1]),), {}))
time.sleep(0.5)
print("workers", *pool.pids, *[w.process.pid for w in pool._workers.busy], flush=True)
got = {}
while len(got) < 2:
    got.update(pool.poll(None))
print("results", *[got[k][0] for k in (0, 1)], flush=True)
"""


def _trainer(seconds: float, tmp_path: Path, how: str = "path") -> tuple[subprocess.Popen, list[int]]:
    """The trainer run as a script file (``how`` path) or a module (``-m``): a worker's start would run either
    again (multiprocessing.spawn.prepare), where ``python -c`` leaves it nothing to run."""
    (tmp_path / "trainer_script.py").write_text(TRAINER)
    run = [str(tmp_path / "trainer_script.py")] if how == "path" else ["-m", "trainer_script"]
    proc = subprocess.Popen([sys.executable, *run, str(seconds)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().startswith("started")
    line = proc.stdout.readline()
    assert line.startswith("workers"), line + proc.stderr.read()
    return proc, [int(p) for p in line.split()[1:]]


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@linux
@pytest.mark.parametrize("how", ["path", "-m"])
def test_a_stop_signal_to_the_trainers_group_leaves_its_workers_to_finish_the_step(tmp_path, how):
    proc, workers = _trainer(2.0, tmp_path, how)
    try:
        assert len(workers) == 2
        server = int(open(f"/proc/{workers[0]}/stat").read().rsplit(")", 1)[1].split()[1])
        assert server != proc.pid and os.getpgid(server) != proc.pid  # out of the group, as the workers
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert out.split("\n")[:2] == ["SIGTERM", "results slept 2.0 slept 2.0"], out
    assert "started" not in out and "Traceback" not in err, (out, err)  # the script ran once, here


@linux
def test_the_server_and_its_workers_end_when_the_trainer_is_killed(tmp_path):
    proc, workers = _trainer(60.0, tmp_path)
    server = int(open(f"/proc/{workers[0]}/stat").read().rsplit(")", 1)[1].split()[1])
    proc.kill()
    proc.wait()
    deadline = time.time() + 10
    while any(map(_alive, [server, *workers])) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, [server, *workers]))


FRAGILE = """
import builtins, os, sys
builtins.rlft_test_ready = True  # what the trainer sets up before importing the tool's module
from rlft.workers.pool import Pool
from tests.fragile_tool import parent_pid
from tests.tool_helpers import answer
pool = Pool(parent_pid, 1, 30.0)
got = answer(pool, 0)
print(got == str(os.getpid()), got, flush=True)
"""


@linux
def test_a_server_that_cannot_start_leaves_the_workers_forked_from_the_trainer(tmp_path):
    """The tool's module raises when imported in a fresh interpreter (it needs what the trainer set up): the
    server dies as it starts, and the workers are forked from the trainer, as before the server, said once."""
    proc = subprocess.run([sys.executable, "-c", FRAGILE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("True"), (proc.stdout, proc.stderr[-3000:])
    assert proc.stderr.count("the worker server did not start (importing tests.fragile_tool there raised "
                             "RuntimeError: imported outside the program that set it up)") == 1, proc.stderr[-3000:]


class _Searcher:
    def __call__(self, q: str) -> str:
        return q


def test_what_the_server_cannot_import_is_run_by_workers_forked_here(monkeypatch):
    """The server's workers import by name what a worker runs: a closure, or anything pickling names the
    trainer's __main__ by (a callable instance of a class of the script, a bound method), gets forked workers."""
    import functools

    from rlft.workers import server as worker_server
    from tests.tool_helpers import multiply

    monkeypatch.setattr(_Searcher, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "_Searcher", _Searcher, raising=False)
    assert worker_server.start_method(functools.partial(multiply, b=2.0))[0].get_start_method() == "forkserver"
    assert worker_server.start_method(lambda x: x)[0].get_start_method() == "fork"
    for fn in (_Searcher(), functools.partial(multiply, {"tool": _Searcher()}), _Searcher().__call__):
        assert worker_server._globals(fn) >= {"__main__"}
        assert worker_server.start_method(fn)[0].get_start_method() == "fork", fn


LOGS = """
import sys
from pathlib import Path
from rlft.output.console import run_log
from rlft.workers.pool import Pool
from tests.tool_helpers import answer, logs
with run_log(Path(sys.argv[1])):
    pool = Pool(logs, 1, 30.0)
    got = answer(pool, "marker-7")
    pool.close()
print(got)
"""


def test_the_servers_workers_log_to_the_jobs_train_log(tmp_path):
    """A tool's records and warnings go to train.log, as they did from workers forked from the trainer (which
    inherited its handlers), and not to the console."""
    log = tmp_path / "train.log"
    proc = subprocess.run([sys.executable, "-c", LOGS, str(log)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "logged", proc.stderr[-3000:]
    text = log.read_text()
    assert "INFO a_tool: info marker-7" in text and "warned marker-7" in text, text
    assert "marker-7" not in proc.stdout + proc.stderr


STDIN_TRAINER = """
from rlft.workers.pool import Pool
from tests.tool_helpers import answer, multiply
pool = Pool(multiply, 1, 30.0)
got = answer(pool, 6, b=7.0)
print("result", got, flush=True)
"""


@pytest.mark.parametrize("how", ["stdin", "-c"])
def test_a_trainer_without_a_script_file_gets_its_tools_answers(how):
    """A trainer whose __main__ has no real file (``python - <<EOF``: ``<stdin>``; ``python -c``): a worker does not
    try to run the trainer's script again (it used to look for '<cwd>/<stdin>', and every call died)."""
    argv, stdin = ([sys.executable, "-"], STDIN_TRAINER) if how == "stdin" else ([sys.executable, "-c", STDIN_TRAINER], "")
    proc = subprocess.run(argv, input=stdin, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "result 42.0", (proc.stdout, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


RUN_TIME_STATE = """
import sys
from rlft.workers.pool import Pool
import tests.tool_helpers as helpers
helpers.STATE["db"] = "set by the program"  # after import: a fresh import does not see it
pool = Pool(helpers.reads_state, 1, 30.0, start=sys.argv[1])
got = helpers.answer(pool, 0)
print(got)
print(pool.started_from)
"""


@pytest.mark.parametrize("start", ["server", "fork"])
def test_what_the_program_set_at_run_time_is_seen_under_fork_only(start):
    """episode.worker_start=server: the workers import the tool's module afresh, so a value the program stored in it
    after import is not there, and the start-up line says so; fork: they see it, as before the server."""
    proc = subprocess.run([sys.executable, "-c", RUN_TIME_STATE, start], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen, said = proc.stdout.strip().split("\n")
    if start == "server":
        assert seen == "set at import"
        assert "worker server" in said and "tests.tool_helpers afresh" in said and "episode.worker_start=fork" in said
    else:
        assert seen == "set by the program"
        assert said == "forked from the trainer (episode.worker_start=fork)"


LOOSE_TOOL = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location(sys.argv[2], sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[sys.argv[2]] = module
spec.loader.exec_module(module)
from rlft.workers.pool import Pool
pool = Pool(module.parent_pid, 1, 30.0)  # not tests.tool_helpers.answer: this run's tests.tool_helpers is the loose file
pool.submit(0, ((0,), {}))
got = {}
while not got:
    got.update(pool.poll(None))
got = got[0][0]
print(got == str(os.getpid()), got, flush=True)
print(pool.started_from)
"""


@pytest.mark.parametrize("name", ["rlft_loose_tool", "tests.tool_helpers"])
def test_a_module_a_fresh_import_does_not_find_gets_forked_workers(tmp_path, name):
    """A tool's module loaded from a file with spec_from_file_location and put in sys.modules, under a name a fresh
    import finds nowhere or finds in another file: the server's workers could not import it (every call died, exit
    code 1); its workers are forked from the trainer, said once."""
    source = tmp_path / "loose.py"
    source.write_text("import os\n\ndef parent_pid(x: int) -> str:\n    return str(os.getppid())\n")
    proc = subprocess.run([sys.executable, "-c", LOOSE_TOOL, str(source), name], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    forked, said = proc.stdout.strip().split("\n")
    assert forked.startswith("True"), proc.stdout + proc.stderr[-3000:]
    assert said.startswith(f"forked from the trainer (module {name} "), said
    assert proc.stderr.count(f"module {name} ") == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_a_module_found_afresh_is_found_where_it_was_loaded():
    import tests.tool_helpers  # noqa: F401
    from rlft.workers.server import not_fresh

    assert not_fresh("tests.tool_helpers") is None and not_fresh("rlft.workers.in_worker") is None
    assert not_fresh("os") is None and not_fresh("math") is None and not_fresh("json.decoder") is None


KILLED = """
import multiprocessing, os, time
from rlft.workers.pool import Pool
from tests.tool_helpers import answer, multiply
pool = Pool(multiply, 1, 30.0)
answer(pool, 6)
print(multiprocessing.util.get_temp_dir(), flush=True)
time.sleep(60)
"""


@linux
def test_a_killed_trainers_multiprocessing_folder_goes_at_the_next_start():
    """kill -9 of the trainer leaves multiprocessing's folder (the server's socket) behind: it is named after the
    trainer's pid (multiprocessing's own pymp-* names no owner), and the next trainer's start removes it, and only
    the folders of trainers that are gone."""
    import shutil
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="rlft-t-", dir="/tmp"))  # short: the server's socket lies under it
    try:
        _killed_trainer_folder(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _killed_trainer_folder(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-c", KILLED], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    folder = Path(first.stdout.readline().strip())
    assert folder.parent == tmp_path and folder.name.startswith(f"rlft-mp-{first.pid}-")
    first.kill()
    first.wait()
    assert folder.is_dir()  # left behind
    alive = tmp_path / f"rlft-mp-{os.getpid()}-kept"
    alive.mkdir()
    second = subprocess.run([sys.executable, "-c", STDIN_TRAINER], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert second.stdout.strip() == "result 42.0", second.stderr[-3000:]
    assert not folder.exists() and alive.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [alive.name]  # the second one's went at its exit


def test_a_killed_trainers_sandbox_cgroups_go_at_the_next_start():
    """The python tool's cgroups of a trainer killed with kill -9 (its pid is in their names) are removed when the
    next trainer's sandbox settles where its cgroups go; those of a live trainer stay."""
    from rlft.tools import cgroup

    cgroup.parents.cache_clear()
    found = cgroup.parents()
    if found is None:
        pytest.skip("no cgroup can be made here")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = [d / f"rlft-sandbox-{int(gone.stdout)}-0-deadbeef" for d in found[1]]
    live = [d / f"rlft-sandbox-{os.getpid()}-999-cafe" for d in found[1]]
    try:
        for c in stale + live:
            c.mkdir()
        cgroup.parents.cache_clear()
        assert cgroup.parents() == found
        assert not any(c.exists() for c in stale) and all(c.is_dir() for c in live)
    finally:
        for c in stale + live:
            if c.exists():
                c.rmdir()
        cgroup.parents.cache_clear()


DEEPER = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("rlft_loose_helper", sys.argv[1])
helper = importlib.util.module_from_spec(spec)
sys.modules["rlft_loose_helper"] = helper
spec.loader.exec_module(helper)
import tool_over_loose
from rlft.workers.pool import Pool
from tests.tool_helpers import answer
pool = Pool(tool_over_loose.parent_pid, 1, 30.0)
got = answer(pool, 0)
print(got == str(os.getpid()), got, flush=True)
"""


def test_a_tool_module_that_imports_what_a_fresh_import_cannot_find_gets_forked_workers(tmp_path):
    """The tool's module is found afresh, but it imports a module the trainer loaded from a file under a name no
    import finds: the server cannot import it (multiprocessing's preload skipped the ImportError, and every worker
    died); the server stops, saying what it could not import, and the workers are forked from the trainer."""
    (tmp_path / "helper.py").write_text("import os\n")
    (tmp_path / "tool_over_loose.py").write_text(
        "import rlft_loose_helper\n\ndef parent_pid(x: int) -> str:\n    return str(rlft_loose_helper.os.getppid())\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, "-c", DEEPER, str(tmp_path / "helper.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("True"), (proc.stdout, proc.stderr[-3000:])
    assert proc.stderr.count("the worker server did not start (importing tool_over_loose there raised "
                             "ModuleNotFoundError: No module named 'rlft_loose_helper')") == 1, proc.stderr[-3000:]


TWO_POOLS = """
import os
from rlft.workers import server as worker_server
from rlft.workers.pool import Pool
from tests.tool_helpers import answer, parent_pid
print("started", flush=True)  # a worker that ran this script again would print it again

def ask(pool):
    return answer(pool, 0)

a, b = Pool(parent_pid, 1, 30.0), Pool(parent_pid, 1, 30.0)
first = ask(a), ask(b)
a.close()
worker_server.stop()  # b's worker still lives: the server stays
print("kept", ask(b) == first[1], flush=True)
b.close()
worker_server.stop()  # nobody left: the server goes
print("stopped", not os.path.exists(f"/proc/{first[1]}") or open(f"/proc/{first[1]}/stat").read().split()[2] == "Z")
c = Pool(parent_pid, 1, 30.0)  # a new job's pool starts a server set up anew
print("new", ask(c) not in (str(os.getpid()), first[1]), ask(a) == ask(c), flush=True)  # a's next worker: same server
"""


@linux
def test_stopping_the_server_spares_a_pool_still_open_and_a_later_pool_starts_a_new_one(tmp_path):
    """The end of one job's episodes stops the server only once no worker of it lives (a pool of the program's
    still open keeps it); a pool that starts a worker afterwards gets a server set up as the first was: out of the
    trainer's group, with the trainer's main module named, so the script is not run again."""
    (tmp_path / "two_pools.py").write_text(TWO_POOLS)
    proc = subprocess.run([sys.executable, str(tmp_path / "two_pools.py")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:4] == ["started", "kept True", "stopped True", "new True True"], proc.stdout
