"""The output folder's lock (``core.run.output.lock``) on real files and real processes:
when a holder counts as gone (never while its process lives on this host), that of
several runs finding one stale lock exactly one takes it, the heartbeat, that a refused
or failed start leaves the folder as it was, that anything but a regular file at the
lock's or the takeover marker's path is one line at once, and that every wait says what
it waits for. Claims that could hang run in a child process under a 10 s timeout.
``lerobot train`` around it is tested in ``tests/integration/test_output_lock.py``."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from lerobot_kit.core.run.output.lock import (
    ABANDONED_TAKEOVER_S,
    LOCK_FILE,
    STALE_AFTER_S,
    TAKEOVER_SUFFIX,
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
    """A lock as another run left it: this process's record with ``fields`` changed (and no
    process start time unless given), ``age_s`` old."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    path.write_text(json.dumps({**json.loads(ME.record()), "pid_start_ticks": None, **fields}))
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
        replacement = tmp_path / "replacement"  # whole at once: the heartbeat never reads it half-written
        replacement.write_text(json.dumps({"host": "node-17", "pid": 4242, "started": "2026-12-01T10:00:00+00:00"}))
        os.replace(replacement, path)
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


def test_a_live_holder_on_this_host_keeps_its_lock_however_old_its_heartbeat_unless_its_pid_was_reused(tmp_path):
    live = subprocess.Popen(["sleep", "60"])
    try:
        ticks = int(Path(f"/proc/{live.pid}/stat").read_text().rpartition(")")[2].split()[19])
        an_hour = STALE_AFTER_S + 3600
        assert judged(plant(tmp_path / "old", age_s=an_hour, pid=live.pid, pid_start_ticks=ticks)) is None
        live.send_signal(signal.SIGSTOP)  # a debugger, a swapped-out node: no heartbeat, still the holder
        assert judged(plant(tmp_path / "stopped", age_s=an_hour, pid=live.pid, pid_start_ticks=ticks)) is None
        # The pid now names another process than the one that took the lock.
        assert judged(plant(tmp_path / "reused", pid=live.pid, pid_start_ticks=ticks - 1)) == (
            f"its process {live.pid} is gone")
    finally:
        live.kill()
        live.wait()


# Claims the lock of argv[1] as a fresh start ("fresh") or a --resume=auto rerun ("rerun"),
# as user argv[3] if given (once imported: that user may not read root's interpreter), its
# log lines on stderr; prints the outcome and how long the claim took as JSON.
CLAIM = """
import json, logging, os, pwd, sys, time
from pathlib import Path
from lerobot_kit.core.run.output.lock import Claimant, LockPathError, OutputLock, OutputLockedError
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
if len(sys.argv) > 3:
    user = pwd.getpwnam(sys.argv[3])
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
lock = OutputLock(Claimant.current(restarting=False, rerun=sys.argv[2] == "rerun"))
started = time.monotonic()
try:
    lock.acquire(Path(sys.argv[1]))
    outcome = {"held": True}
except (LockPathError, OutputLockedError) as exc:
    outcome = {"held": False, "error": type(exc).__name__, "line": str(exc)}
print(json.dumps({**outcome, "seconds": time.monotonic() - started, "cpu_s": time.process_time()}), flush=True)
lock.release()
"""


def claim(folder: Path, mode: str = "fresh", *user: str) -> dict[str, object]:
    """One claim in a child process, within 10 s (a claim that hangs or spins fails the test)."""
    result = subprocess.run([sys.executable, "-c", CLAIM, str(folder), mode, *user], capture_output=True, text=True,
                            timeout=10)
    assert result.returncode == 0, result.stderr
    return {**json.loads(result.stdout), "log": result.stderr.splitlines()}


def make_fifo(path: Path) -> None:
    os.mkfifo(path)


def make_dir(path: Path) -> None:
    path.mkdir()


def make_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))


def dangling_link(path: Path) -> None:
    path.symlink_to(path.parent / "gone")


def looping_link(path: Path) -> None:
    path.symlink_to(path.name)


def link_to_a_lock(path: Path) -> None:
    real = path.parent / "elsewhere.lock"
    real.write_text(ME.record().decode())
    path.symlink_to(real)


NOT_A_FILE = {
    "a directory": (make_dir, "a directory", "rm -r"),
    "a named pipe": (make_fifo, "a named pipe (FIFO)", "rm"),
    "a socket": (make_socket, "a socket", "rm"),
    "a dangling link": (dangling_link, "a symbolic link to {folder}/gone, which does not exist", "rm"),
    "a looping link": (looping_link, "a symbolic link to {name}, which loops", "rm"),
    "a link to a lock": (link_to_a_lock, "a symbolic link to {folder}/elsewhere.lock", "rm"),
}


