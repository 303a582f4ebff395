"""User-facing errors.

Anything raised as a ``LerobotError`` is a problem with the user's input or files, not a
bug: the CLI prints its message as one line (or a few, one per problem) and exits
non-zero, never with a traceback.
"""

from __future__ import annotations


class LerobotError(Exception):
    """A problem the user can fix; ``str(err)`` says what is wrong and how to fix it."""

    exit_code = 1


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message: enough to say what failed in one line."""
    lines = str(exc).strip().splitlines()
    return lines[0][:limit] if lines else type(exc).__name__


class ConfigError(LerobotError):
    """Bad flags or config file (click's usage-error exit code)."""

    exit_code = 2


class PluginError(LerobotError):
    """A plugin failed to import, or two plugins registered the same name."""


class CheckpointError(LerobotError):
    """A checkpoint is missing, incomplete, corrupt or of an incompatible layout."""
