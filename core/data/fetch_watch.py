"""The one DataLoader wait its ``timeout`` does not bound: taking over a batch's shared memory.

DataLoader's ``timeout`` limits the wait for a worker's message, not what follows it. A
message whose tensors live in shared memory carries file descriptors, and the main
process (or its pinning thread, on CUDA) fetches each from the worker that sent it, over
a connection one of that worker's threads answers. A worker stopped after sending
(SIGSTOP, a debugger, a frozen cgroup) or stuck holding the GIL never answers, and the
read waits for ever. The watch bounds the whole fetch: one that lasts
``--parallelism.timeout_s`` kills the workers, which ends the read with an error the
loader reports as a stuck worker.
"""

from __future__ import annotations

import os
import signal
import threading
import time


class FetchWatch:
    """A daemon thread that kills ``worker_pids`` once a fetch outlasts ``timeout_s``.

    It counts the time it was awake to see, each look adding at most two periods: a whole
    job stopped and continued (a SLURM suspension, ``kill -STOP``) did not wait on its
    workers for as long as the clock moved, and its fetch must not be taken for a stuck one.
    """

    def __init__(self, timeout_s: float, worker_pids: list[int]) -> None:
        self.timeout_s = timeout_s
        self.fired = False  # the workers were killed because a fetch outlasted the timeout
        self._worker_pids = worker_pids
        self._fetches = 0
        self._current: int | None = None  # the fetch under way, by number
        self._stopped = threading.Event()
        threading.Thread(target=self._watch, name="lerobot-kit-fetch-watch", daemon=True).start()

    def begin(self) -> None:
        self._fetches += 1
        self._current = self._fetches

    def end(self) -> None:
        self._current = None

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        period = min(1.0, self.timeout_s / 10)
        watched, waited, looked = None, 0.0, time.monotonic()
        while not self._stopped.wait(period):
            now = time.monotonic()
            step, looked = min(now - looked, 2 * period), now
            current = self._current
            waited = waited + step if current is not None and current == watched else 0.0
            watched = current
            if waited > self.timeout_s:
                self.fired = True
                for pid in self._worker_pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return
