"""The seam for tensor and context parallelism: a policy shards its own layers.

How to split attention heads or a sequence across ranks depends on the model, so the
pipeline does not guess: when ``tp`` or ``cp`` is above 1 it calls the policy's

    def parallelize_tp_cp(self, mesh: DeviceMesh, dims: ParallelDims) -> None

with the whole named mesh (axes ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``; slice
``mesh["tp"]`` / ``mesh["cp"]``), before activation checkpointing, compile and FSDP, as
torchtitan's per-model ``parallelize`` applies TP first. The method must change the model
in place and keep parameter names. ``ParallelDims.resolve`` still refuses tp/cp above 1,
so no policy defines the method yet; this is where it will be called from.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.parallel.dims import ParallelDims

HOOK = "parallelize_tp_cp"


def apply_tensor_parallel(model: nn.Module, dims: ParallelDims, mesh: DeviceMesh | None) -> None:
    """Call the policy's ``parallelize_tp_cp`` when tp or cp is above 1; otherwise nothing."""
    if dims.tp == 1 and dims.cp == 1:
        return
    owner = next((m for m in model.modules() if callable(getattr(type(m), HOOK, None))), None)
    if owner is None:
        raise ConfigError(
            f"--parallelism.tp={dims.tp} --parallelism.cp={dims.cp}: the policy ({type(model).__name__}) defines no "
            f"{HOOK}(mesh, dims) method, so it cannot be split across ranks: use tp=1 and cp=1"
        )
    if mesh is None:
        raise ValueError("tensor/context parallelism needs the mesh from ParallelDims.build_mesh()")
    getattr(owner, HOOK)(mesh, dims)
