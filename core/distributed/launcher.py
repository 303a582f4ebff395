"""Launchers: how a training process learns its rank, world size and rendezvous point.

A launcher is whatever started the process (``torchrun``, ``accelerate launch``,
SLURM's ``srun``, a user typing ``lerobot train``). Each leaves a different environment
behind; a launcher class recognises one and translates it into a ``LaunchEnv``. The
process group is then created the same way for all of them (``env://`` rendezvous), so
nothing after start-up knows or cares which launcher ran.

Writing a launcher plugin (register it with the ``lerobot_register_launchers`` hook)::

    class MpiLauncher(Launcher):
        name = "mpi"
        priority = 40          # lower is tried first; built-ins use 10..30 and 1000

        @classmethod
        def detect(cls, env):  # env: Mapping[str, str], normally os.environ
            return "OMPI_COMM_WORLD_RANK" in env

        @classmethod
        def read(cls, env):
            return LaunchEnv(rank=env_int(env, "OMPI_COMM_WORLD_RANK"), ...)

``detect`` must be cheap and side-effect free; ``read`` raises ``ConfigError`` for a
malformed environment. Launchers are tried in ``(priority, name)`` order and the first
whose ``detect`` is true wins; ``single`` (priority 1000) always matches, so keep custom
launchers below it. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.registry.contracts import contract

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class LaunchEnv:
    """What a launcher tells us. ``master_*`` are ``None`` for a one-process run."""

    rank: int
    local_rank: int
    world_size: int
    master_addr: str | None
    master_port: int | None
    cpu: bool = False  # the launcher asked for CPU even when CUDA is present (accelerate launch --cpu)
    # How many times the launcher has started this run again after a failure or a requeue
    # (torchrun's worker-group restarts, SLURM's requeues): a restarted run resumes itself.
    restart_count: int = 0
    # Restarts the launcher will still attempt after this one fails (torchrun --max-restarts).
    max_restarts: int = 0
    # The rendezvous store is hosted by the launcher's agent, which outlives the workers
    # (torchrun), rather than by rank 0.
    agent_store: bool = False
    # The process's parent is the launcher itself (torchrun's agent, slurmstepd), whose death
    # leaves the process an orphan that nobody will stop or restart: it then stops at the next
    # step boundary with a checkpoint (``core.run.reliability.launcher_watch``). False for a plain process,
    # whose parent is a shell that may end (``nohup``) while the run should go on.
    parent_is_launcher: bool = False


@contract
class Launcher:
    """Base of launcher plugins; see the module docstring for the contract."""

    name: ClassVar[str]
    priority: ClassVar[int]

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        raise NotImplementedError

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchEnv:
        raise NotImplementedError


def env_int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    """An integer environment variable, or a ConfigError naming it."""
    raw = env.get(key)
    if raw is None:
        if default is None:
            raise ConfigError(f"environment variable {key} is not set; the launcher should have set it")
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"environment variable {key}={raw!r} is not an integer") from exc
