"""Rank processes started once that run many ``lerobot train`` commands, one after another.

(Or scripts that drive a run themselves, such as ``probes/restore_probe.py``.)

A pool of N ranks (real processes, a real gloo group over loopback) pays the start-up of
a training process — importing torch and lerobot_kit, joining the group — once, instead
of once per run: each rank initialises the default process group itself, as a notebook
or a sweep would, then runs every command it is sent through the CLI's entry point
in-process, so that ``train()`` joins that group and leaves it initialised. A pool of
one rank creates no group and runs one-process commands.

For the tests that compare runs with each other (layouts, precisions, accumulation,
resumes onto other topologies); the tests about the console script, the launchers,
restarts and signals keep launching real ``torchrun`` / ``lerobot`` processes.

Nothing of one run may reach the next. Before each command a rank restores the random
generators to their state at the pool's start (a fresh process's, for torch); after it,
the rank compares what a run could leave behind with what was there before — threads
running lerobot_kit code, signal handlers, the environment, the working directory, the
plugin registry — and, when the same command (bar its output folder) ran before in this
pool, that the run added no thread at all, no file descriptor, process group or logging
handler (a first run may: torch and other libraries set themselves up lazily, and a
layout keeps its device mesh's groups for the next run). The harness fails the test on
any of it. ``tests/integration/test_rank_pool.py`` runs one config twice in one pool and
holds it to bit-identical losses.

Run as a script (``python rank_pool.py``), this file is the rank program.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests folder, when run as a rank program
from _dist_util import clean_env, free_port  # noqa: E402

RANK_POOL = str(Path(__file__).resolve())
START_TIMEOUT_S = 240
# CPU seconds each live pool's ranks have reported so far (see ``unwaited_cpu_seconds``).
_REPORTED_CPU: dict[int, list[float]] = {}


def unwaited_cpu_seconds() -> float:
    """CPU time the ranks of pools still running have used: a process's own rusage counts
    children only once they are waited for, which pool ranks are at the end of the session
    (``cpu_times.py`` adds this so that each test is charged for its runs)."""
    return sum(sum(per_rank) for per_rank in _REPORTED_CPU.values())


@dataclass
class PoolRun:
    """What a run in the pool did, shaped like ``subprocess.run``'s answer for torchrun:
    ``returncode`` the first non-zero exit code of a rank (else 0), ``stderr`` every rank's
    output (rank 0 first), ``stdout`` empty."""

    returncode: int
    stderr: str
    exit_codes: list[int]
    stdout: str = ""


class RankPool:
    """``world_size`` rank processes waiting for commands; ``workdir`` holds their logs."""

    def __init__(self, world_size: int, workdir: Path) -> None:
        self.world_size = world_size
        self.workdir = workdir
        self.runs = 0
        workdir.mkdir(parents=True, exist_ok=True)
        port = str(free_port())
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(world_size):
            env = {**clean_env(workdir), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                   "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                   "OMP_NUM_THREADS": "1"}
            if world_size == 1:  # a one-process run: no launcher variables at all, as from a shell
                env = {k: v for k, v in env.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                                 "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
            with open(workdir / f"pool_rank{rank}.log", "wb") as log:
                self.procs.append(subprocess.Popen([sys.executable, RANK_POOL], env=env, stdin=subprocess.PIPE,
                                                   stdout=subprocess.PIPE, stderr=log))
        self._buffers = [b""] * world_size
        _REPORTED_CPU[id(self)] = [0.0] * world_size
        ready = self._replies(START_TIMEOUT_S, "start")
        assert all(r["ready"] for r in ready), ready

    def train(self, *args: str, workdir: Path, timeout: float = 240, check: bool = True) -> PoolRun:
        """``lerobot train ARGS`` on every rank, with ``workdir`` as the working directory."""
        return self.run(["lerobot", "train", *args], workdir=workdir, timeout=timeout, check=check)

    def run(self, argv: list[str], workdir: Path, timeout: float = 240, check: bool = True) -> PoolRun:
        """``argv`` on every rank: ``["lerobot", ...]`` through the console script's entry
        point, ``["python", SCRIPT, ...]`` a script run as ``__main__``."""
        assert argv[0] in ("lerobot", "python"), argv
        self.runs += 1
        logs = [self.workdir / f"run{self.runs}.rank{rank}.log" for rank in range(self.world_size)]
        for proc, log in zip(self.procs, logs):
            assert proc.stdin is not None
            proc.stdin.write((json.dumps({"argv": argv, "cwd": str(workdir), "log": str(log)}) + "\n").encode())
            proc.stdin.flush()
        replies = self._replies(timeout, " ".join(argv))
        codes = [reply["exit"] for reply in replies]
        run = PoolRun(next((c for c in codes if c != 0), 0), "".join(log.read_text(errors="replace") for log in logs),
                      codes)
        if any(codes) and self.world_size > 1:  # a failed run may have left a peer in a collective: this pool is done
            self.close()
        if check:
            assert codes == [0] * self.world_size, f"exit codes {codes}:\n{run.stderr[-6000:]}"
        leaks = [(rank, reply["leaks"]) for rank, reply in enumerate(replies) if reply["leaks"]]
        assert not leaks, f"the run left state behind in the pool's processes (rank, what: before -> after): {leaks}"
        return run

    @property
    def alive(self) -> bool:
        return all(proc.poll() is None for proc in self.procs)

    def close(self) -> list[int]:
        """End the ranks and return their exit codes: EOF on their input makes each leave
        the group (a barrier, then destroying it: this fails if a run broke the group)."""
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
        deadline = time.monotonic() + 30
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _REPORTED_CPU.pop(id(self), None)
        return [proc.returncode for proc in self.procs]

    def _replies(self, timeout: float, what: str) -> list[dict[str, Any]]:
        """One JSON line from every rank, or every rank killed and the test failed (the watchdog)."""
        deadline = time.monotonic() + timeout
        replies: list[dict[str, Any] | None] = [None] * self.world_size
        while any(r is None for r in replies):
            waiting = {self.procs[i].stdout.fileno(): i for i, r in enumerate(replies) if r is None}  # type: ignore[union-attr]
            readable, _, _ = select.select(list(waiting), [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                self._kill()
                raise AssertionError(f"rank pool: no answer to `{what}` within {timeout}s (hang):\n{self._logs()}")
            for fd in readable:
                rank = waiting[fd]
                chunk = os.read(fd, 65536)
                if not chunk:
                    self._kill()
                    raise AssertionError(f"rank pool: rank {rank} died during `{what}`:\n{self._logs()}")
                self._buffers[rank] += chunk
                if b"\n" in self._buffers[rank]:
                    line, self._buffers[rank] = self._buffers[rank].split(b"\n", 1)
                    replies[rank] = json.loads(line)
                    _REPORTED_CPU[id(self)][rank] = replies[rank]["cpu_s"]
        return replies  # type: ignore[return-value]

    def _kill(self) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()
        _REPORTED_CPU.pop(id(self), None)

    def _logs(self) -> str:
        logs = sorted(self.workdir.glob("*.log"), key=lambda p: p.stat().st_mtime)[-2 * self.world_size:]
        return "\n".join(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}" for log in logs)


class RankPools:
    """One pool per world size, started on first use and reused until the session ends."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.pools: dict[int, RankPool] = {}

    def get(self, world_size: int) -> RankPool:
        pool = self.pools.get(world_size)
        if pool is None or not pool.alive:
            started = len(list(self.workdir.glob(f"world{world_size}_*")))
            pool = self.pools[world_size] = RankPool(world_size, self.workdir / f"world{world_size}_{started}")
        return pool

    def close(self) -> dict[int, list[int]]:
        """The exit codes of the ranks of every pool still running, by world size."""
        return {size: pool.close() for size, pool in self.pools.items() if pool.alive}


