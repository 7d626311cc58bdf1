"""Reward functions used by the tests (importable as tests.helpers:NAME). CLI subprocesses and reward
workers import this module: it imports nothing at its top (no pytest; what other tests share is in
tests/support.py)."""


def char_count(prompt: str, completion: str, answer: str, **info) -> float:
    """Varies across random completions, so advantages (and gradients) are non-zero."""
    return len(completion) / 10.0


def char_count_batched(prompts, completions, answer, **kwargs) -> list[float]:
    """char_count in TRL's batched signature (checks the columns arrive as per-completion lists)."""
    assert len(prompts) == len(completions) == len(answer) == len(kwargs["num_tokens"]) == len(kwargs["truncated"])
    return [len(c) / 10.0 for c in completions]


def trl_style_length_penalty(completions, **kwargs) -> list[float]:
    """A TRL reward as users write them: only ``completions`` named, the rest in kwargs."""
    return [-0.01 * n for n in kwargs["num_tokens"]]


def batched_wrong_length(prompts, completions, **kwargs) -> list[float]:
    return [0.0]


def batched_none(prompts, completions, **kwargs) -> list:
    return [None] * len(completions)


def batched_nan(prompts, completions, **kwargs) -> list:
    return [float("nan")] * len(completions)


_calls = 0


def char_count_failing(prompt: str, completion: str, answer: str, **info) -> float:
    """char_count, but raises on every call after the first $RLFT_TEST_FAIL_AFTER (a failure at a chosen phase)."""
    import os

    global _calls
    _calls += 1
    limit = os.environ.get("RLFT_TEST_FAIL_AFTER")
    if limit and _calls > int(limit):
        raise RuntimeError("injected failure")
    return len(completion) / 10.0


def answer_is_even(prompt: str, completion: str, answer: str, **info) -> float:
    """Ignores the completion: evaluation's accuracy and pass@k must all equal the share of even answers."""
    return float(int(answer) % 2 == 0)


def char_count_on_even(prompt: str, completion: str, answer: str, **info) -> float:
    """char_count on problems with an even answer, 0 on the others: half the groups carry no signal,
    so dynamic sampling needs a varying number of rounds to fill a batch.

    On the data-parallel rank $RLFT_TEST_KILL_RANK, after $RLFT_TEST_KILL_AFTER calls, the process
    kills itself with SIGKILL (a rank lost mid-step, as ``kill -9`` or a dead node leaves it); with
    $RLFT_TEST_HANG_MARK set it touches that file and hangs instead (a rank that stops answering)."""
    import os
    import signal
    import time
    from pathlib import Path

    global _calls
    _calls += 1
    after = os.environ.get("RLFT_TEST_KILL_AFTER")
    if after and os.environ.get("RANK") == os.environ.get("RLFT_TEST_KILL_RANK") and _calls > int(after):
        if os.environ.get("RLFT_TEST_HANG_MARK"):
            Path(os.environ["RLFT_TEST_HANG_MARK"]).touch()
            time.sleep(3600)
        os.kill(os.getpid(), signal.SIGKILL)
    return len(completion) / 10.0 if int(answer) % 2 == 0 else 0.0


def raise_always(prompt: str, completion: str, answer: str, **info) -> float:
    """A reward function with a bug: every call raises."""
    raise ValueError("a bug in the user's reward")


def sleeps_on_first(prompt: str, completion: str, answer: str, **info) -> float:
    """Hangs (sleeps 60 s) on samples whose answer is "0" (set by the tests); fast on the others."""
    import time

    if answer == "0":
        time.sleep(60)
    return 1.0


def hangs_on_odd_length(prompt: str, completion: str, answer: str, **info) -> float:
    """Hangs (sleeps 60 s) on completions of odd length; scores the others by their length."""
    import time

    if len(completion) % 2:
        time.sleep(60)
    return len(completion) / 10.0


def hangs(prompt: str, completion: str, answer: str, **info) -> float:
    """A reward that never returns in time."""
    import time

    time.sleep(60)
    return 0.0


def hangs_batched(prompts, completions, **kwargs) -> list[float]:
    """A batched reward that never returns in time."""
    import time

    time.sleep(60)
    return [0.0] * len(completions)


def level_reward(prompt: str, completion: str, answer: str, **info) -> float:
    """Reads the data columns ``level`` and ``source`` (data=hf/jsonl columns arrive as keyword arguments)."""
    assert isinstance(info["source"], str)
    return float(info["level"]) + len(completion) / 100.0


