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
host (same host name and pid namespace; a pid since reused by another process counts as
dead, told apart by its start time), or it was an earlier attempt of this same torchrun
launch, which torchrun stops before it starts the next, or, for a holder whose process
cannot be checked from here (another host, another pid namespace), its heartbeat is older
than ``STALE_AFTER_S``. A holder whose process is alive on this host is never taken
over, however old its heartbeat: a run stopped by SIGSTOP, a debugger or a swapped-out
node stops beating, and would otherwise wake to find a second run writing its step
folders. A restart (torchrun, a SLURM requeue) that meets a live lock waits up to
``STALE_AFTER_S`` for it to go stale, since a predecessor that died on another host keeps
a fresh heartbeat for that long; so does a ``--resume=auto`` start (a scheduler's rerun,
a restarted Kubernetes pod, whose new pid namespace cannot see its predecessor's pid)
when the holder cannot be checked from here; any other start is refused at once. Taking
over is serialised by a second file, ``.lerobot-kit.lock.takeover``, also made with
``O_EXCL``: of several runs that found the same stale lock, one removes it, and the new
lock is then created with ``O_EXCL`` again, so exactly one of them wins.

Both files are regular files that a run wrote; anything else at their paths (a
directory, a named pipe, a symbolic link, a file this user cannot read) ends the start
at once with one line naming it and the fix: opening a named pipe would block forever,
and a dangling link reads as "no lock" while ``O_EXCL`` still finds it, which would spin.
Every wait says once what it waits for and for how long.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import shlex
import socket
import stat
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lerobot_kit.core.distributed.launcher import env_int
from lerobot_kit.core.errors import LerobotError, os_error_line
from lerobot_kit.core.layout.no_space import is_no_space, no_space_line

LOCK_FILE = ".lerobot-kit.lock"
TAKEOVER_SUFFIX = ".takeover"
HEARTBEAT_S = 15.0
STALE_AFTER_S = 120.0
# A takeover takes milliseconds: a marker this old was left by a process killed in one.
ABANDONED_TAKEOVER_S = STALE_AFTER_S
# A lock file is written right after it is created: one this young and unreadable is being written.
BEING_WRITTEN_S = 5.0
POLL_S = 1.0
# A holder's record is a few hundred bytes; more than this is not a record.
MAX_RECORD_BYTES = 1 << 16

logger = logging.getLogger("lerobot_kit")


class OutputLockedError(LerobotError):
    """Another live run holds the output folder (exit code 1: nothing was written)."""


class LockWriteError(LerobotError):
    """The disk refused room for the lock or its folder (exit code 1: nothing was written)."""

    @classmethod
    def no_space(cls, path: Path, exc: OSError, needed: int | None, output_dir: Path) -> LockWriteError:
        return cls(f"--output_dir={output_dir}: the run's lock could not be written: "
                   f"{no_space_line(path, needed, exc)}; free space there, or pass another --output_dir. "
                   "Nothing was written")


class LockPathError(LerobotError):
    """The lock or its takeover marker is not a regular file this process can read (exit code 1).

    ``what`` says what is there instead ("a directory", "a named pipe (FIFO)", ...).
    """

    what = "something else"

    @classmethod
    def at(cls, path: Path, what: str, fix: str) -> LockPathError:
        role = "lock" if path.name == LOCK_FILE else "lock's takeover marker"
        error = cls(f"the {role} of --output_dir={path.parent}, {path}, is {what}, not a file a run wrote, so no run "
                    f"can hold the folder while it is there: {fix}. Nothing was written")
        error.what = what  # kept by pickling (the error reaches the other ranks so)
        return error


@dataclass(frozen=True)
class Claimant:
    """Who asks for the lock: this process, and which launch and attempt of the run it is."""

    host: str
    pid_space: str  # boot id and pid namespace: a pid is only meaningful within the same one
    pid: int
    launch: str | None  # one torchrun launch (rendezvous id, SLURM job and requeue), else None
    attempt: int  # torchrun's restart count within that launch
    restarting: bool  # a restart of the run by its launcher (torchrun or SLURM)
    rerun: bool = False  # a --resume=auto start: a scheduler's rerun of the same command

    @classmethod
    def current(cls, restarting: bool, env: Mapping[str, str] = os.environ, *, rerun: bool = False) -> Claimant:
        launch = _torchrun_launch(env)
        attempt = env_int(env, "TORCHELASTIC_RESTART_COUNT", 0) if launch is not None else 0
        return cls(socket.gethostname(), _pid_space(), os.getpid(), launch, attempt, restarting, rerun)

    def record(self) -> bytes:
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        return json.dumps({
            "host": self.host, "pid": self.pid, "started": started, "pid_space": self.pid_space,
            "pid_start_ticks": _start_ticks(self.pid), "torchrun_launch": self.launch,
            "torchrun_attempt": self.attempt, "token": uuid.uuid4().hex,
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


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` from the state on (field 3 is index 0); None if unreadable."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat_line.rpartition(")")[2].split()


def _start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot: with the pid, it names one process."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 and fields[19].isdigit() else None


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

    def checkable_by(self, me: Claimant) -> bool:
        """Whether ``me`` can tell if this holder's process is alive: same host, boot and pid namespace."""
        return (self.pid is not None and bool(me.pid_space) and self.field("host") == me.host
                and self.field("pid_space") == me.pid_space)


def read_holder(path: Path) -> Holder | None:
    """The lock at ``path``, or None when there is none. ``LockPathError`` when something
    other than a regular file is there, or one this process may not read."""
    _refuse_unless_regular(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)  # not blocking, not following: replaced since the look above
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        what = f"a file this user may not read ({exc.strerror}, errno {errno.errorcode.get(exc.errno, exc.errno)})"
        raise LockPathError.at(path, what, _unreadable_fix(path)) from exc
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        _refuse_unless_regular(path)
        return None  # replaced by a link and removed again: look afresh
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise LockPathError.at(path, _kind(info.st_mode), _removal_fix(path, info.st_mode))
        raw = os.read(fd, MAX_RECORD_BYTES)
    finally:
        os.close(fd)
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):  # being written, damaged, or not JSON at all
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("host"), str):
        record = None
    return Holder(raw, record, time.time() - info.st_mtime)


def _refuse_unless_regular(path: Path) -> None:
    """Raise ``LockPathError`` when ``path`` exists and is not a regular file (a link is not one)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(info.st_mode):
        return
    what = _kind(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        what = f"a symbolic link to {_link_target(path)}"
    raise LockPathError.at(path, what, _removal_fix(path, info.st_mode))


def _link_target(path: Path) -> str:
    """Where the link ``path`` points, and whether that is nowhere."""
    try:
        target = os.readlink(path)
    except OSError as exc:  # removed or replaced since it was seen
        return f"somewhere ({os_error_line(exc)})"
    try:
        os.stat(path)
    except FileNotFoundError:
        return f"{target}, which does not exist"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{target}, which loops"
        return f"{target} ({os_error_line(exc)})"
    return target


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISLNK, "a symbolic link"))
    return next((what for test, what in kinds if test(mode)), f"a file of type {stat.S_IFMT(mode):o}")


def _removal_fix(path: Path, mode: int) -> str:
    remove = "rm -r" if stat.S_ISDIR(mode) else "rm"
    return f"remove it ({remove} {shlex.quote(str(path))}), then start the run again"


def _unreadable_fix(path: Path) -> str:
    return (f"if another user's run holds the folder, pass another --output_dir; otherwise remove it "
            f"(rm {shlex.quote(str(path))}) or let this user read it, then start the run again")


def why_stale(holder: Holder, me: Claimant) -> str | None:
    """Why ``holder``'s run is over, or None while it may still be running."""
    pid = holder.pid
    if pid is not None and holder.checkable_by(me):
        # A pid equal to ours was a process before us: this one holds no lock yet.
        if pid == me.pid or not _alive(pid, holder.field("pid_start_ticks")):
            return f"its process {pid} is gone"
        return None  # alive here: however old its heartbeat (stopped, traced), only its end frees the lock
    attempt = holder.field("torchrun_attempt")
    if (me.launch is not None and holder.field("torchrun_launch") == me.launch and isinstance(attempt, int)
            and attempt < me.attempt):
        return f"it was attempt {attempt} of this torchrun launch, which torchrun stopped before restarting it"
    if holder.age_s > STALE_AFTER_S:
        return f"its heartbeat is {holder.age_s:.0f} s old (more than {STALE_AFTER_S:.0f} s)"
    return None


def _alive(pid: int, start_ticks: object = None) -> bool:
    """Whether ``pid`` runs: exists, is no zombie, and (when known) is the process that started at ``start_ticks``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    fields = _proc_stat(pid)
    if fields is None:
        return True
    if fields[:1] == ["Z"]:  # killed, not yet reaped by its parent: exists, but runs nothing
        return False
    # Another process given the same pid since: a different start time.
    return not isinstance(start_ticks, int) or len(fields) <= 19 or fields[19] == str(start_ticks)


def _stopped(pid: int) -> bool:
    """Stopped by a signal (SIGSTOP, SIGTSTP) or by a debugger: alive, but running nothing."""
    fields = _proc_stat(pid)
    return fields is not None and fields[:1] in (["T"], ["t"])


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
        """Hold ``output_dir`` (created if missing) or raise ``OutputLockedError`` naming its holder
        (``LockPathError`` when something other than a lock is in the way)."""
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
        marker = path.with_name(path.name + TAKEOVER_SUFFIX)
        _refuse_unless_regular(marker)
        waits = _Waits()
        deadline: float | None = None
        while not _create(path, raw):
            holder = read_holder(path)
            if holder is None:  # released between our attempt and our look
                continue
            if holder.record is None and holder.age_s < BEING_WRITTEN_S:  # look again once it is written
                waits.say("written", f"the lock {path} is being written by the run that created it; waiting up to "
                                     f"{BEING_WRITTEN_S - holder.age_s:.0f} s for its holder's record")
                time.sleep(0.05)
                continue
            stale = why_stale(holder, self._me)
            if stale is not None:
                taken = _remove_stale(path, holder, marker)
                if taken is True:
                    logger.info(f"took over the lock {path} of a run that is over ({holder.describe()}): {stale}")
                elif taken is not False:
                    waits.say("takeover", (
                        f"the lock {path} is stale ({stale}), and another run is taking it over ({marker} is "
                        f"{taken:.0f} s old); waiting up to {max(ABANDONED_TAKEOVER_S - taken, 0):.0f} s for it to "
                        f"finish, after which the marker counts as left by a run killed mid-takeover and is removed"))
                    time.sleep(0.05)
                continue
            if deadline is None:
                # Past the last poll that could see the heartbeat turn stale.
                deadline = time.monotonic() + (STALE_AFTER_S + 2 * POLL_S if self._waits_for(holder) else 0.0)
            if time.monotonic() >= deadline:
                raise OutputLockedError(_refusal(path, holder, self._me))
            waits.say("holder", (
                f"{'restart' if self._me.restarting else '--resume=auto'}: {path.parent} is locked by "
                f"{holder.describe()}; waiting up to {STALE_AFTER_S:.0f} s for that run to end or its heartbeat to "
                "stop"))
            time.sleep(POLL_S)

    def _waits_for(self, holder: Holder) -> bool:
        """Whether to wait for a live-looking holder to end or go stale, rather than refuse at once.

        A restart waits, as its predecessor may have died where its heartbeat is the only
        sign of it; a ``--resume=auto`` rerun waits only for a holder it cannot check (on
        this host a live pid is a live run, and a second run beside it is a mistake)."""
        return self._me.restarting or (self._me.rerun and not holder.checkable_by(self._me))

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still ours; folders it created and left empty go too."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if self._path is not None:
            try:
                holder = read_holder(self._path)
            except LockPathError:  # replaced by something else: not ours to remove
                holder = None
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


class _Waits:
    """One log line per kind of wait, the first time it happens."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def say(self, kind: str, line: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            logger.info(line)


def _make_dirs(output_dir: Path) -> list[Path]:
    """Create ``output_dir`` and its missing parents; the ones created, outermost first."""
    missing = []
    folder = output_dir.absolute()
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        for folder in missing:  # innermost first: the ones made before the failure
            with contextlib.suppress(OSError):
                folder.rmdir()
        if is_no_space(exc):
            raise LockWriteError.no_space(Path(exc.filename or output_dir), exc, None, output_dir) from exc
        raise
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
    except OSError as exc:
        if is_no_space(exc):
            raise LockWriteError.no_space(path, exc, len(raw), path.parent) from exc
        raise
    try:
        if os.write(fd, raw) != len(raw):  # a short write: the disk had room for part of it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        path.unlink(missing_ok=True)
        if is_no_space(exc):
            raise LockWriteError.no_space(path, exc, len(raw), path.parent) from exc
        raise OSError(exc.errno, exc.strerror, str(path)) from exc  # a failed write names no file
    os.close(fd)
    return True


def _remove_stale(path: Path, holder: Holder, marker: Path) -> bool | float:
    """Remove the lock ``holder`` was read from, unless another contender got there first.

    Only the process that created the takeover ``marker`` may remove a stale lock, and
    only while the lock is still the one it judged stale; everyone then races on
    ``O_EXCL``. True: removed; False: the lock changed meanwhile; a number: another
    contender's marker is in the way, and is that many seconds old.
    """
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return _busy_marker(marker)
    os.close(fd)
    try:
        current = read_holder(path)
        if current is None or current.raw != holder.raw:
            return False
        path.unlink(missing_ok=True)
        return True
    finally:
        marker.unlink(missing_ok=True)


def _busy_marker(marker: Path) -> bool | float:
    """Another contender's takeover marker: its age, or False once it is gone or was abandoned and removed."""
    _refuse_unless_regular(marker)
    try:
        age = time.time() - os.lstat(marker).st_mtime
        if age > ABANDONED_TAKEOVER_S:
            marker.unlink(missing_ok=True)
            return False
    except FileNotFoundError:
        return False
    return max(age, 0.0)


def _refusal(path: Path, holder: Holder, me: Claimant) -> str:
    heartbeat = f"its lock {path} was refreshed {max(holder.age_s, 0.0):.0f} s ago"
    wait = "wait for that run to end"
    if holder.pid is not None and holder.checkable_by(me) and holder.age_s > STALE_AFTER_S:
        stopped = _stopped(holder.pid)
        state = "stopped (SIGSTOP, or a debugger)" if stopped else "alive"
        heartbeat += f", but its process is {state} on this host, and a live process keeps its lock however old"
        if stopped:
            wait = f"let that run go on (kill -CONT {holder.pid}) and end"
    return (
        f"--output_dir={path.parent} is in use by another run ({holder.describe()}; {heartbeat}), and two runs "
        f"writing one folder would mix their checkpoints: {wait}, or pass another --output_dir; if that run is "
        "dead, remove the lock file (a lock is taken over by itself once its process is gone on this host or, "
        f"held from another host, its heartbeat is {STALE_AFTER_S:.0f} s old). Nothing was written"
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
            try:
                holder = read_holder(self._path)
            except LockPathError as exc:
                return self._lost(f"replaced by {exc.what}")
            if holder is None or holder.raw != self._raw:
                return self._lost("removed" if holder is None else f"taken over by {holder.describe()}")
            os.utime(self._path)
        except OSError as exc:  # a passing file-system error: the next beat tries again
            logger.warning(f"warning: could not refresh the lock {self._path}: {exc}")
        return True

    def _lost(self, how: str) -> bool:
        logger.error(f"error: the lock {self._path} of this run was {how}: another run may now write this folder too")
        return False
