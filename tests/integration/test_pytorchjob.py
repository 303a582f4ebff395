"""A Kubeflow PyTorchJob on one machine: two "pods", each a ``lerobot train --resume=auto``
started with exactly the variables the training operator sets in a pod whose container
runs the command itself (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and the
``PET_*`` ones; no ``LOCAL_RANK``), writing one output folder as pods share a volume. The
worker pod is killed with SIGKILL mid-run; the master's rank fails on the lost peer; a
stand-in for the kubelet (``restartPolicy: OnFailure``) restarts every pod that exited
non-zero with the same command and environment, and the job resumes by itself from the
last checkpoint to its end. Real processes and signals; every wait has a deadline."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from _dist_util import free_port
from conftest import TINY_ACT, launch_env, script

STEPS = 30
RUN = [*TINY_ACT, "--dataset.num_episodes=2", "--dataset.episode_length=20", "--batch_size=4", "--log_freq=10",
       "--seed=3", f"--steps={STEPS}", "--save_freq=10", "--resume=auto", "--parallelism.timeout_s=60"]
BACKOFF_S = 1.0  # the kubelet waits 10 s and more between restarts; a shorter wait keeps the test short
JOB_DEADLINE_S = 420


class Pod:
    """One pod of the job: its operator-set environment, and its container's attempts."""

    def __init__(self, index: int, pods: int, port: int, workdir: Path, output_dir: Path) -> None:
        self.index, self.workdir, self.output_dir = index, workdir, output_dir
        self.env = {
            "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1", "PET_MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port), "WORLD_SIZE": str(pods), "RANK": str(index),
            "PET_NODE_RANK": str(index), "PET_NNODES": str(pods), "PET_NPROC_PER_NODE": "auto",
        }
        self.attempts: list[tuple[subprocess.Popen[str], Path]] = []
        self.restart_at: float | None = None

    def start(self) -> None:
        log = self.workdir / f"pod{self.index}.attempt{len(self.attempts)}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([script("lerobot"), "train", *RUN, f"--output_dir={self.output_dir}"],
                                    cwd=self.workdir, env=launch_env(self.workdir, self.env), stdout=out,
                                    stderr=subprocess.STDOUT, text=True)
        self.attempts.append((proc, log))

    @property
    def container(self) -> subprocess.Popen[str]:
        return self.attempts[-1][0]

    def kubelet(self) -> None:
        """restartPolicy: OnFailure — a container that exited non-zero starts again after a backoff."""
        code = self.container.poll()
        if code in (None, 0):
            return
        if self.restart_at is None:
            self.restart_at = time.monotonic() + BACKOFF_S
        elif time.monotonic() >= self.restart_at:
            self.restart_at = None
            self.start()

    def logs(self) -> str:
        return "".join(f"--- pod {self.index} attempt {i} ---\n{log.read_text()[-3000:]}"
                       for i, (_, log) in enumerate(self.attempts))


def test_a_pytorchjob_whose_worker_pod_is_killed_restarts_and_resumes_by_itself(tmp_path):
    run = tmp_path / "pvc" / "run"
    port = free_port()
    pods = [Pod(index, 2, port, tmp_path, run) for index in range(2)]
    try:
        for pod in pods:
            pod.start()
        deadline = time.monotonic() + JOB_DEADLINE_S
        while not (run / "checkpoints/last").exists():
            assert all(pod.container.poll() is None for pod in pods), "\n".join(pod.logs() for pod in pods)
            assert time.monotonic() < deadline, "no checkpoint in time\n" + "\n".join(pod.logs() for pod in pods)
            time.sleep(0.02)
        pods[1].container.kill()  # the worker's node is lost
        while not all(pod.container.poll() == 0 for pod in pods):
            assert time.monotonic() < deadline, "the job did not finish\n" + "\n".join(pod.logs() for pod in pods)
            for pod in pods:
                pod.kubelet()
            time.sleep(0.05)
    finally:
        for pod in pods:
            for proc, _ in pod.attempts:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
    logs = "\n".join(pod.logs() for pod in pods)
    master = pods[0].attempts[-1][1].read_text()
    assert len(pods[0].attempts) >= 2 and len(pods[1].attempts) >= 2, logs  # both restarted
    resumed_from = (run / "checkpoints").resolve()
    assert f"--resume=auto: continuing from {resumed_from}/0000" in master, logs
    assert f"done: {STEPS} steps" in master and "Traceback" not in logs, logs
    assert (run / "checkpoints/last").resolve().name == f"{STEPS:06d}"
    assert not (run / ".lerobot-kit.lock").exists()
