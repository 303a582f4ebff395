"""Shared test helpers: run the installed console scripts as a user would; policy checks that several policies share."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

pytest_plugins = ("cpu_times", "pytest_temp_dir")

if TYPE_CHECKING:
    from torch import nn

    from rank_pool import PoolRun, RankPools

# One torch thread in each test worker and in every process it starts, as in the launched
# runs: two workers on two cores, each with a spinning OpenMP thread per core, spend a
# fifth of the unit tests' CPU time waiting on each other. Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# torch.compile's kernels built in the compiling process: with more threads, inductor starts
# a pool of worker processes, each importing torch, which costs more CPU than the tiny
# kernels of these tests do.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent


def script(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"console script {name} is not installed next to {sys.executable}"
    return str(path)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None,
            command: str = "lerobot") -> subprocess.CompletedProcess[str]:
    """The installed console script with ``args``; ``env`` on top of this environment minus launcher variables."""
    from _dist_util import without_launcher_vars

    full_env = {**without_launcher_vars(), **(env or {})}
    return subprocess.run(
        [script(command), *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd
    )


@contextlib.contextmanager
def tmpfs(mount: Path, options: str) -> Iterator[Path]:
    """A real tmpfs mounted at ``mount`` with ``options`` (tests run as root), unmounted afterwards."""
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.fixture
def cli():
    return run_cli


INTEGRATION = REPO / "tests" / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The lanes: ``slow`` for every integration test not marked ``fast`` (they start real
    processes, most of them training runs) and for every test that trains in the rank pools,
    so that a new test lands in the right lane without anyone deciding."""
    for item in items:
        integration = INTEGRATION in item.path.parents
        if "rank_pools" in item.fixturenames or (integration and item.get_closest_marker("fast") is None):
            item.add_marker(pytest.mark.slow)


def assert_meta_build_equals_cpu_build(build: Callable[[], nn.Module], seed: int = 7) -> nn.Module:
    """``manual_seed(s); build()`` on the CPU equals a meta-device ``build()`` + ``to_empty``
    + ``init_weights()`` from the same seed: sharded runs build on meta and rely on it.
    Returns the CPU build."""
    import torch

    torch.manual_seed(seed)
    reference = build()
    torch.manual_seed(seed)
    with torch.device("meta"):
        policy = build()
    assert all(p.is_meta for p in policy.parameters())
    policy.to_empty(device="cpu")
    torch.manual_seed(seed)
    policy.init_weights()
    assert reference.state_dict().keys() == policy.state_dict().keys()
    for (name, a), b in zip(reference.state_dict().items(), policy.state_dict().values()):
        assert torch.equal(a, b), name
    assert not list(policy.buffers())  # nothing that to_empty would leave uninitialised
    return reference


TINY_ACT = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2",
            "--policy.n_encoder_layers=2", "--policy.n_vae_encoder_layers=1", "--policy.chunk_size=5",
            "--policy.n_action_steps=5", "--policy.dropout=0.1"]
# Deterministic across layouts: no dropout, no VAE sampling noise (whose draws differ per rank).
PARITY_ACT = [*TINY_ACT, "--policy.dropout=0", "--policy.use_vae=false"]


def launch_env(workdir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    from _dist_util import clean_env

    return {**clean_env(workdir), "OMP_NUM_THREADS": "1", **(extra or {})}


def torchrun_train(nproc: int, *args: str, workdir: Path, env: dict[str, str] | None = None,
                   timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node=N $(which lerobot) train ARGS``, with a watchdog."""
    command = [script("torchrun"), "--standalone", f"--nproc-per-node={nproc}", script("lerobot"), "train", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=workdir,
                            env=launch_env(workdir, env))
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


@pytest.fixture(scope="session")
def rank_pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RankPools]:
    """Rank processes of each world size, started once per test worker (see ``rank_pool.py``)."""
    from rank_pool import RankPools

    pools = RankPools(tmp_path_factory.mktemp("rank_pools"))
    yield pools
    exits = pools.close()
    assert all(codes == [0] * size for size, codes in exits.items()), f"pool ranks' exit codes: {exits}"


def pool_train(pools: RankPools, nproc: int, *args: str, workdir: Path, timeout: float = 240,
               check: bool = True) -> PoolRun:
    """``lerobot train ARGS`` on ``nproc`` ranks of a pool: the numbers of ``torchrun_train``'s
    run without its start-up. For tests that compare runs; launcher tests use ``torchrun_train``."""
    return pools.get(nproc).train(*args, workdir=workdir, timeout=timeout, check=check)


def pool_cli(pools: RankPools, *args: str, workdir: Path, timeout: float = 240) -> PoolRun:
    """``lerobot ARGS`` in the one-rank pool, whatever its exit code: what ``run_cli`` runs
    (the same entry point, its one-line errors and exit codes) without a process and a torch
    import per command. For tests of many refused commands; tests of the console script itself
    use ``run_cli``."""
    return pools.get(1).run(["lerobot", *args], workdir=workdir, timeout=timeout, check=False)


def pool_script(pools: RankPools, nproc: int, script_path: Path, *args: str, workdir: Path, timeout: float = 240,
                check: bool = True) -> PoolRun:
    """``python SCRIPT ARGS`` on ``nproc`` ranks of a pool (a script that drives a run itself)."""
    return pools.get(nproc).run(["python", str(script_path), *args], workdir=workdir, timeout=timeout, check=check)


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """``build(folder)`` once per test session, by whichever test worker needs it first; the
    others wait for it and get the same folder. For fixtures that train: pytest-xdist hands a
    module's tests to several workers, and a module fixture would train once in each."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built_once"
    root.mkdir(exist_ok=True)
    folder, done = root / name, root / f"{name}.done"
    with FileLock(root / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


def read_metrics(output_dir: Path) -> list[dict[str, float]]:
    import json

    return [json.loads(line) for line in (output_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
