"""``--parallelism.step_timeout_s``: a rank stuck in one step shows where, then exits.

A hung rank (a deadlocked data worker, a collective that one rank never joins, a driver
that stops answering) keeps the whole group waiting: the collective timeout only covers
collectives, and it says nothing about *where* the rank was. A thread of this module
checks how long the current step has run; past the limit it prints the rank, the step
and every thread's Python stack (``faulthandler``), then ends the process with
``STEP_TIMEOUT_EXIT_CODE`` — a non-zero exit, so torchrun restarts the group (or the
scheduler requeues the job) and the run continues from its last checkpoint.

The first step after a (re)start carries one-time work — DataLoader workers starting
and reading their first items, FSDP's lazy initialisation, ``torch.compile``, allocator
warm-up — so it gets ``FIRST_STEP_ALLOWANCE`` times the limit; it is timed all the same,
as a run that hangs before its first step ends (a deadlocked data worker) hangs the same
way as one that hangs later. The loop only stores a timestamp per step (no lock, no
syscall); the thread wakes a few times per timeout period, so a hang is reported at most
a tenth of the timeout late.
Waits that release the GIL — collectives, I/O, sleeps, data loading — are covered; code
that holds the GIL forever would also stop this thread.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

# GNU timeout(1)'s code for "the command timed out".
STEP_TIMEOUT_EXIT_CODE = 124
FIRST_STEP_ALLOWANCE = 10  # the first step's limit, in multiples of --parallelism.step_timeout_s


class StepWatchdog:
    def __init__(self, timeout_s: float, rank: int) -> None:
        self.timeout_s = timeout_s
        self.rank = rank
        self._step = 0
        self._started_at: float | None = None  # None: between steps (logging, saving)
        self._limit = timeout_s * FIRST_STEP_ALLOWANCE  # of the step under way: the first one's, at first
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lerobot-step-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def step_started(self, step: int) -> None:
        self._step = step
        self._started_at = time.monotonic()

    def step_finished(self) -> None:
        self._started_at = None
        self._limit = self.timeout_s

    def close(self) -> None:
        self._closed.set()
        self._thread.join()

    def _watch(self) -> None:
        period = min(1.0, max(0.05, self.timeout_s / 10))
        while not self._closed.wait(period):
            started, step, limit = self._started_at, self._step, self._limit
            if started is not None and time.monotonic() - started > limit:
                self._report_and_exit(step, time.monotonic() - started, limit)

    def _report_and_exit(self, step: int, elapsed: float, limit: float) -> None:
        sys.stderr.flush()
        allowed = f"--parallelism.step_timeout_s={self.timeout_s:g}"
        if limit != self.timeout_s:
            allowed = f"{limit:g} s, the first step's allowance ({FIRST_STEP_ALLOWANCE} x {allowed})"
        header = (
            f"rank {self.rank}: step {step} has run for {elapsed:.0f} s, longer than {allowed}; the stack of every "
            f"thread of this rank follows, then it exits with code {STEP_TIMEOUT_EXIT_CODE} so that the launcher "
            "can restart the group\n"
        )
        os.write(2, header.encode())
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(STEP_TIMEOUT_EXIT_CODE)
