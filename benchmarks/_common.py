"""Plumbing shared by the benchmarks: result rows, paired statistics, processes, memory.

Machines here are shared and noisy, so no benchmark reports a bare absolute time as
its verdict: each times ours and a reference side by side, alternating (A/B, B/A, ...),
and judges the median of the per-pair ratios. Absolute numbers are kept in the JSON
for context only.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent

# ACT at LeRobot's sizes (its ACTConfig defaults: 51.6 M parameters with a resnet18 backbone,
# which each benchmark adds as --policy.vision_backbone=...). lerobot-kit's own ACT defaults
# are sized for a CPU and the embedded task.
LEROBOT_ACT = ["--policy.dim_model=512", "--policy.n_heads=8", "--policy.dim_feedforward=3200",
               "--policy.n_encoder_layers=4", "--policy.n_decoder_layers=1", "--policy.n_vae_encoder_layers=4",
               "--policy.chunk_size=100", "--policy.n_action_steps=100", "--policy.dropout=0.1"]

# Dense bf16 tensor-core peak of a GPU by name (NVIDIA's data sheets), for MFU.
PEAK_BF16_FLOPS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12}


def peak_bf16_flops(gpu_name: str | None) -> float | None:
    """The dense bf16 peak of the GPU ``torch.cuda.get_device_name`` calls ``gpu_name``; None if unknown."""
    return next((flops for name, flops in PEAK_BF16_FLOPS.items() if name in (gpu_name or "")), None)


# Variables of an outer launch or of the user's Accelerate setup, which would leak into ours.
_LAUNCH_PREFIXES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_", "TORCHELASTIC_", "SLURM_",
    "ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_", "LEROBOT_ALLOW_ACCELERATE_ENV", "OMPI_", "PMI_",
)


@dataclass
class Context:
    """What every benchmark gets: the size mode and a scratch folder of its own."""

    smoke: bool
    workdir: Path

    def folder(self, *parts: str) -> Path:
        """A fresh, empty folder under the work folder."""
        path = self.workdir.joinpath(*parts)
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def pick(self, smoke: Any, full: Any) -> Any:
        return smoke if self.smoke else full


@dataclass
class Row:
    """One line of the table. ``ratio`` is what the goal judges; ``met`` is None when the
    row is reported but not judged."""

    name: str
    ours: float
    reference: float | None
    unit: str
    ratio: float | None
    goal: str = ""
    met: bool | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Result:
    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def judge(value: float | None, goal: str) -> bool | None:
    """``goal`` is ``"<= 1.05"`` / ``">= 3"`` / ``"< 0.5"``, applied to ``value``."""
    if value is None or not goal:
        return None
    op, limit = goal.split()
    bound = float(limit)
    return {"<=": value <= bound, ">=": value >= bound, "<": value < bound, ">": value > bound}[op]


def paired(ours: Sequence[float], reference: Sequence[float]) -> dict[str, float]:
    """Median of each, and the median / min / max of the per-pair ratios ours[i] / reference[i]."""
    ratios = [a / b for a, b in zip(ours, reference) if b > 0]
    return {
        "ours": statistics.median(ours),
        "reference": statistics.median(reference),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "pairs": len(ratios),
    }


def samples_per_cpu_second(requests: Iterator[Any], samples: int) -> Callable[[], float]:
    """A measurement of ``samples`` samples drawn from ``requests`` (a DataLoader iterator
    with ``--num_workers=0``: one worker's requests, served in this process), in samples per
    CPU-second of this process: a worker's throughput when it has a core (on a shared
    machine, wall time measures the neighbours too). A request is a collated batch or a
    packed window of batches (episode-block sampling)."""
    def rate() -> float:
        start, count = time.process_time(), 0
        while count < samples:
            served = next(requests)
            batches = served.unpack() if hasattr(served, "unpack") else [served]
            count += sum(len(batch["index"]) for batch in batches)
        return count / (time.process_time() - start)

    return rate


def alternate(reps: int, first: Callable[[], float], second: Callable[[], float]) -> tuple[list[float], list[float]]:
    """Run the two measurements ``reps`` times each in the order A B B A A B ...: a drift of
    the machine's load over the run hits both sides equally."""
    a: list[float] = []
    b: list[float] = []
    for rep in range(reps):
        if rep % 2 == 0:
            a.append(first())
            b.append(second())
        else:
            b.append(second())
            a.append(first())
    return a, b


