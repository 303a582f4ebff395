"""One writer per output folder: the lock a training run holds on its ``--output_dir``.

Two runs on one folder at once (a double submit, a SLURM requeue while the old job still
runs) would both write step folders under the same names and both exit 0, leaving one
run's weights beside the other's records. So the main process of ``lerobot train``
creates ``<output_dir>/.lerobot-kit.lock`` once the folder is chosen, before it reads the
folder's checkpoints or writes anything, and removes it when the run ends however it
ends (``kill -9`` aside); the other ranks are part of its run and hold nothing.
``lerobot plan`` and ``inspect-checkpoint`` neither take nor read it.

The file is created with ``O_CREAT | O_EXCL``, which is atomic on local file systems and
on NFS (v3 and later), unlike ``flock``, which some network file systems ignore or
refuse. It holds a JSON record of its holder (host, pid, start time) and a random token
that makes each record unique; its modification time is the holder's heartbeat,
refreshed by a thread every ``HEARTBEAT_S`` seconds.

A lock is stale, and is taken over, when its holder is gone: its process is dead on this
host (same host name and pid namespace), or its heartbeat is older than
``STALE_AFTER_S`` (a holder on another host, whose pid means nothing here), or it was an
earlier attempt of this same torchrun launch, which torchrun stops before it starts the
next. A restart (torchrun, a SLURM requeue) that meets a live lock waits up to
``STALE_AFTER_S`` for it to go stale, since a predecessor that died on another host keeps
a fresh heartbeat for that long; a fresh start is refused at once. Taking over is
serialised by a second file, ``.lerobot-kit.lock.takeover``, also made with ``O_EXCL``:
of several runs that found the same stale lock, one removes it, and the new lock is
then created with ``O_EXCL`` again, so exactly one of them wins.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lerobot_kit.core.distributed.launcher import env_int
from lerobot_kit.core.errors import LerobotError, os_error_line

LOCK_FILE = ".lerobot-kit.lock"
TAKEOVER_SUFFIX = ".takeover"
HEARTBEAT_S = 15.0
STALE_AFTER_S = 120.0
# A takeover takes milliseconds: a marker this old was left by a process killed in one.
ABANDONED_TAKEOVER_S = STALE_AFTER_S
# A lock file is written right after it is created: one this young and unreadable is being written.
BEING_WRITTEN_S = 5.0
POLL_S = 1.0

logger = logging.getLogger("lerobot_kit")


class OutputLockedError(LerobotError):
    """Another live run holds the output folder (exit code 1: nothing was written)."""


@dataclass(frozen=True)
class Claimant:
    """Who asks for the lock: this process, and which launch and attempt of the run it is."""

    host: str
    pid_space: str  # boot id and pid namespace: a pid is only meaningful within the same one
    pid: int
    launch: str | None  # one torchrun launch (rendezvous id, SLURM job and requeue), else None
    attempt: int  # torchrun's restart count within that launch
    restarting: bool  # a restart of the run by its launcher (torchrun or SLURM)

    @classmethod
    def current(cls, restarting: bool, env: Mapping[str, str] = os.environ) -> Claimant:
        launch = _torchrun_launch(env)
        attempt = env_int(env, "TORCHELASTIC_RESTART_COUNT", 0) if launch is not None else 0
        return cls(socket.gethostname(), _pid_space(), os.getpid(), launch, attempt, restarting)

    def record(self) -> bytes:
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        return json.dumps({
            "host": self.host, "pid": self.pid, "started": started, "pid_space": self.pid_space,
            "torchrun_launch": self.launch, "torchrun_attempt": self.attempt, "token": uuid.uuid4().hex,
        }, indent=1).encode()


def _torchrun_launch(env: Mapping[str, str]) -> str | None:
    """What every attempt of one torchrun launch shares and no other launch does.

    torchrun's rendezvous id (a fresh uuid with ``--standalone``; ``none`` by default
    otherwise, which identifies nothing), with the SLURM job and requeue count: a SLURM
    requeue starts a new torchrun whose earlier processes torchrun did not stop.
    """
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id in ("", "none"):
        return None
    return f"{run_id}/slurm-{env.get('SLURM_JOB_ID', '-')}.{env.get('SLURM_RESTART_COUNT', '0')}"


def _pid_space() -> str:
    """This boot's id and this process's pid namespace (Linux); empty elsewhere, where
    holders are judged by their heartbeat alone."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


