"""Tasks (generated or file-based), chat templating, and Hugging Face data sets."""

from rlft.data.tasks import DataError, Problem, Task, build_task

__all__ = ["DataError", "Problem", "Task", "build_task"]
