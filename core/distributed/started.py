"""Whether this process has started a process group: asked at exit, without importing torch."""

from __future__ import annotations

_started = False


def mark_started() -> None:
    global _started
    _started = True


def started_a_process_group() -> bool:
    return _started
