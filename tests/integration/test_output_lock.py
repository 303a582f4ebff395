"""One writer per output folder, through the installed ``lerobot train``: a second run on a
folder in use is refused in one line naming the holder while the first keeps writing its
own checkpoints; a run killed with SIGKILL leaves its lock, and the requeued command takes
it over and resumes; a lock from another host is taken over once its heartbeat is stale;
a restart waits for a live holder to end; a run stopped with SIGSTOP keeps its lock however
old its heartbeat, and finishes once continued; a named pipe at the lock's path is one line,
not a hang. ``lerobot plan`` and ``inspect-checkpoint`` neither take nor mind the lock. Real
processes and signals; ``subprocess`` timeouts and ``wait_until`` deadlines are the
watchdogs."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from conftest import TINY_ACT, launch_env, run_cli, script

LOCK = ".lerobot-kit.lock"
HOST = socket.gethostname()
SMALL_DATA = ["--dataset.num_episodes=2", "--dataset.episode_length=20"]
RUN = [*TINY_ACT, *SMALL_DATA, "--batch_size=4", "--log_freq=10", "--seed=3"]
# Stopped by the test long before the end: a signal (exit 75) or SIGKILL.
ENDLESS = "--steps=100000"

# A live run's lock, held by the lock module itself in a process that imports no torch,
# until SIGTERM: a holder whose end the test chooses.
HOLDER = """
import signal, sys, time
from pathlib import Path
from lerobot_kit.core.run.output.lock import Claimant, OutputLock
lock = OutputLock(Claimant.current(restarting=False), heartbeat_s=0.5)
lock.acquire(Path(sys.argv[1]))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("held", flush=True)
try:
    while True:
        time.sleep(0.1)
finally:
    lock.release()
