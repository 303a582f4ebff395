"""Before and during the first step of ``lerobot train``: a stop signal and a hang.

- A stop signal while the run starts (here: while a dataset plugin's factory builds the
  dataset) ends it at once with exit 75 and one line; before, SIGTERM killed the process
  with no word and Ctrl-C gave a traceback — or, once the loop's handler was installed,
  the request waited for a step boundary that a hung first step never reached.
- ``--parallelism.step_timeout_s`` times the first step too, with its allowance (ten times
  the limit, for warm-up and compilation); before, a hang there was never reported.
- A DataLoader worker stuck in a read: the DataLoader's timeout ends the run with one line
  and the stuck worker is killed; before, the training process then waited for it
  forever at exit (workers ignore SIGTERM, so that a stopping run can save first).

Real processes of the installed console script, real signals, each with a watchdog.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import TINY_ACT, launch_env, script
from plugin_dists import env_with, make_distribution

SLOW_DATASET_PLUGIN = '''
import os
import time
from pathlib import Path
from typing import Callable

from lerobot_kit.api import DatasetConfig, hookimpl


class SlowDataConfig(DatasetConfig):
    type: str = "slowdata"


def make(config, delta_indices):
    """A dataset that takes long to build (a download, a large index): says so, then waits."""
    Path(os.environ["SLOWDATA_STARTED"]).touch()
    time.sleep(300)


@hookimpl
def lerobot_register_datasets(register: Callable) -> None:
    register("slowdata", SlowDataConfig, "slowdata:make")
'''
STUCK_WORKER_PLUGIN = '''
import os
import time
from pathlib import Path
from typing import Callable

from lerobot_kit.api import DatasetConfig, hookimpl
from lerobot_kit.core.data.dataset import PolicyDataset
from lerobot_kit.plugins.datasets.reach.data import make_reach_dataset
from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig


class StuckDataConfig(DatasetConfig):
    type: str = "stuckdata"


class StuckInWorkers(PolicyDataset):
    """The reach task, read in DataLoader workers from storage that stopped answering."""

    def __init__(self, inner):
        self.inner, self.meta, self.training_process = inner, inner.meta, os.getpid()

    def __len__(self):
        return len(self.inner)

    def episode_lengths(self):
        return self.inner.episode_lengths()

    def item(self, i, *, uint8_cameras=False):
        if os.getpid() != self.training_process:
            Path(os.environ["STUCK_WORKER_PID"]).write_text(str(os.getpid()))
            time.sleep(3600)
        return self.inner.item(i, uint8_cameras=uint8_cameras)


def make(config, delta_indices):
    return StuckInWorkers(make_reach_dataset(ReachDatasetConfig(num_episodes=2, episode_length=20), delta_indices))


@hookimpl
def lerobot_register_datasets(register: Callable) -> None:
    register("stuckdata", StuckDataConfig, "stuckdata:make")
'''
STEP_TIMEOUT_S = 2
DATA_TIMEOUT_S = 5


def _as_in_a_terminal() -> None:
    """A background job of a non-interactive shell starts with SIGINT ignored: give the run
    the disposition a terminal's Ctrl-C meets."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _finish(proc: subprocess.Popen[str], timeout: float) -> str:
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running after {timeout} s: {proc.communicate()[0][-4000:]}") from None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl_c"])
def test_a_stop_signal_during_start_up_ends_the_run_at_once_with_75(tmp_path: Path, signum: signal.Signals) -> None:
    site = make_distribution(tmp_path / "site", "slowdata", SLOW_DATASET_PLUGIN)
    started = tmp_path / "dataset_build_started"
    run = tmp_path / "run"
    env = {**launch_env(tmp_path), **env_with(site, SLOWDATA_STARTED=str(started))}
    proc = subprocess.Popen([script("lerobot"), "train", "--dataset.type=slowdata", *TINY_ACT, "--steps=5",
                             f"--output_dir={run}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_as_in_a_terminal)
    deadline = time.monotonic() + 120
    while not started.exists():
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "the dataset build never started"
        time.sleep(0.05)
    signalled = time.monotonic()
    proc.send_signal(signum)
    output = _finish(proc, 60)
    assert proc.returncode == 75, output[-4000:]
    assert time.monotonic() - signalled < 20, output[-4000:]
    name = signal.Signals(signum).name
    assert output.splitlines()[-2:] == [
        f"rank 0: {name} received during start-up; stopping now (no step has run, so there is nothing to save)",
        f"error: stopped by {name} during start-up, before the first step; no checkpoint was written, so rerunning "
        "the same command starts where this one did",
    ]
    assert "Traceback" not in output
    assert not (run / "checkpoints").exists()


def test_the_step_watchdog_times_the_first_step_with_its_allowance(tmp_path: Path) -> None:
    fault_log = tmp_path / "faults.jsonl"
    env = launch_env(tmp_path, {"LEROBOT_KIT_FAULT": "point=forward,step=1,rank=0,action=hang",
                                "LEROBOT_KIT_FAULT_LOG": str(fault_log)})
    proc = subprocess.Popen([script("lerobot"), "train", *TINY_ACT, "--dataset.num_episodes=2",
                             "--dataset.episode_length=20", "--batch_size=4", "--steps=5",
                             f"--parallelism.step_timeout_s={STEP_TIMEOUT_S}", f"--output_dir={tmp_path / 'run'}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = _finish(proc, 240)
    [fault] = [json.loads(line) for line in fault_log.read_text().splitlines()]
    assert (fault["step"], fault["action"]) == (1, "hang")
    hung_for = time.time() - fault_log.stat().st_mtime
    allowance = 10 * STEP_TIMEOUT_S
    assert proc.returncode == 124, output[-4000:]
    assert allowance <= hung_for < allowance + 30, output[-4000:]
    assert re.search(rf"rank 0: step 1 has run for \d+ s, longer than {allowance} s, the first step's allowance "
                     rf"\(10 x --parallelism.step_timeout_s={STEP_TIMEOUT_S}\); the stack of every thread of this "
                     "rank follows", output), output[-4000:]
    assert "fault_injection.py" in output  # the hung main thread's stack, down to where it hangs


def _gone(pid: int) -> bool:
    """No such process, or one that has exited and waits to be reaped."""
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "\nState:\tZ" in status.read_text()


def test_a_worker_stuck_in_a_read_ends_the_run_with_one_line_and_is_killed(tmp_path: Path) -> None:
    site = make_distribution(tmp_path / "site", "stuckdata", STUCK_WORKER_PLUGIN)
    worker_pid = tmp_path / "worker_pid"
    env = {**launch_env(tmp_path), **env_with(site, STUCK_WORKER_PID=str(worker_pid))}
    proc = subprocess.Popen([script("lerobot"), "train", "--dataset.type=stuckdata", *TINY_ACT, "--num_workers=1",
                             "--batch_size=4", "--steps=3", f"--parallelism.timeout_s={DATA_TIMEOUT_S}",
                             f"--output_dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    output = _finish(proc, 120)
    assert proc.returncode == 1, output[-4000:]
    assert output.splitlines()[-1] == (
        f"error: no batch from the DataLoader workers in {DATA_TIMEOUT_S} s (--parallelism.timeout_s); a worker is "
        "stuck reading the dataset or handing over its batch"
    ), output[-4000:]
    assert "Traceback" not in output
    assert _gone(int(worker_pid.read_text()))
