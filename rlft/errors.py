"""Every exception class of rlft, in one module that imports nothing of rlft.

An error the user can act on is an :class:`RlftError`: ``rlft`` prints it as one line
(``rlft: error: ...``, no traceback), records it in the job's ``job.json``, and exits with its
class's ``exit_code`` (docs/guide/runs.md, "Exit codes"). The others at the end are signals between
rlft's own parts, never shown as they are.
"""

from __future__ import annotations

import signal
import sys


class RlftError(Exception):
    """A problem the user can act on; the message is the whole story, on one line."""

    exit_code: int = 2


# Exit 2: the user's config, data, model or checkpoint.


class ConfigError(RlftError, ValueError):
    """A user-facing configuration problem; the CLI prints it on one line and exits 2."""


class DataError(RlftError, ValueError):
    """A problem with the user's data; the message names the file and line."""


class ModelError(RlftError, RuntimeError):
    """The model cannot be found or loaded; the message says what to install or set."""


class CheckpointError(RlftError, ValueError):
    """A checkpoint that cannot be used; the CLI prints it on one line."""


# Exit 1: the user's reward function or environment; a weight sync that did not reach the sampler.


class RewardError(RlftError, RuntimeError):
    """A reward function failed; the message names the function and the sample."""

    exit_code = 1


class EnvError(RlftError, RuntimeError):
    """An environment (``episode.env``) raised or answered with something that is not a Step."""

    exit_code = 1


class SyncError(RlftError, RuntimeError):
    """After a weight sync the sampler's log-probs of a fixed probe differ from the learner's beyond the
    tolerance (rlft.sync.verify): the message gives the mismatch, the tolerance and the sync mode."""

    exit_code = 1


class EnvOvertime(BaseException):
    """Raised by SIGALRM inside an environment call past ``episode.env_timeout_s`` (rlft.episodes.lockstep turns
    it into an EnvError); a BaseException, so that the user's ``except Exception`` lets it by."""


class RewardNameError(RewardError, ConfigError):
    """An entry of ``reward.fns`` names nothing callable: a mistake in the config (exit 2), not in the function."""

    exit_code = 2


# Internal: how a call of user code ended (rlft.workers.user_calls -> rlft.rewards.functions, which words them as a RewardError,
# and rlft.tools.outcomes, which words them for the policy).


class CallTimeout(Exception):
    """Call ``index`` did not return within the time limit."""

    def __init__(self, index: int):
        super().__init__(index)
        self.index = index


class CallFailed(Exception):
    """Call ``index`` raised ``error`` (in this process or a worker)."""

    def __init__(self, index: int, error: BaseException):
        super().__init__(index, error)
        self.index, self.error = index, error


class CallDied(Exception):
    """The worker process running call ``index`` ended without a result (``exitcode``: as
    ``multiprocessing.Process.exitcode``, ``-N`` for signal N)."""

    def __init__(self, index: int, exitcode: int | None):
        super().__init__(index, exitcode)
        self.index, self.exitcode = index, exitcode

    @property
    def how(self) -> str:
        """What ended the worker, in words."""
        return how_it_ended(self.exitcode)


def how_it_ended(exitcode: int | None) -> str:
    """A process's end in words, from its exit code as ``multiprocessing`` and torch's launcher report
    it (``-N``: killed by signal N): "killed by SIGKILL", "exited with code 7"."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class Described(Exception):
    """An exception that could not cross from a worker, told by its type's name and message."""

    def __init__(self, name: str, message: str):
        super().__init__(name, message)
        self.name, self.message = name, message

    def rebuilt(self) -> Exception:
        """An exception of a class by that name with that message (the caller words it as ``Type: message``)."""
        return type(self.name, (Exception,), {})(self.message)


# Internal: a built-in tool stopped at its time limit (rlft.tools.builtin -> rlft.tools.outcomes, which tells the policy).


class ToolTimeout(Exception):
    """A built-in tool stopped its work at the time limit; the message says so for the policy."""


# Internal: rlft.tools.format's reader (a value json reads but a tool call may not hold becomes an Error: message).


class RefusedValue(ValueError):
    """A value json reads but a call may not hold (4301 digits, NaN, a key twice); the message says why, for the policy."""


# Internal: rlft.rewards.countdown's parser (a completion that is no arithmetic scores 0).


class UnsafeExpression(ValueError):
    """Not an arithmetic expression of integers, + - * / and parentheses."""


def fail(message: str, code: int = 2) -> int:
    """Print ``message`` as rlft's one error line; returns ``code`` (the exit code)."""
    print(f"rlft: error: {message}", file=sys.stderr)
    return code
