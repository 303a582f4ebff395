"""Parallel degrees: what the user declared, resolved against the launched world.

The declared degrees (``--parallelism.dp_replicate/dp_shard``, possibly unset or ``-1``)
stay in ``train_config.json`` so a resume on another world size re-resolves them; the
resolved ``ParallelDims`` go to ``training_step.json`` (``topology``). This module is
torch-free except ``build_mesh``, so planning and config code can use it without torch.

The mesh has named axes, outermost first: ``dp_replicate``, ``dp_shard`` (ranks laid out
row-major, as ``init_device_mesh`` does). Both are data-parallel, so a rank's position
on the mesh is its data-parallel rank.

Layouts: ``R`` = dp_replicate, ``S`` = dp_shard, ``R × S`` = world size.

- single: one process, no wrapper.
- ddp: ``S == 1`` — every process holds a full replica (the default of a launch).
- fsdp: ``R == 1, S > 1`` — FSDP2 over a 1-D mesh ``("dp_shard",)``.
- hsdp: ``R > 1, S > 1`` — FSDP2 over a 2-D mesh ``("dp_replicate", "dp_shard")``:
  shard inside a row, all-reduce across rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lerobot_kit.core.config.schema import ParallelismConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.layout.training_step import DataParallelDegrees, Topology

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

REPLICATE_AXIS = "dp_replicate"
SHARD_AXIS = "dp_shard"
MESH_DIMS_HSDP = (REPLICATE_AXIS, SHARD_AXIS)
MESH_DIMS_FSDP = (SHARD_AXIS,)


@dataclass(frozen=True)
class ParallelDims(DataParallelDegrees):
    dp_replicate: int
    dp_shard: int
    world_size: int

    @classmethod
    def resolve(cls, declared: ParallelismConfig, world_size: int) -> ParallelDims:
        """Turn the declared degrees into concrete ones for ``world_size`` processes.

        Unset both: DDP over everything. ``dp_shard=-1``: shard over what the replicas
        leave. Only one of them set: the other is 1 (no guessing a hybrid layout).
        """
        if world_size < 1:
            raise ConfigError(f"world size must be at least 1, got {world_size}")
        replicate, shard = declared.dp_replicate, declared.dp_shard
        if replicate is not None and replicate < 1:
            raise ConfigError(
                f"--parallelism.dp_replicate={replicate} is invalid: use a positive number of replica "
                "groups, or leave it unset"
            )
        if shard is not None and shard < 1 and shard != -1:
            raise ConfigError(
                f"--parallelism.dp_shard={shard} is invalid: use a positive shard degree, -1 (all processes "
                "left after dp_replicate), or leave it unset"
            )
        if replicate is None and shard is None:
            return cls(dp_replicate=world_size, dp_shard=1, world_size=world_size)
        r = replicate if replicate is not None else 1
        if shard == -1:
            if world_size % r:
                raise ConfigError(
                    f"--parallelism.dp_shard=-1 with --parallelism.dp_replicate={r} needs a world size divisible "
                    f"by {r}, but {world_size} processes were launched: launch a multiple of {r} processes or "
                    "change dp_replicate"
                )
            s = world_size // r
        else:
            s = shard if shard is not None else 1
        if r * s != world_size:
            raise ConfigError(
                f"--parallelism.dp_replicate={r} × --parallelism.dp_shard={s} = {r * s} does not match the "
                f"world size of {world_size} launched processes: make dp_replicate × dp_shard = {world_size} "
                f"(e.g. --parallelism.dp_shard=-1 to shard over all of them), or launch {r * s} processes"
            )
        return cls(dp_replicate=r, dp_shard=s, world_size=world_size)

    @property
    def layout(self) -> str:
        if self.world_size == 1:
            return "single"
        if not self.sharded:
            return "ddp"
        return "fsdp" if self.dp_replicate == 1 else "hsdp"

    def degrees(self) -> dict[str, int]:
        """Every mesh axis and its degree, outermost first."""
        return {REPLICATE_AXIS: self.dp_replicate, SHARD_AXIS: self.dp_shard}

    def dp_rank(self, rank: int) -> int:
        """The data-parallel index of global ``rank``: which slice of every batch it reads.

        The flattened (dp_replicate, dp_shard) coordinate, row-major as ``init_device_mesh``
        lays ranks out: every axis is data-parallel, so it is the global rank itself.
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
        return rank

    @property
    def topology(self) -> Topology:
        """What ``training_step.json`` records of these degrees."""
        return Topology(world_size=self.world_size, dp_replicate=self.dp_replicate, dp_shard=self.dp_shard,
                        layout=self.layout)

    @property
    def shard_replica_axis(self) -> str | None:
        """The mesh axis along which ranks hold copies of the same shards (HSDP's ``dp_replicate``), else None.

        A sum over shards (a global gradient norm) must count one rank of that axis only, or
        each shard counts once per replica.
        """
        return REPLICATE_AXIS if self.layout == "hsdp" else None

    @property
    def dp_mesh_axes(self) -> tuple[str, ...]:
        """The mesh axes FSDP2 works over: ``dp_shard``, with ``dp_replicate`` in front for HSDP."""
        return MESH_DIMS_HSDP if self.shard_replica_axis is not None else MESH_DIMS_FSDP

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """The named mesh over every axis of degree above 1, outermost first; ``None`` when
        ``dp_replicate`` is the only one (single, DDP): those run on the default process
        group, which is then exactly the data-parallel group.

        Needs an initialised default process group of ``world_size`` ranks.
        """
        axes = {axis: degree for axis, degree in self.degrees().items() if degree > 1}
        if set(axes) <= {REPLICATE_AXIS}:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        from lerobot_kit.core.distributed.process_group import per_default_group

        return per_default_group(("mesh", device_type, tuple(axes.items())), lambda: init_device_mesh(
            device_type, tuple(axes.values()), mesh_dim_names=tuple(axes)))