@dataclass(frozen=True)
class Holder:
    """A lock file as found: its bytes, its holder's record (None if unreadable) and heartbeat age."""

    raw: bytes
    record: dict[str, object] | None
    age_s: float

    @property
    def pid(self) -> int | None:
        pid = (self.record or {}).get("pid")
        return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None

    def field(self, name: str) -> object:
        return (self.record or {}).get(name)

    def describe(self) -> str:
        if self.record is None:
            return "a holder whose lock file is unreadable (being written, or damaged)"
        return f"host {self.field('host')}, pid {self.field('pid')}, started {self.field('started')}"


def read_holder(path: Path) -> Holder | None:
    """The lock at ``path``, or None when there is none."""
    try:
        with open(path, "rb") as file:
            raw = file.read()
            mtime = os.fstat(file.fileno()).st_mtime
    except FileNotFoundError:
        return None
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):  # being written, damaged, or not JSON at all
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("host"), str):
        record = None
    return Holder(raw, record, time.time() - mtime)


def why_stale(holder: Holder, me: Claimant) -> str | None:
    """Why ``holder``'s run is over, or None while it may still be running."""
    pid = holder.pid
    same_pids = bool(me.pid_space) and holder.field("host") == me.host and holder.field("pid_space") == me.pid_space
    # A pid equal to ours was a process before us: this one holds no lock yet.
    if pid is not None and same_pids and (pid == me.pid or not _alive(pid)):
        return f"its process {pid} is gone"
    attempt = holder.field("torchrun_attempt")
    if (me.launch is not None and holder.field("torchrun_launch") == me.launch and isinstance(attempt, int)
            and attempt < me.attempt):
        return f"it was attempt {attempt} of this torchrun launch, which torchrun stopped before restarting it"
    if holder.age_s > STALE_AFTER_S:
        return f"its heartbeat is {holder.age_s:.0f} s old (more than {STALE_AFTER_S:.0f} s)"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A killed process its parent has not reaped yet: exists, but runs nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


class OutputLock:
    """The lock of one run on its output folder; ``acquire`` once, ``release`` always (idempotent)."""

    def __init__(self, claimant: Claimant, heartbeat_s: float = HEARTBEAT_S) -> None:
        self._me = claimant
        self._heartbeat_s = heartbeat_s
        self._path: Path | None = None
        self._raw = b""
        self._created: list[Path] = []
        self._heartbeat: _Heartbeat | None = None

    @property
    def path(self) -> Path | None:
        return self._path

    def acquire(self, output_dir: Path) -> None:
        """Hold ``output_dir`` (created if missing) or raise ``OutputLockedError`` naming its holder."""
        assert self._path is None, "the lock is already held"
        path = output_dir / LOCK_FILE
        self._created = _make_dirs(output_dir)
        raw = self._me.record()
        try:
            self._wait_for(path, raw)
        except BaseException:
            self._remove_created()
            raise
        self._path, self._raw = path, raw
        self._heartbeat = _Heartbeat(path, raw, self._heartbeat_s)
        self._heartbeat.start()

    def _wait_for(self, path: Path, raw: bytes) -> None:
        """Create the lock, taking over stale ones; a restart waits for a live holder to go stale."""
        deadline = time.monotonic() + (STALE_AFTER_S if self._me.restarting else 0.0)
        announced = False
        while not _create(path, raw):
            holder = read_holder(path)
            if holder is None:  # released between our attempt and our look
                continue
            if holder.record is None and holder.age_s < BEING_WRITTEN_S:  # look again once it is written
                time.sleep(0.05)
                continue
            stale = why_stale(holder, self._me)
            if stale is not None:
                if _remove_stale(path, holder):
                    logger.info(f"took over the lock {path} of a run that is over ({holder.describe()}): {stale}")
                continue
            if time.monotonic() >= deadline:
                raise OutputLockedError(_refusal(path, holder))
            if not announced:
                logger.info(f"restart: {path.parent} is locked by {holder.describe()}; waiting up to "
                            f"{STALE_AFTER_S:.0f} s for that run to end or its heartbeat to stop")
                announced = True
            time.sleep(POLL_S)

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still ours; folders it created and left empty go too."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if self._path is not None:
            holder = read_holder(self._path)
            if holder is not None and holder.raw == self._raw:
                try:
                    self._path.unlink(missing_ok=True)
                except OSError as exc:  # a read-only remount: the run's own line stays the one error
                    logger.warning(f"warning: the lock {self._path} is not removed ({os_error_line(exc)}); "
                                   "a later run takes it over, as its holder is gone")
            self._path = None
        self._remove_created()

    def _remove_created(self) -> None:
        """A run that wrote nothing leaves no folder behind (deepest first; any with content stays)."""
        for folder in reversed(self._created):
            try:
                folder.rmdir()
            except OSError:
                break
        self._created = []


