"""Turn user-facing errors into one clear line on stderr and a non-zero exit."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import click

from lerobot_kit.core.errors import LerobotError


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except LerobotError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            click.echo(f"error: {line}", err=True)
        sys.exit(exc.exit_code)
