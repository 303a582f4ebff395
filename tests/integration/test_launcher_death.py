"""A rank whose launcher dies stops by itself (``core.run.reliability.launcher_watch``): torchrun's agent,
started as a Kubeflow PyTorchJob pod starts it (the operator's ``PET_*`` variables, no
flags), is SIGKILLed mid-run; both of its ranks, each in a session of its own and so
reached by nothing, notice their new parent, agree on a step, save a checkpoint there and
exit 75 within seconds. The orphans are collected by a supervisor process that makes
itself their subreaper, as an init system would, so their exit codes can be read.
Real processes and signals; every wait has a deadline."""

from __future__ import annotations

import json
import subprocess
import sys

from _dist_util import free_port
from conftest import TINY_ACT, launch_env, script

RUN = [*TINY_ACT, "--dataset.num_episodes=2", "--dataset.episode_length=20", "--batch_size=4", "--log_freq=10",
       "--seed=3", "--steps=100000", "--save_freq=10"]
EXIT_WITHIN_S = 10

# argv: run folder, log file, launcher command. Starts the launcher, kills it with SIGKILL once
# the run's first checkpoint is published, then reaps its orphaned workers; prints JSON.
SUPERVISOR = """
import ctypes, json, os, signal, subprocess, sys, time
from pathlib import Path
PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
run, log = Path(sys.argv[1]), open(sys.argv[2], "w")
agent = subprocess.Popen(sys.argv[3:], stdout=log, stderr=subprocess.STDOUT)
deadline = time.monotonic() + 300
while not (run / "checkpoints/last").exists():
    if agent.poll() is not None or time.monotonic() > deadline:
        agent.kill()
        print(json.dumps({"error": f"no checkpoint before the launcher ended (exit {agent.wait()})"}))
        sys.exit()
    time.sleep(0.02)
tasks = Path(f"/proc/{agent.pid}/task")
workers = sorted(int(pid) for task in tasks.iterdir() for pid in (task / "children").read_text().split())
agent.kill()
agent.wait()
killed = time.monotonic()
exits = {}
while len(exits) < len(workers) and time.monotonic() < killed + 60:
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid == 0:
        time.sleep(0.02)
    elif pid in workers:
        exits[pid] = [os.waitstatus_to_exitcode(status), time.monotonic() - killed]
for pid in set(workers) - set(exits):
    os.kill(pid, signal.SIGKILL)
print(json.dumps({"workers": workers, "exits": exits}))
"""


def test_ranks_whose_torchrun_agent_is_killed_stop_with_a_checkpoint_within_seconds(tmp_path):
    run, log = tmp_path / "run", tmp_path / "torchrun.log"
    port = str(free_port())
    # What the PyTorchJob operator sets in the container of a one-pod job with nprocPerNode=2.
    pod = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "127.0.0.1",
           "PET_MASTER_PORT": port, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "RANK": "0"}
    torchrun = [script("torchrun"), script("lerobot"), "train", *RUN, f"--output_dir={run}"]
    supervised = subprocess.run([sys.executable, "-c", SUPERVISOR, str(run), str(log), *torchrun],
                                capture_output=True, text=True, timeout=420, cwd=tmp_path,
                                env=launch_env(tmp_path, pod))
    output = log.read_text()
    assert supervised.returncode == 0, supervised.stderr + output[-4000:]
    result = json.loads(supervised.stdout)
    assert "error" not in result, result["error"] + output[-4000:]
    assert len(result["workers"]) == 2, result
    exits = result["exits"]
    assert sorted(exits) == sorted(str(pid) for pid in result["workers"]), (result, output[-4000:])
    assert all(code == 75 and seconds < EXIT_WITHIN_S for code, seconds in exits.values()), (exits, output[-4000:])

    # The first rank to notice asks every rank to stop; the other may stop on that agreement
    # before its own watch notices (it polls), so one such line is enough.
    assert any(f"rank {rank}: the launcher that started this rank (pid " in output for rank in (0, 1)), output[-4000:]
    last = (run / "checkpoints/last").resolve()
    step = int(last.name)
    assert f"stopped by SIGTERM at step {step}/100000 after saving {last}" in output, output[-4000:]
    assert json.loads((last / "training_state/training_step.json").read_text())["step"] == step
    assert "Traceback" not in output and not (run / ".lerobot-kit.lock").exists()
    inspected = subprocess.run([script("lerobot"), "inspect-checkpoint", str(last)], capture_output=True, text=True,
                               timeout=120, env=launch_env(tmp_path))
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
