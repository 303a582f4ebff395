"""Process-group start-up and the few collectives the trainer needs.

One path for every launcher: the launcher plugin (``plugins/launchers``) reads its own
environment, we export the torch ``env://`` variables it implies and initialise the
default group — NCCL when CUDA is available, gloo otherwise — with the configured
collective timeout, so a dead or stuck peer ends the run with an error after
``timeout_s`` instead of hanging it forever. A single plain process creates no process
group at all; every helper below is then a local no-op.

A caller may initialise the default group itself and run ``train()`` in it, once or many
times (a notebook, a sweep running configs one after another in the same processes):
``init_distributed`` then joins that group instead of creating one, and ``shutdown``
leaves it initialised.

Call ``core.distributed.accelerate_guard.check_accelerate_env(os.environ)`` before
``init_distributed``: the guard is about the user's configuration, this module only
about the processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from lerobot_kit.core.distributed.launcher import LaunchEnv, Launcher
from lerobot_kit.core.distributed.started import mark_started
from lerobot_kit.core.registry.registry import get_registry

T = TypeVar("T")


@dataclass
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    launcher: str
    backend: str | None
    restart_count: int = 0  # the launcher's restarts of this run so far (see ``LaunchEnv``)
    max_restarts: int = 0  # restarts the launcher will still attempt after this attempt fails
    owns_group: bool = True  # False: the caller initialised the default group and keeps it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def detect_launcher(env: Mapping[str, str]) -> type[Launcher]:
    """The registered launcher that recognises ``env``, tried in ``(priority, name)`` order."""
    for launcher in get_registry().launchers():
        if launcher.detect(env):
            return launcher
    raise RuntimeError("no launcher matched; the built-in 'single' launcher is missing (LEROBOT_DISABLE_PLUGINS?)")


def _export(launch: LaunchEnv) -> None:
    """Make the launcher's answer visible to torch's ``env://`` rendezvous (SLURM sets none of it)."""
    os.environ.update(
        RANK=str(launch.rank),
        LOCAL_RANK=str(launch.local_rank),
        WORLD_SIZE=str(launch.world_size),
        MASTER_ADDR=str(launch.master_addr),
        MASTER_PORT=str(launch.master_port),
    )


