"""Log lines and a terminal progress bar for the main process.

Only the main process prints; the bar is drawn only when stdout is a
terminal, so logs captured by CI or a cluster scheduler stay clean line-by-line text.
"""

from __future__ import annotations

import sys
import time


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class Progress:
    """A one-line bar with ETA on a TTY; silent otherwise and off the main process."""

    def __init__(self, total: int, start: int, enabled: bool) -> None:
        self.total = total
        self.start = start
        self.enabled = enabled and sys.stdout.isatty()
        self.began = time.perf_counter()

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.began
        fraction = done / self.total
        rate = (done - self.start) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else 0.0
        width = 30
        filled = int(width * fraction)
        bar = "█" * filled + "·" * (width - filled)
        sys.stdout.write(f"\r{bar} {done}/{self.total} [{format_duration(elapsed)}<{format_duration(eta)}]")
        sys.stdout.flush()

    def clear(self) -> None:
        if self.enabled:
            sys.stdout.write("\r\033[K")
            sys.stdout.flush()

    def eta(self, done: int) -> str:
        elapsed = time.perf_counter() - self.began
        rate = (done - self.start) / elapsed if elapsed > 0 else 0.0
        return format_duration((self.total - done) / rate) if rate > 0 else "?"
