"""Reward functions used by the tests (importable as tests.helpers:NAME)."""


def char_count(prompt: str, completion: str, answer: str, **info) -> float:
    """Varies across random completions, so advantages (and gradients) are non-zero."""
    return len(completion) / 10.0
