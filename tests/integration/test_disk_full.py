"""Checkpoints that do not fit: the output folder is a real 40 MB tmpfs (tests run as root).

The model holds 7.5 MB of fp32 weights, so one checkpoint (weights and AdamW's two
moments) takes about 22 MB and the second one no longer fits:

- one process writes all 22 MB itself, so the check before the save refuses it;
- under FSDP(2) with DCP shards each rank writes about 11 MB, so each rank's own check
  passes but together they fill the disk in the middle of the write (ENOSPC), with the
  shards written synchronously or in the background.

Either way: a non-zero exit, one line saying the disk is full (folder, bytes needed and
free), no ``NNNNNN.tmp`` left behind, and the previous ``last`` passes
``lerobot inspect-checkpoint``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from _dist_util import describe, start_ranks, wait_ranks
from conftest import launch_env, run_cli, script, tmpfs

# 1.87 M parameters: 7.5 MB of weights.
MODEL = ["--policy.dim_model=128", "--policy.dim_feedforward=512", "--policy.n_encoder_layers=6"]
RUN = [*MODEL, "--dataset.num_episodes=2", "--dataset.episode_length=20", "--batch_size=2", "--log_freq=1",
       "--steps=4", "--save_freq=2"]


@pytest.fixture
def small_disk(tmp_path):
    """A 40 MB tmpfs, unmounted afterwards."""
    with tmpfs(tmp_path / "disk", "size=40m") as mount:
        yield mount


def assert_clean_refusal(run: Path, output: str) -> None:
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors, output[-4000:]
    for line in errors:
        assert "checkpoint of step 4 not written" in line and str(run / "checkpoints") in line, line
        assert re.search(r" [\d.]+ [KMG]iB free", line), line
        assert "needs about" in line and "still points to 000002" in line, line
    assert "Traceback" not in output
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["000002", "last"]
    inspected = run_cli("inspect-checkpoint", str(run / "checkpoints/last"))
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr


def test_one_process_save_that_cannot_fit_is_refused_before_writing(tmp_path, small_disk):
    run = small_disk / "run"
    result = subprocess.run([script("lerobot"), "train", *RUN, f"--output_dir={run}"], capture_output=True,
                            text=True, timeout=600, cwd=tmp_path, env=launch_env(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    assert_clean_refusal(run, output)
    [line] = [line for line in output.splitlines() if line.startswith("error:")]
    assert "rank 0 needs about" in line


@pytest.mark.parametrize("background", [False, True], ids=["synchronous", "async_checkpoint"])
def test_fsdp_ranks_that_fill_the_disk_together_remove_the_partial_checkpoint(tmp_path, small_disk, background):
    run = small_disk / "run"
    argv = [script("lerobot"), "train", *RUN, "--parallelism.dp_shard=2", "--checkpoint_format=dcp",
            f"--async_checkpoint={str(background).lower()}", f"--output_dir={run}"]
    ranks = start_ranks(argv, 2, tmp_path)
    codes = wait_ranks(ranks, timeout=600)
    assert all(code != 0 for code in codes), describe(ranks)
    main = ranks[0].output()
    assert "is full (No space left on device while writing it" in main, describe(ranks)
    assert_clean_refusal(run, main)