"""


def start(workdir: Path, *args: str, env: dict[str, str] | None = None, log: str = "train.log") -> subprocess.Popen:
    """``lerobot train ARGS`` in the background, its output in ``workdir/log``."""
    with open(workdir / log, "w") as out:
        return subprocess.Popen([script("lerobot"), "train", *args], cwd=workdir, env=launch_env(workdir, env),
                                stdout=out, stderr=subprocess.STDOUT, text=True)


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the process ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def finish(proc: subprocess.Popen, timeout: float = 300) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"still running after {timeout} s") from None


def the_one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def step_folders(run: Path) -> list[Path]:
    return sorted(p for p in (run / "checkpoints").iterdir() if p.name.isdigit())


def test_a_second_run_is_refused_while_the_first_runs_and_the_first_keeps_its_own_checkpoints(tmp_path):
    run = tmp_path / "run"
    first = start(tmp_path, *RUN, ENDLESS, "--save_freq=20", f"--output_dir={run}")
    try:
        wait_until(lambda: (run / "checkpoints/last").exists(), first, "the first checkpoint")
        held = (run / LOCK).read_bytes()
        record = json.loads(held)
        assert (record["host"], record["pid"]) == (HOST, first.pid)

        # The same command again, as a requeue would send it, with a save schedule of its own
        # (a setting a resume may change): a step folder of it would show.
        second = run_cli("train", *RUN, ENDLESS, "--save_freq=10", "--resume=auto", f"--output_dir={run}",
                         cwd=tmp_path, timeout=300)
        assert first.poll() is None, "the first run ended before the second was refused"
        assert second.returncode == 1, second.stdout + second.stderr
        line = the_one_error_line(second)
        assert line.startswith(
            f"error: --output_dir={run} is in use by another run (host {HOST}, pid {first.pid}, "
            f"started {record['started']}; its lock {run / LOCK} was refreshed "
        ), line
        assert "pass another --output_dir" in line and line.endswith("Nothing was written")

        plan = run_cli("plan", "--world_size=1", *RUN, ENDLESS, "--resume=auto", f"--output_dir={run}",
                       cwd=tmp_path, timeout=300)
        assert plan.returncode == 0, plan.stdout + plan.stderr
        inspected = run_cli("inspect-checkpoint", str(run / "checkpoints/000020"), cwd=tmp_path)
        assert inspected.returncode == 0, inspected.stdout + inspected.stderr
        assert (run / LOCK).read_bytes() == held  # neither took it nor changed it
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGTERM)
        code = finish(first)
    output = (tmp_path / "train.log").read_text()
    assert code == 75 and "stopped by SIGTERM" in output, output[-4000:]
    assert not (run / LOCK).exists()  # released on the way out

    saved = step_folders(run)
    assert saved and (run / "checkpoints/last").resolve() == saved[-1]
    for folder in saved:
        config = json.loads((folder / "pretrained_model/train_config.json").read_text())
        step = json.loads((folder / "training_state/training_step.json").read_text())["step"]
        assert (config["seed"], config["save_freq"], step) == (3, 20, int(folder.name)), folder
    assert all(int(f.name) % 20 == 0 for f in saved[:-1]), [f.name for f in saved]


def test_a_requeue_after_kill_9_takes_the_dead_runs_lock_over_and_resumes(tmp_path):
    run = tmp_path / "run"
    first = start(tmp_path, *RUN, ENDLESS, "--save_freq=20", f"--output_dir={run}")
    try:
        wait_until(lambda: (run / "checkpoints/last").exists(), first, "the first checkpoint")
    finally:
        first.kill()
        first.wait()
    record = json.loads((run / LOCK).read_text())
    assert record["pid"] == first.pid  # SIGKILL leaves the lock behind
    last = (run / "checkpoints/last").resolve()
    step = int(last.name)

    requeued = run_cli("train", *RUN, f"--steps={step + 10}", "--save_freq=20", "--resume=auto",
                       f"--output_dir={run}", cwd=tmp_path, timeout=300)
    output = requeued.stdout + requeued.stderr
    assert requeued.returncode == 0, output[-4000:]
    assert (f"took over the lock {run / LOCK} of a run that is over (host {HOST}, pid {first.pid}, started "
            f"{record['started']}): its process {first.pid} is gone") in output
    assert f"--resume=auto: continuing from {last} (step {step})" in output
    assert (run / f"checkpoints/{step + 10:06d}").is_dir()
    assert not (run / LOCK).exists()


def test_a_lock_from_another_host_refuses_the_run_until_its_heartbeat_is_stale(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lock = run / LOCK
    lock.write_text(json.dumps({"host": "node-17", "pid": 4242, "started": "2026-11-30T08:00:00+00:00"}))
    planted = lock.read_bytes()

    refused = run_cli("train", *RUN, "--steps=2", f"--output_dir={run}", cwd=tmp_path, timeout=300)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert the_one_error_line(refused).startswith(
        f"error: --output_dir={run} is in use by another run (host node-17, pid 4242, started "
        "2026-11-30T08:00:00+00:00; ")
    assert os.listdir(run) == [LOCK] and lock.read_bytes() == planted  # nothing written, nothing changed

    an_hour_ago = time.time() - 3600
    os.utime(lock, (an_hour_ago, an_hour_ago))
    taken = run_cli("train", *RUN, "--steps=2", f"--output_dir={run}", cwd=tmp_path, timeout=300)
    output = taken.stdout + taken.stderr
    assert taken.returncode == 0, output[-4000:]
    assert re.search(
        rf"took over the lock {re.escape(str(lock))} of a run that is over \(host node-17, pid 4242, started "
        r"2026-11-30T08:00:00\+00:00\): its heartbeat is 3[6-9]\d\d s old \(more than 120 s\)", output), output[-4000:]
    assert (run / "checkpoints/000002").is_dir() and not lock.exists()


def test_a_restart_waits_for_a_live_holder_to_end_then_runs(tmp_path):
    """A SLURM requeue whose old job is still ending: it waits (a fresh start is refused at once)."""
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    restart = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        restart = start(tmp_path, *RUN, "--steps=2", f"--output_dir={run}", env={"SLURM_RESTART_COUNT": "1"})
        log = tmp_path / "train.log"
        wait_until(lambda: "waiting up to 120 s" in log.read_text(), restart, "the restart to wait")
        assert f"is locked by host {HOST}, pid {holder.pid}" in log.read_text()
        holder.send_signal(signal.SIGTERM)
        assert finish(holder, timeout=60) == 0
        code = finish(restart)
    finally:
        for proc in (holder, restart):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    output = log.read_text()
    assert code == 0, output[-4000:]
    assert f"restart 1 of this run: no checkpoint in {run} yet, starting from step 0" in output
    assert (run / "checkpoints/000002").is_dir() and not (run / LOCK).exists()


def test_a_stopped_run_keeps_its_lock_however_old_its_heartbeat_and_finishes_once_continued(tmp_path):
    """A debugger, a swapped-out node, SIGSTOP: the run beats no more, but its process lives.
    Before, a second run took the lock over after 120 s and both wrote the same step folders."""
    run = tmp_path / "run"
    first = start(tmp_path, *RUN, "--steps=20", "--save_freq=10", f"--output_dir={run}")
    try:
        wait_until(lambda: (run / "checkpoints/last").exists(), first, "the first checkpoint")
        first.send_signal(signal.SIGSTOP)
        an_hour_ago = time.time() - 3600
        os.utime(run / LOCK, (an_hour_ago, an_hour_ago))  # its heartbeat stopped an hour ago
        record = json.loads((run / LOCK).read_text())

        second = run_cli("train", *RUN, "--steps=20", "--save_freq=10", f"--output_dir={run}", cwd=tmp_path,
                         timeout=120)
        assert second.returncode == 1, second.stdout + second.stderr
        line = the_one_error_line(second)
        assert re.match(
            rf"error: --output_dir={re.escape(str(run))} is in use by another run \(host {re.escape(HOST)}, pid "
            rf"{first.pid}, started {re.escape(record['started'])}; its lock {re.escape(str(run / LOCK))} was "
            r"refreshed 36\d\d s ago, but its process is stopped \(SIGSTOP, or a debugger\) on this host, and a live "
            rf"process keeps its lock however old\), and two runs writing one folder would mix their checkpoints: let "
            rf"that run go on \(kill -CONT {first.pid}\) and end, or pass another --output_dir", line), line
        assert json.loads((run / LOCK).read_text()) == record  # not taken over

        first.send_signal(signal.SIGCONT)
        code = finish(first, timeout=120)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
            first.wait()
    output = (tmp_path / "train.log").read_text()
    assert code == 0 and "done: 20 steps" in output, output[-4000:]
    assert "of this run was" not in output, output[-4000:]  # its heartbeat found the lock still its own
    assert [f.name for f in step_folders(run)] == ["000010", "000020"] and not (run / LOCK).exists()


def test_a_named_pipe_at_the_locks_path_is_one_line_not_a_hang(tmp_path):
    """Before, opening it to read the holder blocked forever (no writer ever comes)."""
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / LOCK)
    result = run_cli("train", *RUN, "--steps=2", f"--output_dir={run}", cwd=tmp_path, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert the_one_error_line(result) == (
        f"error: the lock of --output_dir={run}, {run / LOCK}, is a named pipe (FIFO), not a file a run wrote, so no "
        f"run can hold the folder while it is there: remove it (rm {run / LOCK}), then start the run again. Nothing "
        "was written")
    assert os.listdir(run) == [LOCK]
