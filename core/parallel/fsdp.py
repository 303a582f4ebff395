"""FSDP2 (``fully_shard``) for the sharded layouts, FSDP and HSDP, and the initial-weights broadcast.

Each wrap unit is sharded bottom-up, then the root, so one unit's parameters are gathered
at a time. A unit group (``wrap_units.UnitGroup``) is one ``fully_shard`` over its list of
modules, and the method that runs it is registered as an FSDP forward method, so the
whole group is gathered when the method is called. Ignored modules stay whole on every rank and out of FSDP's reductions;
``Parallelized.finish_grad_sync`` averages their gradients instead, so they never drift.

Meta-device construction (no rank ever holds the whole model): build the model under
``torch.device("meta")``, shard it, then ``Parallelized.to_empty()`` (the same as
``model.to_empty(device=p.device)`` unless ``cpu_offload`` puts shards on the CPU), then
either ``broadcast_initial_weights`` from the main process's full model — what a run does
— or ``model.init_weights()`` on every rank. Build the optimizer only after that:
``to_empty`` from meta replaces the plain (non-DTensor) Parameter objects. Seed
identically on every rank before initialising: on CUDA, DTensor random ops draw from a
generator synchronised from rank 0; on CPU each rank draws its shard from its own
generator, so the initial values depend on the layout (identical replicas, but not the
numbers a one-process run would draw).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
    register_fsdp_forward_method,
)

from lerobot_kit.core.config.schema import AcceleratorConfig
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.parallel.parallel_model import Parallelized, has_meta
from lerobot_kit.core.parallel.precision import build_mp_policy
from lerobot_kit.core.parallel.wrap_units import WrapUnits


def apply_fsdp(
    model: nn.Module, wrap: WrapUnits, dims: ParallelDims, mesh: DeviceMesh, accel: AcceleratorConfig,
    device: torch.device,
) -> Parallelized:
    """Shard ``model`` over the mesh's data-parallel axes: each unit in ``wrap``, then the root."""
    fsdp = accel.fsdp
    offload: OffloadPolicy = OffloadPolicy()
    if fsdp.cpu_offload:
        # Pinned host memory needs an accelerator; without one pinning fails or wastes RAM.
        offload = CPUOffloadPolicy(pin_memory=device.type != "cpu")
    ignored = set(wrap.ignored_params(model))
    options: dict[str, Any] = dict(
        mesh=mesh[dims.dp_mesh_axes],
        reshard_after_forward=fsdp.reshard_after_forward,
        mp_policy=build_mp_policy(accel) or MixedPrecisionPolicy(),
        offload_policy=offload,
        ignored_params=ignored or None,
    )
    for path in reversed(wrap.paths):  # reversed model order: every unit before the units around it
        fully_shard(model.get_submodule(path), **options)
    for group in wrap.groups:  # disjoint from the units above (resolve_wrap_units checks)
        modules = [model.get_submodule(path) for path in group.paths]
        fully_shard(modules if len(modules) > 1 else modules[0], **options)
        if group.method is not None:
            register_fsdp_forward_method(modules[0], group.method)
    fully_shard(model, **options)
    if not has_meta(model):
        for path in wrap.ignored_modules:  # FSDP moves only what it manages
            model.get_submodule(path).to(device)
    init_device = torch.device("cpu") if fsdp.cpu_offload else device
    return Parallelized(model, model, dims, wrap, device, init_device, mesh)


def full_state_of_main(model: nn.Module) -> dict[str, torch.Tensor]:
    """Taken before sharding: the main process's full weights (the source of the broadcast); ``{}`` elsewhere."""
    if dist.get_rank() != 0:
        return {}
    if has_meta(model):
        raise ValueError("the main process must build the model with its weights, not on the meta device")
    return model.state_dict()


def broadcast_initial_weights(parallel: Parallelized, full_state: dict[str, torch.Tensor]) -> None:
    """Give every rank its shards of the main process's weights; ranks built on meta get storage first.

    So the initial weights equal a one-process run's with the same seed, while only the
    main process ever held the whole model.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if has_meta(parallel.model):
        parallel.to_empty()
    set_model_state_dict(
        parallel.model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    # Non-persistent buffers (rotary frequencies, position ids) are in no state dict, and
    # to_empty left them uninitialised on ranks built on meta: they too come from the main
    # process, which built them. FSDP never shards buffers, so each is whole on every rank.
    for buffer in non_persistent_buffers(parallel.model):
        staged = buffer.to(parallel.device)  # the backend's device (cpu_offload may keep buffers on the host)
        dist.broadcast(staged, src=0)
        if staged is not buffer:
            buffer.copy_(staged)


def non_persistent_buffers(model: nn.Module) -> list[torch.Tensor]:
    """Every non-persistent buffer of ``model``, once each, in module order (the same on every rank)."""
    found = (
        buffer
        for module in model.modules()
        for name, buffer in module.named_buffers(recurse=False)
        if name in module._non_persistent_buffers_set
    )
    return list({id(b): b for b in found if b is not None}.values())
