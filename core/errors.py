"""User-facing errors and the exit codes every command shares.

Anything raised as a ``LerobotError`` is a problem with the user's input, files or
machine, not a bug: the CLI prints its message as one line (or a few, one per problem)
and exits with its ``exit_code``, never with a traceback. Anything else that escapes a
command is a bug in lerobot-kit (or a plugin): it exits with ``EXIT_INTERNAL`` and says
how to report it. ``LEROBOT_KIT_DEBUG=1`` prints the full traceback of either.
"""

from __future__ import annotations

import errno

EXIT_PROBLEMS = 1  # a LerobotError: a missing or damaged file, a failed run, problems found
EXIT_USAGE = 2  # a ConfigError: bad flags or config (click's usage-error code)
EXIT_INTERNAL = 70  # a bug (BSD sysexits' EX_SOFTWARE): not the user's input
EXIT_STOPPED = 75  # stopped by a signal with a checkpoint to resume from (EX_TEMPFAIL: requeue)
DEBUG_ENV = "LEROBOT_KIT_DEBUG"


class LerobotError(Exception):
    """A problem the user can fix; ``str(err)`` says what is wrong and how to fix it."""

    exit_code = EXIT_PROBLEMS


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message: enough to say what failed in one line."""
    lines = str(exc).strip().splitlines()
    return lines[0][:limit] if lines else type(exc).__name__


def os_error_line(exc: OSError) -> str:
    """``<path>: <what the system said> (errno <NAME>)``: the file, and what to look up."""
    code = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else None
    what = exc.strerror or first_line(exc)
    where = f"{exc.filename}: " if exc.filename is not None else ""
    if exc.filename2 is not None:
        where = f"{exc.filename} -> {exc.filename2}: "
    return f"{where}{what}" + (f" (errno {code})" if code else "")


class ConfigError(LerobotError):
    """Bad flags or config file (click's usage-error exit code)."""

    exit_code = EXIT_USAGE


class PluginError(LerobotError):
    """A plugin failed to import, or two plugins registered the same name."""


class CheckpointError(LerobotError):
    """A checkpoint is missing, incomplete, corrupt or of an incompatible layout."""
