"""The output folder's lock (``core.run.output_lock``) on real files and real processes:
when a holder counts as gone, that of several runs finding one stale lock exactly one
takes it, the heartbeat, and that a refused or failed start leaves the folder as it was.
``lerobot train`` around it is tested in ``tests/integration/test_output_lock.py``."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from lerobot_kit.core.run.output_lock import (
    LOCK_FILE,
    STALE_AFTER_S,
    Claimant,
    OutputLock,
    OutputLockedError,
    read_holder,
    why_stale,
)

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier, Event

ME = Claimant.current(restarting=False)


def plant(folder: Path, age_s: float = 0.0, **fields: object) -> Path:
    """A lock as another run left it: this process's record with ``fields`` changed, ``age_s`` old."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    path.write_text(json.dumps({**json.loads(ME.record()), **fields}))
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def judged(path: Path, me: Claimant = ME) -> str | None:
    holder = read_holder(path)
    assert holder is not None
    return why_stale(holder, me)


def test_a_holder_on_this_host_is_gone_when_its_process_is_dead_or_a_zombie(tmp_path):
    live = subprocess.Popen(["sleep", "60"])
    try:
        assert judged(plant(tmp_path / "live", pid=live.pid)) is None
    finally:
        live.kill()
        live.wait()
    assert judged(plant(tmp_path / "dead", pid=live.pid)) == f"its process {live.pid} is gone"

    unreaped = subprocess.Popen(["true"])
    stat = Path(f"/proc/{unreaped.pid}/stat")
    deadline = time.monotonic() + 30
    while stat.read_text().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert judged(plant(tmp_path / "zombie", pid=unreaped.pid)) == f"its process {unreaped.pid} is gone"
    finally:
        unreaped.wait()


def test_a_holder_elsewhere_is_judged_by_its_heartbeat_alone(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    # A dead pid means nothing on another host, or in another pid namespace of this one.
    assert judged(plant(tmp_path / "a", pid=dead.pid, host="node-17")) is None
    assert judged(plant(tmp_path / "b", pid=dead.pid, pid_space="other-boot/pid:[1]")) is None
    assert judged(plant(tmp_path / "c", age_s=STALE_AFTER_S + 30, host="node-17")) == (
        f"its heartbeat is {STALE_AFTER_S + 30:.0f} s old (more than {STALE_AFTER_S:.0f} s)")
    # Unreadable (killed while writing it): only its age tells.
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / LOCK_FILE).write_bytes(b"")
    assert judged(tmp_path / "d" / LOCK_FILE) is None


def test_an_earlier_attempt_of_the_same_torchrun_launch_is_gone_but_not_a_slurm_requeues(tmp_path):
    launch = {"TORCHELASTIC_RUN_ID": "3f2a", "SLURM_JOB_ID": "881"}
    before = json.loads(Claimant.current(False, {**launch, "TORCHELASTIC_RESTART_COUNT": "0"}).record())
    path = plant(tmp_path, **{**before, "host": "node-17"})
    restarted = Claimant.current(True, {**launch, "TORCHELASTIC_RESTART_COUNT": "1"})
    assert judged(path, restarted) == "it was attempt 0 of this torchrun launch, which torchrun stopped before restarting it"
    # A requeued job runs a new torchrun; the old job's processes may still be running.
    requeued = Claimant.current(True, {**launch, "TORCHELASTIC_RESTART_COUNT": "1", "SLURM_RESTART_COUNT": "1"})
    assert judged(path, requeued) is None
    # torchrun's default rendezvous id is the same for every launch: it identifies none.
    default = {"TORCHELASTIC_RUN_ID": "none"}
    path = plant(tmp_path, **{**json.loads(Claimant.current(False, default).record()), "host": "node-17"})
    assert judged(path, Claimant.current(True, {**default, "TORCHELASTIC_RESTART_COUNT": "1"})) is None


def test_a_refused_start_changes_nothing_and_a_released_one_leaves_no_folder_it_made(tmp_path):
    live = subprocess.Popen(["sleep", "60"])
    try:
        path = plant(tmp_path / "held", pid=live.pid, started="2026-11-30T08:00:00+00:00")
        before = path.read_bytes(), path.stat().st_mtime_ns, sorted(os.listdir(path.parent))
        with pytest.raises(OutputLockedError) as refused:
            OutputLock(ME).acquire(path.parent)
        assert f"(host {ME.host}, pid {live.pid}, started 2026-11-30T08:00:00+00:00; " in str(refused.value)
        assert (path.read_bytes(), path.stat().st_mtime_ns, sorted(os.listdir(path.parent))) == before
    finally:
        live.kill()
        live.wait()

    (tmp_path / "new").mkdir()
    lock = OutputLock(ME)
    lock.acquire(tmp_path / "new" / "2026-12-01" / "run")
    assert json.loads((tmp_path / "new/2026-12-01/run" / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    lock.release()  # idempotent
    assert os.listdir(tmp_path / "new") == []  # the folders it made, left empty, are gone; "new" stays


def test_the_heartbeat_refreshes_the_lock_and_reports_one_taken_from_it(tmp_path):
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("lerobot_kit")
    logger.addHandler(handler)
    lock = OutputLock(ME, heartbeat_s=0.05)
    try:
        lock.acquire(tmp_path)
        path = tmp_path / LOCK_FILE
        os.utime(path, (0, 0))
        deadline = time.monotonic() + 30
        while path.stat().st_mtime < time.time() - 60:
            assert time.monotonic() < deadline, "the heartbeat never refreshed the lock"
            time.sleep(0.01)
        path.write_text(json.dumps({"host": "node-17", "pid": 4242, "started": "2026-12-01T10:00:00+00:00"}))
        while not lines:
            assert time.monotonic() < deadline, "the lost lock was never reported"
            time.sleep(0.01)
        assert lines == [(f"error: the lock {path} of this run was taken over by host node-17, pid 4242, started "
                          "2026-12-01T10:00:00+00:00: another run may now write this folder too")]
        lock.release()
        assert path.exists()  # not ours any more: left to its holder
    finally:
        lock.release()
        logger.removeHandler(handler)


def _contend(folder: str, start: Barrier, results: Queue, done: Event) -> None:
    lock = OutputLock(Claimant.current(restarting=False))
    start.wait()
    try:
        lock.acquire(Path(folder))
    except OutputLockedError as exc:
        results.put((os.getpid(), str(exc)))
        return
    results.put((os.getpid(), None))
    done.wait(60)
    lock.release()


@pytest.mark.parametrize("round_", range(3))
def test_of_several_runs_finding_one_stale_lock_exactly_one_takes_it(tmp_path, round_):
    path = plant(tmp_path, age_s=STALE_AFTER_S + 60, host="node-17", pid=4242)
    context = multiprocessing.get_context("fork")
    start, results, done = context.Barrier(6), context.Queue(), context.Event()
    procs = [context.Process(target=_contend, args=(str(tmp_path), start, results, done)) for _ in range(6)]
    for proc in procs:
        proc.start()
    try:
        outcomes = dict(results.get(timeout=60) for _ in procs)
        winners = [pid for pid, refusal in outcomes.items() if refusal is None]
        assert len(winners) == 1, outcomes
        assert json.loads(path.read_text())["pid"] == winners[0]
        assert all(f"pid {winners[0]}," in refusal for refusal in outcomes.values() if refusal is not None)
        assert not (tmp_path / (LOCK_FILE + ".takeover")).exists()
    finally:
        done.set()
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
    assert not path.exists()
