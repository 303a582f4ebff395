"""Every command's error boundary: one clear line on stderr (or one JSON object) and a documented exit code.

- A ``LerobotError`` (bad input, a damaged file, a machine problem) is its message,
  one line per problem, and its ``exit_code`` (1 problems, 2 usage).
- An ``OSError`` that no layer below turned into a ``LerobotError`` is the machine's
  answer about a file (a read-only or full disk, a permission): one line naming the
  path and the errno, exit code 1. A ``MemoryError`` is the machine's too: one line, exit 1.
- Anything else is a bug: one line saying so and how to report it, exit code 70,
  distinct from the user's problems.

``LEROBOT_KIT_DEBUG=1`` prints the full traceback, causes included, before the line.
Commands with ``--json`` print the error as ``{"ok": false, "error": ..., "problems": [...],
"exit_code": ...}`` on stdout instead, so a script always gets one JSON object.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Iterator

import click

from lerobot_kit.cli.process_exit import exit_without_teardown
from lerobot_kit.core.distributed.started import started_a_process_group
from lerobot_kit.core.errors import DEBUG_ENV, EXIT_INTERNAL, EXIT_PROBLEMS, LerobotError, first_line, os_error_line

REPORT = (
    "this is a bug in lerobot-kit or one of its plugins, not in your input: please report it with the command "
    f"you ran and the traceback that {DEBUG_ENV}=1 prints"
)


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def describe(exc: BaseException) -> tuple[list[str], int]:
    """The lines a user sees for ``exc`` (without the ``error: `` prefix), and the exit code."""
    if isinstance(exc, LerobotError):
        return str(exc).splitlines() or [type(exc).__name__], exc.exit_code
    if isinstance(exc, OSError):
        return [os_error_line(exc)], EXIT_PROBLEMS
    if isinstance(exc, MemoryError):
        return [
            "out of memory: the run asked for more memory than this machine could give; lower the sizes the "
            "flags set (--batch_size, the policy's widths, --dataset sizes, --num_workers)"
        ], EXIT_PROBLEMS
    return [f"internal error: {type(exc).__name__}: {first_line(exc)}; {REPORT}"], EXIT_INTERNAL


@contextlib.contextmanager
def command_errors(*, as_json: bool = False) -> Iterator[None]:
    """Around a command's body: what escapes becomes its lines (or JSON object) and exit code.

    click's own exceptions (usage errors, ``--help``'s exit) and ``SystemExit`` pass
    through: click prints and exits for them.

    A rank of a distributed run that ends in an error exits without the interpreter's
    teardown: collecting a DDP model at exit frees gloo's process group, whose destructor
    can wait forever for a thread that waits for the interpreter (seen after an error every
    rank agreed on). The line is printed and the streams flushed first.
    """
    try:
        yield
    except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
        raise
    except Exception as exc:  # noqa: BLE001 - the one place every escaped error is worded
        if debugging():
            traceback.print_exception(exc, file=sys.stderr)
        lines, code = describe(exc)
        if as_json:
            click.echo(json.dumps({"ok": False, "error": "\n".join(lines), "problems": lines, "exit_code": code}))
        else:
            for line in lines:
                click.echo(f"error: {line}", err=True)
        if started_a_process_group():
            exit_without_teardown(code, run_exit_handlers=False)
        sys.exit(code)
