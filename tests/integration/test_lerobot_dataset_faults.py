"""``lerobot train`` on LeRobot v3.0 datasets that used to hang or poison the run.

- A video dataset without ``meta/stats.json``: the training process decodes camera frames
  for the stats, then forks DataLoader workers. They inherited its open decoders and
  deadlocked freeing them, so the run never reached step 1; now it trains.
- A DataLoader worker killed mid-run (as the kernel's out-of-memory killer kills one) used to
  end the run as an "internal error": DataLoader's SIGCHLD handler raises the death inside
  whatever the training process runs at that moment. Now it is one line naming the flags
  that lower the loader's memory, exit 1.
- A NaN in ``meta/stats.json`` turned every weight into NaN at the first step; now the
  dataset is refused when it is opened, in one line naming the file, the entry and the fix.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _dist_util import without_launcher_vars
from conftest import TINY_ACT, launch_env, read_metrics, run_cli, script
from lerobot_dataset_factory import write_lerobot_dataset


def test_a_video_dataset_without_stats_trains_with_workers(tmp_path):
    root = tmp_path / "user" / "video"
    write_lerobot_dataset(root, [20, 20], video=True, stats=False)
    out = tmp_path / "run"
    result = run_cli("train", "--dataset.repo_id=user/video", f"--dataset.root={root}", *TINY_ACT, "--num_workers=2",
                     "--steps=4", "--log_freq=1", "--batch_size=4", f"--output_dir={out}", env=launch_env(tmp_path),
                     timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [row["step"] for row in read_metrics(out)] == [1, 2, 3, 4]
    assert (out / "checkpoints/last/pretrained_model/model.safetensors").is_file()


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return sorted(int(child) for task in tasks.iterdir() for child in (task / "children").read_text().split())


@contextlib.contextmanager
def _two_worker_run(
    tmp_path: Path, flags: list[str], logged_steps: int
) -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """``lerobot train`` on a video dataset with two DataLoader workers, yielded with the
    workers' pids once it has logged ``logged_steps`` steps; its stderr goes to
    ``tmp_path / "stderr.log"``. The run and its workers are killed on exit."""
    root = tmp_path / "user" / "video"
    write_lerobot_dataset(root, [40, 40], video=True)
    out = tmp_path / "run"
    command = [script("lerobot"), "train", "--dataset.repo_id=user/video", f"--dataset.root={root}", *TINY_ACT,
               *flags, "--num_workers=2", "--steps=100000", "--log_freq=1", "--batch_size=4", "--save_freq=100000",
               f"--output_dir={out}"]
    with (tmp_path / "stderr.log").open("w") as stderr_file:
        run = subprocess.Popen(command, env={**without_launcher_vars(), **launch_env(tmp_path)},
                               stdout=subprocess.DEVNULL, stderr=stderr_file)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (out / "logs/metrics.jsonl").is_file() or len(read_metrics(out)) < logged_steps:
            assert run.poll() is None and time.monotonic() < deadline, "no step logged"
            time.sleep(0.05)
        workers = _children(run.pid)
        assert len(workers) == 2, workers
        yield run, workers
    finally:
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
        run.kill()


@pytest.mark.parametrize(("sampler", "fix"), [
    ([], "Lower --num_workers if the machine ran out of memory"),
    (["--dataset.sampler.type=episode_blocks", "--dataset.sampler.buffer_size=16"],
     "Lower --num_workers or --dataset.sampler.buffer_size (each worker holds two windows of it) if"),
], ids=["random", "episode_blocks"])
def test_a_killed_worker_ends_the_run_in_one_line_naming_what_to_lower(tmp_path, sampler, fix):
    with _two_worker_run(tmp_path, sampler, logged_steps=1) as (run, workers):
        os.kill(workers[0], signal.SIGKILL)
        run.wait(timeout=60)
    stderr = (tmp_path / "stderr.log").read_text()
    assert run.returncode == 1, stderr[-3000:]
    lines = stderr.splitlines()
    assert lines[-1].startswith("error: DataLoader worker ") and fix in lines[-1], stderr[-3000:]
    assert not [line for line in lines if line.startswith("Traceback")], stderr[-3000:]


def test_stopped_workers_end_the_run_after_the_timeout_in_one_line(tmp_path):
    """Stopped after sending, a worker never hands over its batch's shared memory: without a
    bound on that handover the run waited for ever, whatever --parallelism.timeout_s said."""
    with _two_worker_run(tmp_path, ["--parallelism.timeout_s=5"], logged_steps=5) as (run, workers):
        for worker in workers:
            os.kill(worker, signal.SIGSTOP)
        run.wait(timeout=60)
    stderr = (tmp_path / "stderr.log").read_text()
    assert run.returncode == 1, stderr[-3000:]
    assert stderr.splitlines()[-1] == (
        "error: no batch from the DataLoader workers in 5 s (--parallelism.timeout_s); a worker is stuck reading "
        "the dataset or handing over its batch"
    ), stderr[-3000:]
    assert "Traceback" not in stderr


def test_nan_in_stats_json_is_refused_when_the_dataset_is_opened(tmp_path):
    root = tmp_path / "user" / "nan"
    write_lerobot_dataset(root, [10, 10])
    stats_file = root / "meta/stats.json"
    stats = json.loads(stats_file.read_text())
    stats["action"]["std"][1] = float("nan")
    stats_file.write_text(json.dumps(stats))
    out = tmp_path / "run"
    result = run_cli("train", "--dataset.repo_id=user/nan", f"--dataset.root={root}", *TINY_ACT, "--steps=2",
                     f"--output_dir={out}", env=launch_env(tmp_path), timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"error: {stats_file}: action.std[1] is nan, not a finite float32; normalising with it would turn every "
        "weight into NaN. fix: correct it, or remove the 'action' entry from meta/stats.json to have its stats "
        "computed from the data"
    ]
    assert not out.exists()
