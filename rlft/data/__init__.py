"""Tasks (generated or file-based), chat templating, and Hugging Face data sets."""

from rlft.data.build import build_task
from rlft.data.tasks import Problem, Task
from rlft.errors import DataError

__all__ = ["DataError", "Problem", "Task", "build_task"]
