"""Tasks (generated or file-based) and chat templating."""

from rlft.data.tasks import DataError, Problem, Task, build_task

__all__ = ["DataError", "Problem", "Task", "build_task"]
