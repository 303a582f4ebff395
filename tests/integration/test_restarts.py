"""FSDP(2) runs that survive: a rank SIGKILLed under ``torchrun --max-restarts`` and a
SIGTERM to rank 0 each end with weights bit-identical to the same run left alone.

Every run is the installed console script under torchrun (or, where one rank must be
signalled by pid, as rank processes with torch's env:// variables); ``subprocess``
timeouts and ``wait_ranks`` are the watchdogs. Faults are placed with the test-only
``LEROBOT_KIT_FAULT`` (``core.run.reliability.fault_injection``): torch hooks, no branch in the loop.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _dist_util import describe, start_ranks, wait_ranks
from conftest import TINY_ACT, built_once, launch_env, pool_train, run_cli, script

SMALL_DATA = ["--dataset.num_episodes=2", "--dataset.episode_length=20"]
FSDP = [*TINY_ACT, *SMALL_DATA, "--batch_size=4", "--log_freq=10", "--seed=7", "--parallelism.dp_shard=2"]
STEPS = 60


def torchrun_restartable(
    *args: str, workdir: Path, env: dict[str, str], timeout: float = 420
) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node=2 --max-restarts=2 $(which lerobot) train ARGS``."""
    command = [script("torchrun"), "--standalone", "--nproc-per-node=2", "--max-restarts=2", script("lerobot"),
               "train", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=workdir,
                          env=launch_env(workdir, env))


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / f"checkpoints/{STEPS:06d}/pretrained_model/model.safetensors")


def assert_bit_identical(run: Path, reference: Path) -> None:
    ours, theirs = final_weights(run), final_weights(reference)
    assert ours.keys() == theirs.keys()
    different = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert not different, f"{len(different)} tensors differ from the uninterrupted run, e.g. {different[:3]}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, rank_pools) -> Path:
    """The same FSDP(2) run, never interrupted: 60 steps, a checkpoint every 10. In a rank
    pool (``tests/rank_pool.py``): only the runs that are killed and restarted need torchrun."""

    def build(root: Path) -> None:
        pool_train(rank_pools, 2, *FSDP, f"--steps={STEPS}", "--save_freq=10", f"--output_dir={root / 'run'}",
                   workdir=root, timeout=420)

    return built_once(tmp_path_factory, "restarts_uninterrupted", build) / "run"


def test_a_rank_killed_after_checkpoint_20_restarts_and_ends_bit_identical(tmp_path, uninterrupted):
    fault_log = tmp_path / "faults.jsonl"
    env = {"LEROBOT_KIT_FAULT": "point=backward,step=25,rank=1", "LEROBOT_KIT_FAULT_LOG": str(fault_log)}
    result = torchrun_restartable(*FSDP, f"--steps={STEPS}", "--save_freq=10", f"--output_dir={tmp_path / 'run'}",
                                  workdir=tmp_path, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    [fault] = [json.loads(line) for line in fault_log.read_text().splitlines()]
    assert (fault["rank"], fault["step"], fault["point"], fault["attempt"]) == (1, 25, "backward", 0)
    assert f"restart 1 of this run: continuing from {tmp_path / 'run/checkpoints/000020'} (step 20)" in output
    assert "already exists" not in output
    assert_bit_identical(tmp_path / "run", uninterrupted)


@pytest.mark.parametrize("point, step, rank, extra", [
    ("sync_save", 30, 0, []),
    ("async_save", 40, 1, ["--async_checkpoint=true"]),
], ids=["during_a_synchronous_save", "during_a_background_save"])
def test_a_rank_killed_during_a_save_restarts_and_ends_bit_identical(tmp_path, uninterrupted, point, step, rank, extra):
    """Fault-injection trials at the two points where a kill meets a half-written checkpoint
    (``benchmarks/fault_injection.py`` runs more, at random points)."""
    fault_log = tmp_path / "faults.jsonl"
    env = {"LEROBOT_KIT_FAULT": f"point={point},step={step},rank={rank}", "LEROBOT_KIT_FAULT_LOG": str(fault_log)}
    result = torchrun_restartable(*FSDP, f"--steps={STEPS}", "--save_freq=10", *extra,
                                  f"--output_dir={tmp_path / 'run'}", workdir=tmp_path, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    [fault] = [json.loads(line) for line in fault_log.read_text().splitlines()]
    assert f"{step:06d}.tmp" in fault["observed"], fault  # it died with the checkpoint half-written
    assert f"continuing from {tmp_path / 'run/checkpoints' / f'{step - 10:06d}'}" in output
    if rank == 0:  # the main process died holding the folder's lock: the restart takes it over
        lock = tmp_path / "run/.lerobot-kit.lock"
        assert f"took over the lock {lock} of a run that is over" in output and "is gone" in output, output[-6000:]
        assert not lock.exists()
    assert_bit_identical(tmp_path / "run", uninterrupted)


def test_sigterm_to_rank_0_of_fsdp_saves_where_both_ranks_stop_and_a_resume_is_bit_identical(tmp_path, uninterrupted,
                                                                                              rank_pools):
    run = tmp_path / "run"
    argv = [script("lerobot"), "train", *FSDP, f"--steps={STEPS}", "--save_freq=40", f"--output_dir={run}"]
    ranks = start_ranks(argv, 2, tmp_path)
    metrics = run / "logs" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and '"step": 10' in metrics.read_text()):
        assert time.monotonic() < deadline and all(r.proc.poll() is None for r in ranks), describe(ranks)
        time.sleep(0.05)
    signalled = time.monotonic()
    ranks[0].proc.send_signal(signal.SIGTERM)
    codes = wait_ranks(ranks, timeout=120)
    assert time.monotonic() - signalled < 60, describe(ranks)
    assert codes == [75, 75], describe(ranks)
    saved = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name != "last")
    assert len(saved) == 1 and 10 < int(saved[0]) < 40, saved  # one checkpoint, where both ranks stopped
    assert (run / "checkpoints/last").resolve().name == saved[0]
    stopped = f"stopped by SIGTERM at step {int(saved[0])}/{STEPS}"
    assert stopped in ranks[0].output() and stopped in ranks[1].output(), describe(ranks)
    assert "Traceback" not in ranks[0].output() + ranks[1].output()
    inspected = run_cli("inspect-checkpoint", str(run / "checkpoints/last"))
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    resumed = pool_train(rank_pools, 2, *FSDP, f"--steps={STEPS}", "--save_freq=40", f"--output_dir={run}",
                         "--resume=auto", workdir=tmp_path, timeout=420)
    assert f"--resume=auto: continuing from {run / 'checkpoints' / saved[0]}" in resumed.stdout + resumed.stderr
    assert_bit_identical(run, uninterrupted)
