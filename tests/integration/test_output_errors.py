"""The run's output refused by the file system mid-run (tests run as root, so real mounts).

- A file system remounted read-only after the first checkpoint: the next save fails when
  it creates its ``NNNNNN.tmp`` folder, so nothing of it exists (a read-only file system
  could not remove it either). Every rank exits 1 with the same one line naming the path
  and ``EROFS``; ``checkpoints/last`` still points to the first checkpoint, which
  ``inspect-checkpoint`` calls valid. The ranks are frozen (SIGSTOP) the moment ``last``
  appears, while the file system is remounted, so the failing save is step 4's (a later
  one only if the freeze came late, on a very busy machine).
- ``logs/metrics.jsonl`` on a read-only bind mount: the main process alone writes it,
  yet both ranks stop at the same step with the same line, and the checkpoints stay intact.
- trackio's folder remounted read-only mid-run: trackio carries on without storing; the
  run says so in one warning line (path and errno) and finishes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _dist_util import Rank, describe, start_ranks, wait_ranks
from conftest import TINY_ACT, launch_env, read_metrics, run_cli, script, tmpfs
from inotify_watch import IN_CREATE, IN_MOVED_TO, Watch

RUN = [*TINY_ACT, "--dataset.num_episodes=2", "--dataset.episode_length=20", "--batch_size=2"]


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def wait_for_entry(watch: Watch, folder: Path, name: str, procs: list[subprocess.Popen], timeout: float) -> None:
    """Block until ``folder/name`` exists (created or renamed into place), watched by inotify;
    fails at once when a process of the run ended before."""
    deadline = time.monotonic() + timeout
    while not os.path.lexists(folder / name):
        assert time.monotonic() < deadline, f"{folder / name} did not appear within {timeout}s"
        assert all(p.poll() is None for p in procs), f"the run ended before {folder / name} appeared"
        watch.events(wait=0.5)


def launch(argv: list[str], world_size: int, workdir: Path) -> list[Rank]:
    """``argv`` as one plain process (no launcher variables) or as ``world_size`` ranks; output to log files."""
    if world_size > 1:
        return start_ranks(argv, world_size, workdir)
    log = workdir / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=launch_env(workdir))
    return [Rank(0, proc, log)]


def remount_read_only_after_first_checkpoint(watch: Watch, run: Path, mount: Path,
                                              procs: list[subprocess.Popen]) -> None:
    """The moment ``run/checkpoints/last`` appears, freeze the processes (SIGSTOP), remount
    ``mount`` read-only and let them go on: the run is then between steps 2 and 4."""
    wait_for_entry(watch, run, "checkpoints", procs, timeout=240)
    watch.add(run / "checkpoints", IN_MOVED_TO)
    wait_for_entry(watch, run / "checkpoints", "last", procs, timeout=240)
    pids = [p.pid for p in procs]
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        for pid in pids:
            while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
                time.sleep(0.001)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("world_size", [1, 2], ids=["one_process", "two_ranks"])
def test_a_read_only_remount_after_the_first_checkpoint_is_one_line_with_last_intact(tmp_path, world_size):
    with tmpfs(tmp_path / "disk", "size=64m") as disk:
        run = disk / "run"
        run.mkdir()
        argv = [script("lerobot"), "train", *RUN, "--steps=8", "--save_freq=2", "--log_freq=100",
                f"--output_dir={run}"]
        with Watch() as watch:
            watch.add(run, IN_CREATE)
            ranks = launch(argv, world_size, tmp_path)
            try:
                remount_read_only_after_first_checkpoint(watch, run, disk, [r.proc for r in ranks])
            finally:
                codes = wait_ranks(ranks, timeout=240)  # kills every rank if one outlives the limit
        outputs = [r.output() for r in ranks]
        context = "\n---\n".join(o[-3000:] for o in outputs)
        assert codes == [1] * world_size, context
        lines = [error_lines(output) for output in outputs]
        assert all(len(found) == 1 for found in lines), context
        assert all(found == lines[0] for found in lines), context  # every rank says the same
        [line] = lines[0]
        step = int(line.removeprefix("error: checkpoint of step ").split(" ", 1)[0])
        assert step in (4, 6, 8), line
        tmp = run / "checkpoints" / f"{step:06d}.tmp"
        assert line == (
            f"error: checkpoint of step {step} not written: {tmp}: Read-only file system (errno EROFS); nothing of it "
            f"was written; checkpoints/last still points to {step - 2:06d}; the file system became read-only: remount "
            "it read-write (or move the run's folder), then resume"), line
        assert not any("Traceback" in output for output in outputs), context
        published = [f"{s:06d}" for s in range(2, step, 2)]
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [*published, "last"]
        assert os.readlink(run / "checkpoints" / "last") == published[-1]
        inspected = run_cli("inspect-checkpoint", str(run / "checkpoints" / "last"))
        assert inspected.returncode == 0, inspected.stdout + inspected.stderr
        assert "valid" in inspected.stdout, inspected.stdout


@contextlib.contextmanager
def read_only_bind(folder: Path) -> Iterator[Path]:
    """``folder`` bind-mounted read-only onto itself (root ignores file modes), unmounted afterwards."""
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_metrics_log_that_cannot_be_written_stops_every_rank_at_one_step_with_one_line(tmp_path):
    run = tmp_path / "run"
    first = run_cli("train", *RUN, "--steps=2", "--save_freq=2", "--log_freq=1", f"--output_dir={run}",
                    cwd=tmp_path, env=launch_env(tmp_path), timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    metrics = run / "logs" / "metrics.jsonl"
    rows_before = metrics.read_text()
    argv = [script("lerobot"), "train", *RUN, "--steps=6", "--save_freq=2", "--log_freq=1", "--resume=true",
            f"--output_dir={run}"]
    with read_only_bind(run / "logs"):
        ranks = start_ranks(argv, 2, tmp_path)
        codes = wait_ranks(ranks, timeout=300)
    assert codes == [1, 1], describe(ranks)
    lines = [error_lines(r.output()) for r in ranks]
    assert lines[0] == lines[1] and len(lines[0]) == 1, describe(ranks)
    [line] = lines[0]
    assert line.startswith(f"error: could not write the metrics log: {metrics}: Read-only file system (errno EROFS); "
                           "the run stopped after step "), line
    assert line.endswith("; the file system became read-only: remount it read-write (or move the run's folder), "
                         "then resume (--resume=true)"), line
    assert not any("Traceback" in r.output() for r in ranks), describe(ranks)
    # The first refused row is step 3's; the ranks' stop agreement runs one step behind, so they
    # stop after step 4, whose checkpoint (a separate folder, writable) is published first.
    assert "the run stopped after step 4; checkpoints/last points to 000004;" in line, line
    assert os.readlink(run / "checkpoints" / "last") == "000004"
    assert metrics.read_text() == rows_before
    inspected = run_cli("inspect-checkpoint", str(run / "checkpoints" / "last"))
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr


def test_trackio_storage_turning_read_only_is_one_warning_line_and_the_run_finishes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with tmpfs(tmp_path / "trackio", "size=16m") as trackio_dir:
        argv = [script("lerobot"), "train", *RUN, "--steps=6", "--save_freq=2", "--log_freq=1",
                "--trackio.enable=true", "--trackio.project=kit-tests", f"--output_dir={run}"]
        env = launch_env(tmp_path, {"TRACKIO_DIR": str(trackio_dir)})
        with Watch() as watch:
            watch.add(run, IN_CREATE)
            log = tmp_path / "run.log"
            with open(log, "w") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=env)
            ranks = [Rank(0, proc, log)]
            try:
                remount_read_only_after_first_checkpoint(watch, run, trackio_dir, [proc])
            finally:
                codes = wait_ranks(ranks, timeout=240)
    output = ranks[0].output()
    assert codes == [0], output[-4000:]
    warned = [line for line in output.splitlines() if "trackio could not store" in line]
    assert len(warned) == 1, output[-4000:]
    assert warned[0].endswith(": Read-only file system (errno EROFS); the run goes on, and logs/metrics.jsonl has "
                              "every row"), warned[0]
    assert f"warning: trackio could not store the metrics: {trackio_dir}/" in warned[0]
    assert "UserWarning" not in output and "Traceback" not in output, output[-4000:]
    assert [row["step"] for row in read_metrics(run)] == [1, 2, 3, 4, 5, 6]
