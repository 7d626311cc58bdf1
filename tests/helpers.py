"""Reward functions used by the tests (importable as tests.helpers:NAME)."""


def char_count(prompt: str, completion: str, answer: str, **info) -> float:
    """Varies across random completions, so advantages (and gradients) are non-zero."""
    return len(completion) / 10.0


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
