"""A Kubeflow PyTorchJob pod's environment, as the training operator (v1.7 and later) sets it,
read by the launchers: one process per pod without torchrun, torchrun's ranks with it, and
the mistakes that would make each pod train alone refused in one line. Also which launchers
are the parent of the process they start (``LaunchEnv.parent_is_launcher``)."""

from __future__ import annotations

import pytest

from lerobot_kit.core.errors import ConfigError


def pod(index: int, pods: int = 3, per_pod: str = "auto") -> dict[str, str]:
    """The operator's variables in pod ``index`` (0: the master) of a job named train."""
    world = pods * (int(per_pod) if per_pod.isdigit() else 1)
    return {
        "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "train-master-0", "PET_MASTER_ADDR": "train-master-0",
        "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "WORLD_SIZE": str(world), "RANK": str(index),
        "PET_NODE_RANK": str(index), "PET_NPROC_PER_NODE": per_pod, "PET_NNODES": str(pods),
    }


def detect(env: dict[str, str]) -> tuple[str, object]:
    from lerobot_kit.core.distributed.process_group import detect_launcher

    launcher = detect_launcher(env)
    return launcher.name, launcher.read(env)


def test_a_pod_running_lerobot_train_itself_is_one_rank_of_the_job() -> None:
    name, launch = detect(pod(2))
    assert name == "pytorchjob"
    assert (launch.rank, launch.local_rank, launch.world_size, launch.master_addr, launch.master_port) == (
        2, 0, 3, "train-master-0", 23456)
    assert launch.restart_count == 0 and not launch.parent_is_launcher  # a restarted pod resumes with --resume=auto


def test_a_pod_whose_command_is_torchrun_has_torchruns_ranks() -> None:
    rank = {**pod(1, per_pod="2"), "TORCHELASTIC_RUN_ID": "none", "RANK": "3", "LOCAL_RANK": "1",
            "WORLD_SIZE": "6", "MASTER_PORT": "23456", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    name, launch = detect(rank)
    assert name == "torchrun" and (launch.rank, launch.local_rank, launch.world_size) == (3, 1, 6)
    assert launch.parent_is_launcher  # torchrun's agent: a rank it started stops if it dies


@pytest.mark.parametrize(("env", "match"), [
    (pod(0, per_pod="4"), (r"the PyTorchJob asks for 4 processes per pod \(nprocPerNode, PET_NPROC_PER_NODE=4\) "
                           r"but its container runs one: make the container's command `torchrun \$\(which lerobot\) "
                           r"train")),
    # Kubeflow Trainer's TrainJob sets only the PET_* variables, for torchrun.
    ({k: v for k, v in pod(1).items() if k.startswith("PET_")},
     (r"PET_NNODES=3 is set \(a Kubeflow job of several pods\) but this process was not started by torchrun, so "
      r"each pod would train alone")),
])
def test_a_job_whose_pods_would_train_alone_is_one_line(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        detect(env)


def test_which_launchers_are_the_parent_of_their_processes() -> None:
    assert detect({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                   "MASTER_ADDR": "h"})[1].parent_is_launcher
    srun = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "n1"}
    assert detect(srun)[1].parent_is_launcher  # slurmstepd
    # Ranks started by hand (or by a test) with torch's variables, and a plain process: not watched.
    assert not detect({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})[1].parent_is_launcher
    assert not detect({"HOME": "/root"})[1].parent_is_launcher