def _make_dirs(output_dir: Path) -> list[Path]:
    """Create ``output_dir`` and its missing parents; the ones created, outermost first."""
    missing = []
    folder = output_dir.absolute()
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    output_dir.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


def _create(path: Path, raw: bytes) -> bool:
    """Create the lock holding ``raw``; False when one exists. Durable before it counts."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except FileNotFoundError:  # a refused run removed the empty folder it had created: make it again
        path.parent.mkdir(parents=True, exist_ok=True)
        return _create(path, raw)
    try:
        os.write(fd, raw)
        os.fsync(fd)
    except OSError:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return True


def _remove_stale(path: Path, holder: Holder) -> bool:
    """Remove the lock ``holder`` was read from, unless another contender got there first.

    Only the process that created the takeover marker may remove a stale lock, and only
    while the lock is still the one it judged stale; everyone then races on ``O_EXCL``.
    """
    marker = path.with_name(path.name + TAKEOVER_SUFFIX)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        _clear_abandoned(marker)
        time.sleep(0.05)
        return False
    os.close(fd)
    try:
        current = read_holder(path)
        if current is None or current.raw != holder.raw:
            return False
        path.unlink(missing_ok=True)
        return True
    finally:
        marker.unlink(missing_ok=True)


def _clear_abandoned(marker: Path) -> None:
    try:
        if time.time() - marker.stat().st_mtime > ABANDONED_TAKEOVER_S:
            marker.unlink(missing_ok=True)
    except FileNotFoundError:
        pass


def _refusal(path: Path, holder: Holder) -> str:
    return (
        f"--output_dir={path.parent} is in use by another run ({holder.describe()}; its lock {path} was refreshed "
        f"{max(holder.age_s, 0.0):.0f} s ago), and two runs writing one folder would mix their checkpoints: "
        "wait for that run to end, or pass another --output_dir; if that run is dead, remove the lock file "
        f"(a lock is taken over by itself once its process is gone on this host or its heartbeat is "
        f"{STALE_AFTER_S:.0f} s old). Nothing was written"
    )


class _Heartbeat(threading.Thread):
    """Touches the lock every few seconds while the run lives; says so if the lock was taken from it."""

    def __init__(self, path: Path, raw: bytes, every_s: float) -> None:
        super().__init__(name="lerobot-kit-output-lock", daemon=True)
        self._path, self._raw, self._every_s = path, raw, every_s
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self._every_s) and self._beat():
            pass

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=5)

    def _beat(self) -> bool:
        try:
            holder = read_holder(self._path)
            if holder is None or holder.raw != self._raw:
                taker = "removed" if holder is None else f"taken over by {holder.describe()}"
                logger.error(f"error: the lock {self._path} of this run was {taker}: another run may now write "
                             "this folder too")
                return False
            os.utime(self._path)
        except OSError as exc:  # a passing file-system error: the next beat tries again
            logger.warning(f"warning: could not refresh the lock {self._path}: {exc}")
        return True