# ----------------------------------------------------------------------------- provenance


def _cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), else the platform's guess."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def source_commit() -> str:
    """The lerobot-kit commit the figures were measured on; ``+changes`` when tracked files
    differed from it, ``unknown`` outside a git checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}+changes" if changed else commit


def provenance() -> dict[str, Any]:
    """Where and with what a result file's figures were measured: its ``machine`` and
    ``versions`` blocks (torch is imported here, as every benchmark does anyway)."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "machine": {
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "memory_gib": _memory_gib(),
            "gpu": gpu,
            "platform": platform.platform(),
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "lerobot_kit": source_commit(),
            **_lerobot_version(),
        },
    }


def _lerobot_version() -> dict[str, str]:
    """LeRobot's version where it is installed (the bridge's venv): its figures depend on it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return {"lerobot": version("lerobot")}
    except PackageNotFoundError:
        return {}


def result_header(script: str, argv: list[str]) -> dict[str, Any]:
    """How every result file starts: the exact command (``script`` relative to the
    repository's root), the date, and the machine and versions (``provenance``)."""
    return {
        "command": shlex.join(["python", script, *argv]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        **provenance(),
    }


# ----------------------------------------------------------------------------- memory


def rss_now() -> int:
    """Resident bytes of this process now."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_peak() -> int:
    """High-water resident bytes of this process since its exec (``VmHWM``; unlike
    ``ru_maxrss``, it does not inherit the parent's high-water mark)."""
    peak = _hwm(os.getpid())
    assert peak is not None
    return peak


# ----------------------------------------------------------------------------- processes


def logged_rows(output_dir: Path) -> list[dict[str, Any]]:
    """The rows ``lerobot train`` logged to ``<output_dir>/logs/metrics.jsonl`` (none when it has no file)."""
    path = output_dir / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def console_script(name: str) -> str:
    """The installed console script next to this interpreter (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"console script {name!r} is not installed; run `pip install -e .` first")
    return found


def clean_env(workdir: Path, threads: int = 1) -> dict[str, str]:
    """This environment minus launcher variables; a private HF_HOME and a fixed thread count."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_PREFIXES)}
    env["HF_HOME"] = str(workdir / "hf")
    env["OMP_NUM_THREADS"] = str(threads)
    return env


@dataclass
class Timed:
    seconds: float
    peak_rss: int | None  # bytes, of this child alone; None unless asked for
    returncode: int
    stdout: str
    stderr: str


def _hwm(pid: int) -> int | None:
    """The process's resident high-water mark (``VmHWM``); None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _watch_peak(pid: int, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        value = _hwm(pid)
        if value is None:
            return
        peak[0] = max(peak[0], value)
        stop.wait(0.005)


def run_timed(
    argv: list[str], env: dict[str, str], timeout: float, cwd: Path | None = None, peak_rss: bool = False
) -> Timed:
    """Wall time from spawn to exit and, with ``peak_rss``, the child's own peak RSS.

    The peak is the child's ``VmHWM`` sampled every 5 ms (its last ~5 ms are unseen):
    ``wait4``'s ``ru_maxrss`` would not do, Linux carries the parent's high-water mark
    into a child across fork and exec. Sampling competes for the CPU, so it is off for
    pure timings.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=cwd)
        # Popen returns once the child has exec'd: from here on its VmHWM is its own.
        peak, stop = [0], threading.Event()
        watcher = threading.Thread(target=_watch_peak, args=(proc.pid, stop, peak), daemon=True)
        if peak_rss:
            watcher.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{' '.join(argv[:3])} ... killed after {timeout}s") from None
        finally:
            stop.set()
        seconds = time.perf_counter() - start
        if peak_rss:
            watcher.join()
        out.seek(0)
        err.seek(0)
        timed = Timed(seconds, peak[0] if peak_rss else None, proc.returncode, out.read(), err.read())
    if timed.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {timed.returncode}:\n{timed.stdout[-2000:]}{timed.stderr[-3000:]}")
    return timed


@dataclass
class LineTimed:
    seconds: float  # from spawn until the line was printed
    peak_rss: int | None  # bytes, summed over the process tree; None unless asked for
    processes: int | None  # the most processes seen in the tree at once; None unless asked for


def time_to_line(argv: list[str], env: dict[str, str], marker: str, timeout: float, tree_rss: bool = False
                 ) -> LineTimed:
    """Seconds from spawn until a line containing ``marker`` is printed (stdout or stderr); the
    command must then exit 0. With ``tree_rss``, also the peak of the summed resident memory
    of its process tree over the whole run (the command and its children, such as DataLoader
    workers, sampled every 10 ms: ``ru_maxrss`` would give the largest process alone), and
    the most processes seen in it."""
    peak, processes, stop = [0], [0], threading.Event()

    def watch(pid: int) -> None:
        while not stop.is_set():
            pids = _process_tree(pid)
            peak[0] = max(peak[0], sum(_resident(p) for p in pids))
            processes[0] = max(processes[0], len(pids))
            stop.wait(0.01)

    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watcher = threading.Thread(target=watch, args=(proc.pid,), daemon=True)
    if tree_rss:
        watcher.start()
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    seen, lines = None, []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if seen is None and marker in line:
                seen = time.perf_counter() - start
        proc.wait()
    finally:
        killer.cancel()
        stop.set()
        if tree_rss:
            watcher.join()
    if proc.returncode != 0 or seen is None:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode} without {marker!r}:\n{''.join(lines)[-3000:]}")
    return LineTimed(seen, peak[0] if tree_rss else None, processes[0] if tree_rss else None)


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, as the kernel lists them now."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    todo += [int(child) for child in children.read().split()]
        except OSError:  # exited meanwhile
            pass
    return found


def _resident(pid: int) -> int:
    """Resident bytes of process ``pid`` now (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError):
        return 0


class LineServer:
    """A child process kept running between measurements, one JSON line out per line in:
    the other side of a pair is measured while it waits, and its start-up (imports, opening
    a dataset) is paid once. Its first line says it is ready."""

    def __init__(self, argv: list[str], env: dict[str, str], timeout: float = 600) -> None:
        self.timeout = timeout
        self.stderr = tempfile.TemporaryFile("w+")  # a file, not a pipe: chatter never fills it and blocks the child
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True)
        self.ready = self.reply()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def reply(self) -> dict[str, Any]:
        """The next JSON line it prints (other lines, a library's chatter, are skipped)."""
        assert self.proc.stdout is not None
        killer = threading.Timer(self.timeout, self.proc.kill)
        killer.start()
        try:
            for line in self.proc.stdout:
                if line.startswith("{"):
                    return json.loads(line)
        finally:
            killer.cancel()
        self.stderr.seek(0)
        raise RuntimeError(f"{' '.join(map(str, self.proc.args[:3]))} ... exited {self.proc.wait()}:\n"
                           f"{self.stderr.read()[-3000:]}")

    def ask(self, line: str) -> dict[str, Any]:
        self.send(line)
        return self.reply()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(workdir: Path, rank: int, world_size: int, port: int, threads: int = 1) -> dict[str, str]:
    """torch's ``env://`` variables for one rank (what torchrun exports, without its agent)."""
    return {
        **clean_env(workdir, threads),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def run_together(commands: list[tuple[list[str], dict[str, str]]], workdir: Path, timeout: float) -> None:
    """Start every ``(argv, env)`` at once and wait for all; each one's output goes to
    ``workdir/proc<i>.log``. A watchdog kills them all if any outlives ``timeout`` (a hang
    fails fast); any non-zero exit is an error carrying the logs."""
    procs = []
    for i, (argv, env) in enumerate(commands):
        with open(workdir / f"proc{i}.log", "w") as log:
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
        raise RuntimeError(f"still running after {timeout}s (hang):\n{_logs(workdir, len(procs))}") from None
    codes = [proc.returncode for proc in procs]
    if any(codes):
        raise RuntimeError(f"exit codes {codes}:\n{_logs(workdir, len(procs))}")


def launch_ranks(
    argv: list[str], world_size: int, workdir: Path, timeout: float, threads: int = 1
) -> list[dict[str, Any]]:
    """``python *argv`` once per rank; every rank must write ``workdir/result<rank>.json``."""
    port = free_port()
    commands = [([sys.executable, *argv], rank_env(workdir, r, world_size, port, threads)) for r in range(world_size)]
    run_together(commands, workdir, timeout)
    return [json.loads((workdir / f"result{rank}.json").read_text()) for rank in range(world_size)]


def _logs(workdir: Path, count: int) -> str:
    return "\n".join(
        f"--- process {i} ---\n{(workdir / f'proc{i}.log').read_text(errors='replace')[-3000:]}" for i in range(count)
    )


def write_rank_result(outdir: Path, rank: int, result: dict[str, Any]) -> None:
    (outdir / f"result{rank}.json").write_text(json.dumps(result))


def disk_write_speed(folder: Path, nbytes: int, block_size: int = 16 << 20) -> float:
    """Bytes per second of a sequential write of ``nbytes`` into ``folder``, fsync included:
    this disk's speed right now, the floor for anything that must land on it."""
    block = os.urandom(block_size)  # incompressible, in case the storage compresses
    path = folder / "disk_speed.bin"
    start = time.perf_counter()
    with open(path, "wb") as handle:
        for offset in range(0, nbytes, block_size):
            handle.write(block[: min(block_size, nbytes - offset)])
        handle.flush()
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - start
    path.unlink()
    return nbytes / seconds


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def local_bytes(tensor: Any) -> int:
    """The bytes of the part of ``tensor`` this rank holds (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def one_step_held_bytes(prepared: Any, grad_clip_norm: float, around_step: contextlib.AbstractContextManager | None = None
                        ) -> tuple[dict[str, int], float]:
    """One training step of a prepared run, as the trainer takes it, and what this rank then
    holds: parameter, gradient and optimizer-state bytes, beside the whole model's bytes.
    ``around_step`` wraps the forward and backward (to watch their collectives). Returns
    the figures and the step's loss."""
    import torch

    run = prepared.run
    parallel = run.parallel
    params = list(parallel.model.parameters())
    batch = run.preprocessor(next(iter(prepared.loader)))
    with around_step or contextlib.nullcontext():
        loss, _ = parallel.module(batch)
        loss.backward()
    parallel.finish_grad_sync()
    grads_bytes = sum(local_bytes(p.grad) for p in params if p.grad is not None)
    parallel.clip_grad_norm(grad_clip_norm)
    run.optimizer.step()
    optimizer_bytes = sum(
        local_bytes(value) for state in run.optimizer.state.values() for value in state.values()
        if torch.is_tensor(value)
    )
    held = {
        "params_bytes": sum(local_bytes(p) for p in params),
        "grads_bytes": grads_bytes,
        "optimizer_bytes": optimizer_bytes,
        "model_bytes": sum(p.numel() * p.element_size() for p in params),  # a DTensor's numel is the global one
    }
    return held, loss.item()