@pytest.mark.parametrize("role", ["lock", "takeover marker"])
@pytest.mark.parametrize("kind", list(NOT_A_FILE))
def test_a_lock_path_that_is_not_a_regular_file_is_one_line_at_once(tmp_path, kind, role):
    """Before: a named pipe blocked the claim in open() forever, a dangling link spun a core
    (O_EXCL finds it, reading finds nothing), a directory or a looping link was a raw OSError."""
    make, what, remove = NOT_A_FILE[kind]
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / (LOCK_FILE if role == "lock" else LOCK_FILE + TAKEOVER_SUFFIX)
    make(path)
    if role == "takeover marker":  # a stale lock to take over, behind the marker
        plant(folder, age_s=STALE_AFTER_S + 60, host="node-17")
    outcome = claim(folder)
    assert outcome["held"] is False and outcome["error"] == "LockPathError", outcome
    owner = "lock" if role == "lock" else "lock's takeover marker"
    assert outcome["line"] == (
        f"the {owner} of --output_dir={folder}, {path}, is {what.format(folder=folder, name=path.name)}, not a file "
        f"a run wrote, so no run can hold the folder while it is there: remove it ({remove} {path}), then start "
        "the run again. Nothing was written"), outcome
    assert outcome["seconds"] < 1 and outcome["log"] == [], outcome
    assert path.is_symlink() or path.exists()  # left as it was found


@pytest.fixture
def public_folder() -> Iterator[Path]:
    """A folder every user may enter (the test's temporary folders are root's alone), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="lock-rules-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_a_lock_this_user_may_not_read_is_one_line(public_folder):
    """As user nobody (the tests run as root, who reads anything)."""
    path = plant(public_folder, host="node-17")
    path.chmod(0o600)
    outcome = claim(public_folder, "fresh", "nobody")
    assert outcome["held"] is False and outcome["error"] == "LockPathError", outcome
    assert outcome["line"] == (
        f"the lock of --output_dir={public_folder}, {path}, is a file this user may not read (Permission denied, "
        "errno EACCES), not a file a run wrote, so no run can hold the folder while it is there: if another "
        f"user's run holds the folder, pass another --output_dir; otherwise remove it (rm {path}) or let this user "
        "read it, then start the run again. Nothing was written"), outcome
    assert outcome["seconds"] < 1


def test_a_stale_lock_behind_a_fresh_takeover_marker_says_what_it_waits_for_and_is_taken_once_it_is_abandoned(
        tmp_path):
    lock = plant(tmp_path, age_s=STALE_AFTER_S + 60, host="node-17", pid=4242)
    marker = tmp_path / (LOCK_FILE + TAKEOVER_SUFFIX)
    marker.touch()
    child = subprocess.Popen([sys.executable, "-c", CLAIM, str(tmp_path), "fresh"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stderr is not None
        line = child.stderr.readline().strip()  # blocks until the line; the timeout below bounds the test
        assert line.startswith(
            f"the lock {lock} is stale (its heartbeat is {STALE_AFTER_S + 60:.0f} s old (more than "
            f"{STALE_AFTER_S:.0f} s)), and another run is taking it over ({marker} is "), line
        assert line.endswith(f"s old); waiting up to {ABANDONED_TAKEOVER_S:.0f} s for it to finish, after which the "
                             "marker counts as left by a run killed mid-takeover and is removed"), line
        assert child.poll() is None  # it waits
        long_ago = time.time() - ABANDONED_TAKEOVER_S - 10
        os.utime(marker, (long_ago, long_ago))  # its taker was killed mid-takeover
        out, err = child.communicate(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert json.loads(out)["held"] is True, err
    assert "took over the lock" in err and not marker.exists()


def test_a_rerun_waits_for_a_holder_it_cannot_check_and_says_so_but_not_for_a_live_one_here(tmp_path):
    """``--resume=auto``: a restarted Kubernetes pod meets its killed predecessor's lock from
    another pid namespace, whose heartbeat alone can show it is gone."""
    live = subprocess.Popen(["sleep", "60"])
    try:
        plant(tmp_path / "here", pid=live.pid)
        refused = claim(tmp_path / "here", "rerun")
        assert refused["error"] == "OutputLockedError" and refused["seconds"] < 1, refused
    finally:
        live.kill()
        live.wait()

    lock = plant(tmp_path / "pod", pid_space="other-boot/pid:[4026532]", pid=7)
    child = subprocess.Popen([sys.executable, "-c", CLAIM, str(lock.parent), "rerun"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stderr is not None
        line = child.stderr.readline().strip()
        assert line == (f"--resume=auto: {lock.parent} is locked by host {ME.host}, pid 7, started "
                        f"{json.loads(lock.read_text())['started']}; waiting up to {STALE_AFTER_S:.0f} s for that run "
                        "to end or its heartbeat to stop"), line
        long_ago = time.time() - STALE_AFTER_S - 10
        os.utime(lock, (long_ago, long_ago))  # the predecessor's heartbeat stopped two minutes ago
        out, err = child.communicate(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert json.loads(out)["held"] is True, err


def test_a_lock_being_written_says_what_it_waits_for(tmp_path):
    path = tmp_path / LOCK_FILE
    path.write_bytes(b"")  # created 4 s ago, its record not written yet: its writer was killed
    four_s_ago = time.time() - 4
    os.utime(path, (four_s_ago, four_s_ago))
    outcome = claim(tmp_path)
    assert outcome["error"] == "OutputLockedError", outcome
    [line] = outcome["log"]
    assert re.fullmatch(rf"the lock {re.escape(str(path))} is being written by the run that created it; waiting "
                        r"up to [01] s for its holder's record", line), line
