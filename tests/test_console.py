"""The console shows rlft's own lines; other libraries' records, warnings, progress bars and C++
prints go to the run's train.log (real runs in subprocesses, real logging and file descriptors)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import warnings

import pytest

from rlft.config.validation import vllm_available
from tests.support import ROOT, TINY

# Every line rlft prints on stdout in a run (rich's progress bar included).
RLFT_LINE = re.compile(r"(converting the SmolLM2 GGUF file to .* \(first run only\)|run dir .* \| algo |"
                       r"learner on |reward: |evaluation skipped: |step +\d+ |stopped after step \d+; |done: final checkpoint |"
                       r"train .*\d+/\d+ )")


def _train(args: list[str], tmp_path, **env: str) -> subprocess.CompletedProcess:
    # A wide console: rich wraps a long line at 80 columns when it is not a terminal.
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="250", **env)
    full_env.pop("RANK", None)
    return subprocess.run([sys.executable, "-m", "rlft", "train", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=600)


def _not_rlft(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.strip() and not RLFT_LINE.match(line)]


CHATTY = ["reward.fns=[math_correct,tests.helpers:chatty]", "reward.weights=[1,1]"]


@pytest.mark.slow
def test_a_first_tiny_run_shows_only_rlft_lines(tmp_path):
    """On a new machine (empty caches) too: the SmolLM2 conversion is one line of rlft's, not a
    progress bar. A reward's library that warns and logs goes to train.log."""
    run = tmp_path / "run"
    args = [*TINY, *CHATTY, "logger.console=true", f"hydra.run.dir={run}"]
    r = _train(args, tmp_path, RLFT_CACHE=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr == "" and _not_rlft(r.stdout) == [], r.stdout + r.stderr
    assert "(first run only)" in r.stdout.splitlines()[0] and "done: final checkpoint" in r.stdout
    assert (tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct" / "config.json").is_file()
    log = (run / "train.log").read_text()
    assert "Converting and de-quantizing" not in log
    assert "FutureWarning: chatty_library is deprecated" in log and "chatty_library says hello" in log


@pytest.mark.slow  # a CLI run (~10 s); the default console's test stays in make test
def test_logger_verbose_shows_the_libraries_output_too(tmp_path):
    run = tmp_path / "run"
    r = _train([*TINY, *CHATTY, "trainer.steps=1", "logger.verbose=true", f"hydra.run.dir={run}"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    for line in ("FutureWarning: chatty_library is deprecated", "chatty_library says hello"):
        assert line in r.stderr and line in (run / "train.log").read_text()


@pytest.mark.slow  # a vLLM engine start: about a minute on 2 shared cores
@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
def test_a_vllm_run_with_a_failing_reward_shows_rlft_lines_and_one_error(tmp_path):
    """vLLM's records (Triton, FutureWarnings, its engine's C++ NUMA warning, the weight-loading bar)
    go to train.log; the reward's error is the one line on stderr. Step 1 scores its 8 samples, the
    9th call raises: the weight sync after a step is covered too."""
    run = tmp_path / "run"
    args = [o for o in TINY if not o.startswith("sampler=")] + [
        "sampler=vllm", "sampler.vllm.kv_cache_gb=0.25", "sampler.vllm.max_model_len=256", "data.num_eval=0",
        "reward.fns=[tests.helpers:char_count_failing]", "logger.console=true", f"hydra.run.dir={run}"]
    r = _train(args, tmp_path, RLFT_TEST_FAIL_AFTER="8")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1 and "injected failure" in err[0], r.stdout + r.stderr
    assert _not_rlft(r.stdout) == [] and "step    1 " in r.stdout, r.stdout
    log = (run / "train.log").read_text()
    assert "vllm" in log and "FutureWarning" in log and "step    1 " in log


@pytest.mark.parametrize("bad, message", [
    (["trainer.num_prompts=4"], "trainer.num_prompts=4 must be a multiple of the 3 ranks"),
    (["trainer.num_prompts=3", "reward.fns=[tests.helpers:no_such_reward]"], "has no attribute 'no_such_reward'"),
])
def test_a_config_error_of_a_job_on_ranks_is_one_line_before_any_rank_starts(tmp_path, bad, message):
    """Each of the 3 ranks would print it, then torch's launcher its warnings."""
    r = _train([*TINY, "trainer.nproc=3", *bad, f"hydra.run.dir={tmp_path}"], tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("rlft: error: ") and message in lines[0], \
        r.stderr
    assert r.stdout == "" and json.loads((tmp_path / "job.json").read_text())["exit_code"] == 2


def test_the_launcher_of_ranks_runs_no_user_code(tmp_path):
    """trainer.nproc's launcher only waits for its ranks: the pre-flight check that imports the user's reward
    module (and transformers) runs in a child of its own (rlft.parallel.preflight), not in the launcher."""
    (tmp_path / "pid_reward.py").write_text(
        "import os\nopen(os.path.join(os.path.dirname(__file__), 'importers'), 'a').write(f'{os.getpid()}\\n')\n"
        "def score(completion, answer=None, **kw):\n    return 0.0\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    env.pop("RANK", None)
    proc = subprocess.Popen([sys.executable, "-m", "rlft", "train", *TINY, "trainer.nproc=3", "trainer.num_prompts=4",
                             "reward.fns=[pid_reward:score]", f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2 and "trainer.num_prompts=4 must be a multiple of the 3 ranks" in err, err
    importers = (tmp_path / "importers").read_text().split()
    assert len(importers) == 1 and int(importers[0]) != proc.pid  # the check imported it, in its own process


@pytest.fixture
def third_party():
    """A library's logger with its own console handler, as torch's and transformers' have."""
    lib = logging.getLogger("somelib")
    lib.propagate = False
    yield lib
    lib.handlers.clear()
    lib.propagate = True


@pytest.mark.parametrize("verbose", [False, True])
def test_run_log_sends_library_output_to_train_log(tmp_path, capfd, third_party, verbose):
    from rlft.output.console import quiet, run_log

    third_party.addHandler(logging.StreamHandler(sys.stderr))  # the stream capfd reads
    log = tmp_path / "train.log"
    with run_log(log, verbose=verbose):
        third_party.warning("a library's warning")
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").error("failed (exitcode: 2)")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a deprecation", FutureWarning, stacklevel=1)
        third_party.error("a library's failure")
        with quiet("a C++ library"):
            os.write(2, b"[W utils.cpp:68] Warning: NUMA binding\n")
    third_party.warning("after the job")
    out, err = capfd.readouterr()
    text = log.read_text()
    assert text.count("a library's failure") == 1, text
    for line in ("a library's warning", "failed (exitcode: 2)", "FutureWarning: a deprecation", "a library's failure"):
        assert line in text
    assert ("NUMA binding" in text) != verbose  # verbose leaves what C++ prints on the console
    assert "after the job" not in text and "after the job" in err  # the library's own handler is back
    assert "a library's failure" in err  # a failure shows, once
    assert err.count("a library's failure") == 1 and out == ""
    shown = ("a library's warning" in err, "a deprecation" in err, "NUMA" in err, "exitcode" in err)
    assert shown == ((True, True, True, False) if verbose else (False, False, False, False)), err


def test_warnings_of_the_users_reward_module_still_show(tmp_path, capfd, monkeypatch, third_party):
    """A warning the user must act on: one raised or logged by their own reward module shows on the
    console (and in train.log); a library's warning in the same job goes to train.log only."""
    from rlft.output.console import run_log

    (tmp_path / "my_rewards_mod.py").write_text(
        "import logging, warnings\n"
        "def score(prompt, completion, answer, **info):\n"
        "    warnings.warn('my threshold is ignored', UserWarning, stacklevel=1)\n"
        "    logging.getLogger('my_rewards_mod').warning('answer column missing')\n"
        "    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_rewards_mod

    third_party.addHandler(logging.StreamHandler(sys.stderr))
    log = tmp_path / "train.log"
    with run_log(log, reward_fns=["math_correct", "my_rewards_mod:score"]), warnings.catch_warnings():
        warnings.simplefilter("always")
        my_rewards_mod.score("p", "c", "a")
        third_party.warning("a library's warning")
    out, err = capfd.readouterr()
    text = log.read_text()
    for line in ("my threshold is ignored", "answer column missing", "a library's warning"):
        assert line in text, text
    assert err.count("UserWarning: my threshold is ignored") == 1 and err.count("answer column missing") == 1, err
    assert "a library's warning" not in err and out == ""


def test_a_crash_while_a_library_starts_is_reported_on_the_console(tmp_path):
    """While quiet() sends file descriptors 1 and 2 to train.log, a segfault's report still reaches
    the console's stderr (Python's fault handler), not only train.log."""
    code = ("import ctypes, pathlib\nfrom rlft.output.console import run_log, quiet\n"
            f"with run_log(pathlib.Path({str(tmp_path / 'train.log')!r})):\n"
            "    with quiet('a C++ library'):\n"
            "        ctypes.string_at(0)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode != 0
    assert "Fatal Python error: Segmentation fault" in r.stderr, r.stderr


def test_transformers_warnings_reach_train_log_in_a_job(tmp_path, capfd):
    """A training job keeps transformers' warnings (its library logger was set to errors only, so
    they reached neither train.log nor, with logger.verbose, the console)."""
    import transformers

    from rlft.models.loading import quiet_libraries
    from rlft.output.console import run_log

    log = tmp_path / "train.log"
    try:
        with run_log(log):
            quiet_libraries(keep_warnings=True)  # what train() does
            transformers.utils.logging.get_logger("transformers.modeling_utils").warning("weights not initialized")
    finally:
        quiet_libraries()
    assert "weights not initialized" in log.read_text()
    assert "weights not initialized" not in capfd.readouterr().err