# ----------------------------------------------------------------------------- the rank program


# torch sets it for its compiler's cache the first time a process needs it.
_TORCH_SETS_ITSELF = {"TORCHINDUCTOR_CACHE_DIR"}
# A handler torch installs once and keeps for the process (its DataLoader's SIGCHLD handler,
# which watches worker processes and calls the handler it replaced).
_TORCH_KEEPS = "torch.utils.data."


def _snapshot() -> dict[str, Any]:
    """What a run must leave as it found it."""
    import threading

    from lerobot_kit.core.registry.registry import get_registry

    handlers = {}
    for signum in sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}):
        handler = signal.getsignal(signum)
        module = getattr(handler, "__module__", None) or ""
        handlers[str(signum)] = f"{module}:{getattr(handler, '__qualname__', None) or repr(handler)}"
    return {
        "lerobot_kit threads": sorted(t.name for t in threading.enumerate() if _started_by_lerobot_kit(t)),
        "signal handlers": handlers,
        "environment": {k: v for k, v in os.environ.items() if k not in _TORCH_SETS_ITSELF},
        "working directory": os.getcwd(),
        "plugin registry": {kind: sorted(table) for kind, table in get_registry().entries.items()},
    }


def _started_by_lerobot_kit(thread: Any) -> bool:
    """A thread running lerobot_kit code: a run must end all of its own (other libraries
    keep a thread of theirs for the process, such as tqdm's monitor, counted below)."""
    target = getattr(thread, "_target", None)
    module = getattr(target, "__module__", None) if target is not None else type(thread).__module__
    return (module or "").startswith("lerobot_kit")


