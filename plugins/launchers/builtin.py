"""The built-in launchers: torchrun/elastic, accelerate launch, SLURM srun, a Kubeflow PyTorchJob pod, a plain process.

The contract they implement (and plugin launchers too) is ``lerobot_kit.api.Launcher``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar

from lerobot_kit.api import DEFAULT_MASTER_PORT, ConfigError, LaunchEnv, Launcher, env_int


def _validated(launch: LaunchEnv, source: str) -> LaunchEnv:
    if launch.world_size < 1 or not 0 <= launch.rank < launch.world_size or launch.local_rank < 0:
        raise ConfigError(
            f"{source} reported rank {launch.rank}, local rank {launch.local_rank} and world size "
            f"{launch.world_size}, which is inconsistent: check the launcher's environment"
        )
    return launch


def _torch_style(env: Mapping[str, str], source: str, cpu: bool = False) -> LaunchEnv:
    """RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, as torchrun (and Accelerate) set them,
    and torch elastic's restart count (plus SLURM's requeues), restart budget and whether its
    agent hosts the rendezvous store."""
    return _validated(
        LaunchEnv(
            rank=env_int(env, "RANK"),
            local_rank=env_int(env, "LOCAL_RANK", 0),
            world_size=env_int(env, "WORLD_SIZE"),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=env_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
            cpu=cpu,
            # `srun torchrun` requeued by SLURM starts a new agent whose own count is 0 again.
            restart_count=env_int(env, "TORCHELASTIC_RESTART_COUNT", 0) + _slurm_restarts(env),
            max_restarts=env_int(env, "TORCHELASTIC_MAX_RESTARTS", 0),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            parent_is_launcher="TORCHELASTIC_RUN_ID" in env,  # torch elastic's agent started this process
        ),
        source,
    )


def _slurm_restarts(env: Mapping[str, str]) -> int:
    """How many times SLURM has requeued this job (``scontrol requeue``, preemption with --requeue)."""
    return env_int(env, "SLURM_RESTART_COUNT", 0)


class AccelerateLauncher(Launcher):
    """``accelerate launch``: it runs torch's elastic agent underneath, so its children
    carry torchrun's variables too; it is tried first to report the right launcher and to
    honour ``--cpu``. A one-process ``accelerate launch`` sets no RANK: world size 1."""

    name = "accelerate"
    priority = 10

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        # Every `accelerate launch` code path exports both (plain launches with "no"/"NO").
        return "ACCELERATE_MIXED_PRECISION" in env and "ACCELERATE_DYNAMO_BACKEND" in env

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchEnv:
        cpu = env.get("ACCELERATE_USE_CPU", "").strip().lower() in ("1", "true", "yes")
        if "RANK" not in env:
            return LaunchEnv(rank=0, local_rank=0, world_size=1, master_addr=None, master_port=None, cpu=cpu,
                             restart_count=_slurm_restarts(env))
        return _torch_style(env, "accelerate launch", cpu=cpu)


class TorchrunLauncher(Launcher):
    """``torchrun`` / torch elastic, or any launcher that exports torch's env:// variables."""

    name = "torchrun"
    priority = 20
    REQUIRED: ClassVar[tuple[str, ...]] = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "TORCHELASTIC_RUN_ID" in env or all(key in env for key in cls.REQUIRED)

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchEnv:
        return _torch_style(env, "torchrun")


def first_slurm_host(nodelist: str) -> str:
    """The first host of a compressed SLURM hostlist: ``"gpu[03-05,9],cpu1"`` → ``"gpu03"``.

    Only the first entry matters (task 0 runs on the first node of the step), so only the
    first element of each bracket group is expanded.
    """
    depth, end = 0, len(nodelist)
    for i, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            end = i
            break
    first = nodelist[:end].strip()
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], first)
    if not host or "[" in host or "]" in host:
        raise ConfigError(f"cannot read the first host of SLURM node list {nodelist!r}: set MASTER_ADDR instead")
    return host