def init_distributed(timeout_s: int) -> DistContext:
    """Join the run the launcher started; ``timeout_s`` bounds rendezvous and every collective.

    If the default group is already initialised, the run joins it: its ranks, size,
    backend and timeout are the caller's, and ``timeout_s`` is not used.
    """
    launcher = detect_launcher(os.environ)
    launch = launcher.read(os.environ)
    if dist.is_initialized():
        return _callers_group(launcher.name, launch)
    use_cuda = torch.cuda.is_available() and not launch.cpu
    if use_cuda:
        device = torch.device("cuda", launch.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    restarts = {"restart_count": launch.restart_count, "max_restarts": launch.max_restarts}
    if launch.world_size == 1:
        return DistContext(0, 0, 1, device, launcher.name, backend=None, **restarts)
    backend = "nccl" if use_cuda else "gloo"
    _export(launch)
    timeout = timedelta(seconds=timeout_s)
    mark_started()
    dist.init_process_group(
        backend=backend,
        store=_attempt_store(launch, timeout),
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=timeout,
    )
    return DistContext(launch.rank, launch.local_rank, launch.world_size, device, launcher.name, backend, **restarts)


def _callers_group(launcher: str, launch: LaunchEnv) -> DistContext:
    """The context of a default group the caller initialised. The launcher's environment
    adds what the group does not say: the local rank (when it describes this group) and
    the restart counts."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    backend = "nccl" if "nccl" in str(dist.get_backend()) else "gloo"
    local_rank = launch.local_rank if launch.world_size == world_size else rank
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    return DistContext(rank, local_rank, world_size, device, launcher, backend, launch.restart_count,
                       launch.max_restarts, owns_group=False)


_PER_DEFAULT_GROUP: dict[tuple[Any, Hashable], Any] = {}


def per_default_group(key: Hashable, build: Callable[[], T]) -> T:
    """``build()`` once per default process group: every later run in that group gets the
    same object. Collective: every rank calls it at the same point with the same key.

    A process group (a device mesh makes one per axis) holds threads and connections for
    as long as it lives. A run in a group it created destroys the whole lot at the end; a
    run in a group the caller keeps must neither make new ones each time (they would pile
    up over a sweep) nor destroy its own (torch caches device meshes by value, so a later
    run's equal mesh can resolve to an earlier run's groups): it reuses them.
    """
    slot = (dist.group.WORLD, key)
    if slot not in _PER_DEFAULT_GROUP:
        _PER_DEFAULT_GROUP[slot] = build()
    return _PER_DEFAULT_GROUP[slot]


def _attempt_store(launch: LaunchEnv, timeout: timedelta) -> dist.Store:
    """The rendezvous store of this attempt of the run: keys of earlier attempts are out of sight.

    torchrun's agent hosts one TCPStore for its whole life and keeps it across worker-group
    restarts (``TORCHELASTIC_USE_AGENT_STORE``); torch's ``env://`` rendezvous uses it
    without a per-attempt prefix. The keys a failed attempt wrote — each rank's gloo/NCCL
    address among them — are then still there when the restarted ranks look for each
    other, and a rank that reads a peer's old address connects to a process that no longer
    exists: refused (the restart fails) or, once the port is reused, a connect that hangs
    until the timeout. Prefixing every key with the restart count gives each attempt a
    clean namespace. Without an agent, rank 0 hosts the store and a new attempt starts a
    new one.
    """
    assert launch.master_addr is not None and launch.master_port is not None
    store = dist.TCPStore(
        launch.master_addr,
        launch.master_port,
        launch.world_size,
        is_master=launch.rank == 0 and not launch.agent_store,
        timeout=timeout,
        multi_tenant=not launch.agent_store,
    )
    return dist.PrefixStore(f"lerobot_kit/attempt_{launch.restart_count}", store)


def barrier(ctx: DistContext) -> None:
    if not ctx.distributed:
        return
    if ctx.backend == "nccl":
        dist.barrier(device_ids=[ctx.local_rank])
    else:
        dist.barrier()


def shutdown(ctx: DistContext) -> None:
    """End of a successful run, on every rank. The barrier first is not optional: with gloo
    (torch 2.13), a rank that tears down its process group while a peer has already exited
    and closed its sockets dies with SIGABRT ("terminate called without an active
    exception") in 1-2 of 10 runs; with the barrier, none in 30. On an error path, do not
    call this (the barrier would wait for the dead rank): just exit non-zero. A group the
    caller initialised stays initialised."""
    if ctx.distributed and dist.is_initialized():
        barrier(ctx)
        if ctx.owns_group:
            dist.destroy_process_group()


def _all_reduce(ctx: DistContext, values: dict[str, float], mean: bool) -> dict[str, float]:
    if not ctx.distributed:
        return dict(values)
    # Sorted keys: every rank must pack the same metric into the same slot.
    keys = sorted(values)
    packed = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    if mean:
        packed /= ctx.world_size
    return dict(zip(keys, packed.tolist()))


def all_reduce_mean(ctx: DistContext, values: dict[str, float]) -> dict[str, float]:
    """Per-key mean over ranks (losses). Every rank must pass the same keys."""
    return _all_reduce(ctx, values, mean=True)


def all_reduce_sum(ctx: DistContext, values: dict[str, float]) -> dict[str, float]:
    """Per-key sum over ranks (samples, samples/s of the whole cluster)."""
    return _all_reduce(ctx, values, mean=False)


def all_reduce_sum_tensor(ctx: DistContext, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (on ``ctx.device``) summed element-wise over ranks, in place: one
    collective for any number of values (a mixture's per-member sums)."""
    if ctx.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_objects(ctx: DistContext, obj: T, group: Any = None) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank (small picklable values); over
    ``group`` (spanning every rank) when given, else the default group."""
    if not ctx.distributed:
        return [obj]
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, obj, group=group)
    return everyone


def broadcast_object(ctx: DistContext, obj: T, src: int = 0) -> T:
    """``obj`` from rank ``src`` on every rank (picklable objects: paths, small configs)."""
    if not ctx.distributed:
        return obj
    box: list[Any] = [obj]
    dist.broadcast_object_list(box, src=src, device=ctx.device if ctx.backend == "nccl" else None)
    return box[0]