def level_reward_batched(prompts, completions, level, source, **kwargs) -> list[float]:
    """level_reward in TRL's batched signature: each column arrives as a list, one entry per completion."""
    assert len(level) == len(source) == len(completions) and all(isinstance(s, str) for s in source)
    return [float(lv) + len(c) / 100.0 for lv, c in zip(level, completions)]


def none_on_odd_length(prompt: str, completion: str, answer: str, **info):
    """No score (None) for completions of an odd number of characters: some samples of a group are unscored."""
    return None if len(completion) % 2 else len(completion) / 10.0


def none_on_level_2(prompts, completions, level, **kwargs) -> list:
    """Batched: None for rows whose ``level`` column is 2 (whole groups unscored), else the character count."""
    return [None if lv == 2 else len(c) / 10.0 for lv, c in zip(level, completions)]


def exits_on_first(prompt: str, completion: str, answer: str, **info) -> float:
    """Calls sys.exit(3) on samples whose answer is "0" (on every sample with $RLFT_TEST_DIE_ALWAYS); scores 1
    on the others."""
    import os
    import sys

    if answer == "0" or os.environ.get("RLFT_TEST_DIE_ALWAYS"):
        sys.exit(3)
    return 1.0


def kills_worker_on_first(prompt: str, completion: str, answer: str, **info) -> float:
    """Ends its own process on samples whose answer is "0" (on every sample with $RLFT_TEST_DIE_ALWAYS):
    os._exit(7), or SIGKILL when $RLFT_TEST_SIGKILL is set (the OOM killer's way); scores 1 on the others."""
    import os
    import signal

    if answer == "0" or os.environ.get("RLFT_TEST_DIE_ALWAYS"):
        if os.environ.get("RLFT_TEST_SIGKILL"):
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(7)
    return 1.0


def hangs_marked(prompt: str, completion: str, answer: str, **info) -> float:
    """Touches $RLFT_TEST_MARK (the reward has started), then never returns."""
    import os
    import time
    from pathlib import Path

    Path(os.environ["RLFT_TEST_MARK"]).touch()
    time.sleep(3600)
    return 0.0


def chatty(prompt: str, completion: str, answer: str, **info) -> float:
    """Scores 0 and, like a library it might call, warns and logs on the way (once per process:
    the warnings module shows a warning once per place). Attributed to its caller (stacklevel 2,
    rlft's reward code), as a library's would be to the library: not to the user's module."""
    import logging
    import warnings

    warnings.warn("chatty_library is deprecated", FutureWarning, stacklevel=2)
    logging.getLogger("chatty_library").warning("chatty_library says hello", stacklevel=2)
    return 0.0


def one(prompt: str, completion: str, answer: str, **info) -> float:
    """The same score for every completion (its weight sets the value): no group carries signal."""
    return 1.0


class GradeError(Exception):
    """An exception whose ``__init__`` takes other arguments than its message: it pickles, but cannot be
    rebuilt from its pickle (common in grading code)."""

    def __init__(self, sample: str, why: str):
        super().__init__(f"{sample}: {why}")


def raises_grade_error(prompt: str, completion: str, answer: str, **info) -> float:
    """Raises GradeError on every call."""
    raise GradeError(prompt, "no answer found")


def cuts_its_reply(prompt: str, completion: str, answer: str, **info) -> float:
    """Starts a long reply to the trainer on its worker's pipe and dies mid-message (as a worker killed
    while sending a large result)."""
    import os
    import struct
    import sys

    conn = sys._getframe(1).f_locals["conn"]  # the worker loop's end of the pipe (rlft.workers.in_worker)
    conn._send(struct.pack("!i", 1 << 20) + b"x" * 100)
    os._exit(5)


def fails_first_two(prompt: str, completion: str, answer: str, **info) -> float:
    """Sample "0" raises after 1 s, sample "1" at once; the others score 1."""
    import time

    if answer == "0":
        time.sleep(1.0)
        raise ValueError("sample 0 fails, slowly")
    if answer == "1":
        raise ValueError("sample 1 fails, at once")
    return 1.0


def records_pid_then_sleeps(prompt: str, completion: str, answer: str, **info) -> float:
    """Writes its process id into the folder $RLFT_TEST_PIDS, then sleeps $RLFT_TEST_SLEEP seconds (60 by
    default) the first time it runs in a process; scores 1."""
    import os
    import time
    from pathlib import Path

    mark = Path(os.environ["RLFT_TEST_PIDS"]) / str(os.getpid())
    if not mark.exists():
        mark.touch()
        time.sleep(float(os.environ.get("RLFT_TEST_SLEEP", "60")))
    return 1.0
