"""A one-process ``lerobot train`` asked to stop: SIGTERM and Ctrl-C save at the step reached
and exit 75, and the resumed run ends bit-identical to one never stopped; with
``--preemption.interrupt=false`` Ctrl-C aborts at once. Real processes, real signals."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import TINY_ACT, built_once, launch_env, pool_train, run_cli, script

SMALL_DATA = ["--dataset.num_episodes=2", "--dataset.episode_length=20"]
RUN = [*TINY_ACT, *SMALL_DATA, "--batch_size=4", "--log_freq=10", "--seed=3", "--steps=400", "--save_freq=200"]


def _as_in_a_terminal() -> None:
    """A background job of a non-interactive shell (``cmd &``, CI runners) starts with SIGINT
    ignored, and so would the run: give it the disposition a terminal's Ctrl-C meets."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(workdir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([script("lerobot"), "train", *args], cwd=workdir, env=launch_env(workdir),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_as_in_a_terminal)


def wait_for_step(proc: subprocess.Popen[str], run: Path, step: int, timeout: float = 300) -> None:
    metrics = run / "logs" / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and f'"step": {step}' in metrics.read_text()):
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "the run never reached the step"
        time.sleep(0.02)


def stop_with(proc: subprocess.Popen[str], signum: int) -> tuple[int, str, float]:
    """Send ``signum``; the exit code, the output and the seconds until exit (a 120 s watchdog)."""
    signalled = time.monotonic()
    proc.send_signal(signum)
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running 120 s after {signal.Signals(signum).name}: {proc.communicate()[0]}")
    return proc.returncode, output, time.monotonic() - signalled


def step_folders(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir() if p.name != "last")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, rank_pools) -> Path:
    """The run never stopped, in a rank pool (``tests/rank_pool.py``): only the stopped runs need processes of their own."""

    def build(root: Path) -> None:
        pool_train(rank_pools, 1, *RUN, f"--output_dir={root / 'run'}", workdir=root, timeout=600)

    return built_once(tmp_path_factory, "preemption_uninterrupted", build) / "run"


def test_sigterm_at_step_30_saves_the_step_reached_and_the_resumed_run_is_bit_identical(tmp_path, uninterrupted):
    run = tmp_path / "run"
    proc = start(tmp_path, *RUN, f"--output_dir={run}")
    wait_for_step(proc, run, 30)
    code, output, seconds = stop_with(proc, signal.SIGTERM)
    assert code == 75 and seconds < 60, output[-4000:]
    [saved] = step_folders(run)
    assert 30 <= int(saved) < 200 and (run / "checkpoints/last").resolve().name == saved
    assert f"stopped by SIGTERM at step {int(saved)}/400 after saving {run / 'checkpoints' / saved}" in output
    assert "Traceback" not in output
    assert run_cli("inspect-checkpoint", str(run / "checkpoints/last")).returncode == 0

    resumed = start(tmp_path, *RUN, f"--output_dir={run}", "--resume=auto")
    output, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, output[-4000:]
    assert f"--resume=auto: continuing from {run / 'checkpoints' / saved} (step {int(saved)})" in output
    ours = load_file(run / "checkpoints/000400/pretrained_model/model.safetensors")
    theirs = load_file(uninterrupted / "checkpoints/000400/pretrained_model/model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_ctrl_c_stops_at_a_step_boundary_with_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    proc = start(tmp_path, *RUN, f"--output_dir={run}")
    wait_for_step(proc, run, 10)
    code, output, _ = stop_with(proc, signal.SIGINT)
    assert code == 75, output[-4000:]
    [saved] = step_folders(run)
    assert f"stopped by SIGINT at step {int(saved)}/400" in output and "Aborted" not in output


def test_ctrl_c_aborts_at_once_when_interrupt_is_off(tmp_path):
    run = tmp_path / "run"
    proc = start(tmp_path, *RUN, f"--output_dir={run}", "--preemption.interrupt=false")
    wait_for_step(proc, run, 10)
    code, output, _ = stop_with(proc, signal.SIGINT)
    assert code not in (0, 75), output[-4000:]
    assert not (run / "checkpoints").exists()
    assert "stopped by" not in output