class SlurmLauncher(Launcher):
    """One process per task started by ``srun`` (not ``srun torchrun``, which is torchrun's).

    The rendezvous host is ``MASTER_ADDR`` if exported, else the first node of the step;
    the port is ``MASTER_PORT`` if exported, else derived from the job id so concurrent
    jobs sharing a node do not collide.
    """

    name = "slurm"
    priority = 30

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return (
            "SLURM_STEP_ID" in env
            and "SLURM_PROCID" in env
            and "SLURM_NTASKS" in env
            and "TORCHELASTIC_RUN_ID" not in env
        )

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchEnv:
        world_size = env_int(env, "SLURM_NTASKS")
        if "MASTER_ADDR" in env:
            addr = env["MASTER_ADDR"]
        else:
            nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
            if not nodelist:
                raise ConfigError("srun set no SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: export MASTER_ADDR")
            addr = first_slurm_host(nodelist)
        port = env_int(env, "MASTER_PORT", 10000 + env_int(env, "SLURM_JOB_ID", 0) % 20000)
        return _validated(
            LaunchEnv(
                rank=env_int(env, "SLURM_PROCID"),
                local_rank=env_int(env, "SLURM_LOCALID", 0),
                world_size=world_size,
                master_addr=addr,
                master_port=port,
                restart_count=_slurm_restarts(env),
                parent_is_launcher=True,  # slurmstepd
            ),
            "srun",
        )


class PyTorchJobLauncher(Launcher):
    """A pod of a Kubeflow PyTorchJob whose container runs ``lerobot train`` itself: one process per pod.

    The training operator (v1.7 and later) sets in every pod ``MASTER_ADDR`` and
    ``MASTER_PORT`` (the master pod's service), ``WORLD_SIZE`` (pods × ``nprocPerNode``)
    and ``RANK`` (the pod's index: the master 0, worker i i+1), and the same for torchrun as
    ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``, ``PET_NNODES``, ``PET_NODE_RANK`` and
    ``PET_NPROC_PER_NODE``, but no ``LOCAL_RANK``: the one process of a pod is its local rank
    0. A container whose command is ``torchrun`` has ranks of torchrun's (it reads the
    ``PET_*`` variables), which the ``torchrun`` launcher recognises first.
    """

    name = "pytorchjob"
    priority = 25

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "PET_NODE_RANK" in env and "RANK" in env and not any(
            key in env for key in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID"))

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchEnv:
        per_pod = env.get("PET_NPROC_PER_NODE", "auto")
        if per_pod.isdigit() and int(per_pod) > 1:
            raise ConfigError(
                f"the PyTorchJob asks for {per_pod} processes per pod (nprocPerNode, PET_NPROC_PER_NODE={per_pod}) "
                "but its container runs one: make the container's command `torchrun $(which lerobot) train ...`, "
                "which reads the PET_* variables and starts them"
            )
        return _validated(
            LaunchEnv(
                rank=env_int(env, "RANK"),
                local_rank=0,
                world_size=env_int(env, "WORLD_SIZE"),
                master_addr=env.get("MASTER_ADDR") or env.get("PET_MASTER_ADDR") or "127.0.0.1",
                master_port=env_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
            ),
            "the PyTorchJob operator",
        )


class SingleProcessLauncher(Launcher):
    """A plain process: rank 0 of 1, no process group. Always matches, so it is last."""

    name = "single"
    priority = 1000

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return True

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchEnv:
        # A half-set torch environment would otherwise silently train N independent copies.
        if env_int(env, "WORLD_SIZE", 1) > 1:
            missing = [key for key in TorchrunLauncher.REQUIRED if key not in env]
            raise ConfigError(
                f"WORLD_SIZE={env['WORLD_SIZE']} is set but {', '.join(missing)} are not: start the run with "
                "torchrun / accelerate launch / srun, or set every one of RANK, LOCAL_RANK, WORLD_SIZE, "
                "MASTER_ADDR, MASTER_PORT"
            )
        # A multi-node Kubeflow job (TrainJob, or a PyTorchJob of another operator version) whose
        # container runs `lerobot train` itself: every pod would train alone.
        nodes = env.get("PET_NNODES", "1")
        if nodes != "1":
            raise ConfigError(
                f"PET_NNODES={nodes} is set (a Kubeflow job of several pods) but this process was not started by "
                "torchrun, so each pod would train alone: make the container's command "
                "`torchrun $(which lerobot) train ...`, which reads the PET_* variables"
            )
        # A batch script that runs `lerobot train` itself is requeued as a whole by SLURM.
        return LaunchEnv(rank=0, local_rank=0, world_size=1, master_addr=None, master_port=None,
                         restart_count=_slurm_restarts(env))