def _resources() -> dict[str, int]:
    """What a run may add once (torch's lazy set-up, the groups a layout keeps for the next
    run in the same default group) but never again when the same command runs again."""
    import logging

    import torch.distributed as dist

    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in sorted(logging.root.manager.loggerDict))]
    import threading

    return {
        "Python threads": threading.active_count(),
        "OS threads": len(os.listdir("/proc/self/task")),
        "open file descriptors": len(os.listdir("/proc/self/fd")),
        "process groups": len(dist.distributed_c10d._world.pg_names) if dist.is_initialized() else 0,
        "logging handlers": sum(len(logger.handlers) for logger in loggers),
    }


def _differences(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, old in before.items():
        new = after[key]
        if old == new:
            continue
        if isinstance(old, dict):
            changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k)
                             and not str(new.get(k)).startswith(_TORCH_KEEPS))
            if not changed:
                continue
            out[key] = {k: [old.get(k), new.get(k)] for k in changed}
        else:
            out[key] = [old, new]
    return out


def _rng_state() -> tuple[Any, ...]:
    import random

    import numpy as np
    import torch

    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _set_rng_state(state: tuple[Any, ...]) -> None:
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state[0])
    np.random.set_state(state[1])
    random.setstate(state[2])


def _main(argv: list[str]) -> None:
    if argv[0] == "lerobot":
        from lerobot_kit.cli.main import cli

        cli.main(argv[1:], prog_name="lerobot")
    else:
        import runpy

        sys.argv = argv[1:]
        runpy.run_path(argv[1], run_name="__main__")


def _run(argv: list[str], cwd: str, log: str) -> int:
    """``argv`` in this process (see ``RankPool.run``), its output in ``log``; its exit code."""
    import traceback

    home, saved_argv = os.getcwd(), sys.argv
    code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.chdir(cwd)
    try:
        _main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - a script's uncaught error: what its interpreter would print and exit with
        traceback.print_exc()
        code = 1
    finally:
        sys.argv = saved_argv
        os.chdir(home)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
    return code


def _cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _serve() -> None:
    """Join the group, then run each command read from stdin; one JSON reply line per command."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints go to the rank's log, never into the replies
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    import lerobot_kit.cli.train  # noqa: F401 - what the first command would import anyway
    import torch.distributed as dist

    if world_size > 1:
        dist.init_process_group(backend="gloo")
    start_rng = _rng_state()
    ran_before: set[str] = set()
    replies.write(json.dumps({"ready": True, "cpu_s": _cpu_seconds()}) + "\n")
    for line in sys.stdin:
        job = json.loads(line)
        _set_rng_state(start_rng)
        before, resources = _snapshot(), _resources()
        code = _run(job["argv"], job["cwd"], job["log"])
        leaks = _differences(before, _snapshot()) if code == 0 else {}
        command = json.dumps([arg for arg in job["argv"] if not arg.startswith("--output_dir=")])
        if code == 0 and command in ran_before:
            grown = {k: [resources[k], v] for k, v in _resources().items() if v > resources[k]}
            leaks.update(grown)
        ran_before.add(command)
        replies.write(json.dumps({"exit": code, "leaks": leaks, "cpu_s": _cpu_seconds()}) + "\n")
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    # Everything is written; the interpreter's own teardown of torch's modules would cost
    # more than a second of CPU per rank for nothing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _serve()
