"""``train()`` in a process group its caller initialised, again and again: what a notebook or
a sweep does, and what the rank pool (``tests/rank_pool.py``) the layout tests run in relies on.
Real processes, a real gloo group; the pool's replies have a watchdog."""

from __future__ import annotations

from pathlib import Path

from checkpoint_state import assert_same_state, losses
from conftest import TINY_ACT, pool_train
from rank_pool import RankPool

HSDP = ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"]


def test_one_config_twice_in_the_same_processes_trains_bit_identically(rank_pools, tmp_path: Path) -> None:
    """HSDP(2×2) with dropout and the VAE's sampling on: the second run, in the four processes
    the first ran in and with the device-mesh groups the first left for reuse, has the first
    run's losses, weights and optimizer state bit for bit. The pool checks after each run
    that it left no thread, signal handler, environment change or registry entry behind,
    and after the second that it added no thread, file descriptor, group or log handler."""
    args = [*TINY_ACT, *HSDP, "--batch_size=2", "--steps=3", "--log_freq=1", "--save_freq=3"]
    first, second = tmp_path / "first", tmp_path / "second"
    pool_train(rank_pools, 4, f"--output_dir={first}", *args, workdir=tmp_path)
    run = pool_train(rank_pools, 4, f"--output_dir={second}", *args, workdir=tmp_path)
    assert "layout hsdp | world 4 (dp_replicate 2 × dp_shard 2)" in run.stderr
    assert len(losses(first)) == 3 and losses(second) == losses(first)
    assert_same_state(first / "checkpoints/000003", second / "checkpoints/000003", tmp_path)


def test_a_run_leaves_the_group_its_caller_initialised(tmp_path: Path) -> None:
    """After an FSDP(2) run, each rank's own barrier and ``destroy_process_group`` on the
    group it initialised succeed (they fail if the run destroyed it), and the ranks exit 0."""
    pool = RankPool(2, tmp_path / "pool")
    try:
        run = pool.train(f"--output_dir={tmp_path / 'run'}", *TINY_ACT, "--parallelism.dp_shard=2", "--steps=1",
                         workdir=tmp_path)
    finally:
        codes = pool.close()
    assert "layout fsdp | world 2" in run.stderr
    assert codes == [0, 0], pool.workdir
