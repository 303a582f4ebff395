"""The loader's fetch watch, with real processes standing for DataLoader workers."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from lerobot_kit.core.data.fetch_watch import FetchWatch


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "120"])
    yield process
    process.kill()
    process.wait()


def test_a_fetch_that_outlasts_the_timeout_kills_the_workers(worker):
    watch = FetchWatch(1, [worker.pid])
    watch.begin()
    started = time.monotonic()
    assert worker.wait(timeout=10) == -signal.SIGKILL
    assert 1 <= time.monotonic() - started < 4
    assert watch.fired


def test_fetches_that_each_end_in_time_never_fire_however_long_they_add_up_to(worker):
    watch = FetchWatch(1, [worker.pid])
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        watch.begin()
        time.sleep(0.1)
        watch.end()
    watch.stop()
    assert worker.poll() is None and not watch.fired


WATCHED_PROCESS = """
import sys, time
from lerobot_kit.core.data.fetch_watch import FetchWatch
watch = FetchWatch(2, [int(sys.argv[1])])
watch.begin()
time.sleep(0.5)  # the watch has seen this fetch under way
print("fetching", flush=True)
sys.stdin.readline()  # continued: the fetch ends a moment later
time.sleep(0.3)
watch.end()
time.sleep(0.5)
print("fired" if watch.fired else "not fired", flush=True)
"""


def test_a_process_stopped_mid_fetch_and_continued_is_not_taken_for_a_stuck_one(worker):
    """A SLURM suspension stops the whole job, watch and workers together: the clock moves,
    nobody waits."""
    watched = subprocess.Popen([sys.executable, "-c", WATCHED_PROCESS, str(worker.pid)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert watched.stdout.readline() == "fetching\n"
        watched.send_signal(signal.SIGSTOP)
        time.sleep(3)
        watched.send_signal(signal.SIGCONT)
        watched.stdin.write("\n")
        watched.stdin.flush()
        assert watched.stdout.readline() == "not fired\n"
        assert worker.poll() is None
    finally:
        watched.kill()
        watched.wait()
