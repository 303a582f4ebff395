"""Start real rank processes (gloo on CPU) for multi-process tests, with a watchdog.

Ranks get torch's ``env://`` variables directly (what torchrun exports, minus the elastic
agent), so each rank goes through ``init_distributed``'s launcher detection for real,
and a test can kill one rank without an agent tearing the others down.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# This file, for ``python _dist_util.py probe|spin DIR`` rank programs.
DIST_UTIL = str(Path(__file__).resolve())

# Variables of an outer launch or of the user's Accelerate setup, which would leak into ours.
_LAUNCH_PREFIXES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_", "TORCHELASTIC_", "SLURM_",
    "ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_", "LEROBOT_ALLOW_ACCELERATE_ENV",
)


def without_launcher_vars() -> dict[str, str]:
    """This environment minus launcher variables: a test's processes start as a user's would."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_PREFIXES)}


def clean_env(workdir: Path) -> dict[str, str]:
    """``without_launcher_vars()`` with a private HF_HOME (no accelerate default config)."""
    return {**without_launcher_vars(), "HF_HOME": str(workdir / "hf")}


def free_port() -> int:
    """A loopback port no other process will be handed for about a minute.

    Binding port 0 and closing would free the port at once, so another test's ``bind(0)``
    could take it before our child binds it. Instead the port is left in TIME_WAIT (a
    connection is made to it and the server side closes first): the kernel then gives it
    to no ``bind(0)`` and no plain ``bind``, while the child's listener, which sets
    SO_REUSEADDR as torch's TCPStore and rendezvous servers do, can still bind it.
    """
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = server.accept()
            accepted.close()
    return port


@dataclass
class Rank:
    rank: int
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start_ranks(argv: list[str], world_size: int, workdir: Path, extra_env: dict[str, str] | None = None) -> list[Rank]:
    """``python *argv`` once per rank; each rank's stdout+stderr goes to ``workdir/rank<N>.log``."""
    port = str(free_port())
    ranks = []
    for rank in range(world_size):
        env = {
            **clean_env(workdir),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
            **(extra_env or {}),
        }
        log = workdir / f"rank{rank}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, *argv], env=env, stdout=out, stderr=subprocess.STDOUT)
        ranks.append(Rank(rank, proc, log))
    return ranks


def wait_ranks(ranks: list[Rank], timeout: float) -> list[int]:
    """Exit codes of every rank; kills them all and fails if any outlives ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    for r in ranks:
        try:
            r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.proc.kill()
            for other in ranks:
                other.proc.wait()
            raise AssertionError(f"ranks still running after {timeout}s (hang):\n{describe(ranks)}") from None
    return [r.proc.returncode for r in ranks]


def describe(ranks: list[Rank]) -> str:
    return "\n".join(f"--- rank {r.rank} (exit {r.proc.returncode}) ---\n{r.output()[-4000:]}" for r in ranks)


def run_ranks(argv: list[str], world_size: int, workdir: Path, timeout: float) -> list[dict[str, Any]]:
    """Run to completion; every rank must exit 0 and write ``workdir/result<N>.json``."""
    ranks = start_ranks(argv, world_size, workdir)
    codes = wait_ranks(ranks, timeout)
    assert codes == [0] * world_size, f"rank exit codes {codes}:\n{describe(ranks)}"
    return [json.loads((workdir / f"result{r}.json").read_text()) for r in range(world_size)]


def check_probe(results: list[dict[str, Any]], launcher: str) -> None:
    """What every rank of a healthy two-process ``probe`` run must report."""
    import torch

    for rank, result in enumerate(results):
        assert result["launcher"] == launcher and result["rank"] == rank and result["world_size"] == len(results)
        assert result["process_group"] and result["is_main"] == (rank == 0)
        assert result["backend"] == ("nccl" if torch.cuda.is_available() else "gloo")
        mean_rank = sum(range(len(results))) / len(results)
        assert result["mean"] == {"a": mean_rank, "b": 10 * mean_rank}
        assert result["sum"] == {"samples": 3.0 * len(results)}
        assert result["broadcast"] == {"from": 0, "path": "/runs/x"}
        assert result["guard_error"] is None


# ----------------------------------------------------------------------------- rank programs
# ``python _dist_util.py probe|spin OUTDIR``: tiny workers for launcher and failure tests.


def _probe(outdir: Path) -> None:
    """Start like `lerobot train` does and report what each rank sees."""
    import torch.distributed as dist

    from lerobot_kit.core.distributed.accelerate_guard import check_accelerate_env
    from lerobot_kit.core.distributed.process_group import (
        all_reduce_mean,
        all_reduce_sum,
        barrier,
        broadcast_object,
        init_distributed,
        shutdown,
    )
    from lerobot_kit.core.errors import ConfigError

    try:
        check_accelerate_env(os.environ)
        guard_error = None
    except ConfigError as err:
        guard_error = str(err)
    ctx = init_distributed(timeout_s=30)
    result = {
        "launcher": ctx.launcher,
        "rank": ctx.rank,
        "local_rank": ctx.local_rank,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "device": str(ctx.device),
        "is_main": ctx.is_main,
        "process_group": dist.is_initialized(),
        "guard_error": guard_error,
        "mean": all_reduce_mean(ctx, {"b": 10.0 * ctx.rank, "a": float(ctx.rank)}),
        "sum": all_reduce_sum(ctx, {"samples": 3.0}),
        "broadcast": broadcast_object(ctx, {"from": ctx.rank, "path": "/runs/x"}),
    }
    barrier(ctx)
    shutdown(ctx)
    (outdir / f"result{ctx.rank}.json").write_text(json.dumps(result))


SPIN_TIMEOUT_S = 5


def _spin(outdir: Path) -> None:
    """All-reduce forever (well, a minute) with a 5 s collective timeout; a test kills a peer."""
    from lerobot_kit.core.distributed.process_group import all_reduce_mean, init_distributed

    ctx = init_distributed(timeout_s=SPIN_TIMEOUT_S)
    all_reduce_mean(ctx, {"x": 1.0})
    (outdir / f"ready{ctx.rank}").touch()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        all_reduce_mean(ctx, {"x": 1.0})
        time.sleep(0.02)
    # Reaching here means a dead peer went unnoticed for a minute.
    sys.exit(0)


if __name__ == "__main__":
    {"probe": _probe, "spin": _spin}[sys.argv[1]](Path(sys.argv[2]))
