"""``parallelize``: the one place where parallelism is applied to a model, step by step, in this order.

0. Wrap units — resolved once per run by ``wrap_units.resolve_wrap_units`` when the
   model is built (``core.run.assemble``), and handed in here as a value.
1. Mesh — ``ParallelDims.build_mesh``: named axes dp_replicate, dp_shard.
2. Activation checkpointing — each unit (``activation_checkpointing``), if enabled; a
   unit group through the method that runs it.
3. Compile — each unit (``compile``), if enabled: after AC so the recomputation is
   compiled too, before FSDP so its gathers stay outside the graphs; a unit group
   through the method that runs it.
4. Data parallelism — FSDP2 per unit then the root (``fsdp``) for sharded layouts,
   DDP or nothing (``ddp``) for replicated ones.
5. Initial weights — sharded runs broadcast the main process's weights into every
   rank's shards (``fsdp.broadcast_initial_weights``); DDP broadcasts in step 4.

Every step before 4 changes the model in place and keeps parameter names, so state-dict
keys — and so checkpoints — are the same whichever steps are enabled.
"""

from __future__ import annotations

import torch
from torch import nn

from lerobot_kit.core.config.schema import AcceleratorConfig
from lerobot_kit.core.parallel.activation_checkpointing import apply_activation_checkpointing, checkpoint_groups
from lerobot_kit.core.parallel.compile import apply_compile, check_compile_supported
from lerobot_kit.core.parallel.ddp import apply_ddp
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.parallel.fsdp import apply_fsdp, broadcast_initial_weights, full_state_of_main
from lerobot_kit.core.parallel.parallel_model import Parallelized
from lerobot_kit.core.parallel.wrap_units import WrapUnits


def parallelize(
    model: nn.Module,
    wrap: WrapUnits,
    dims: ParallelDims,
    accel: AcceleratorConfig,
    device: torch.device,
    *,
    weights_from_main: bool,
) -> Parallelized:
    """``model`` in the layout of ``dims``; collective when more than one process runs.

    ``weights_from_main``: the main process built the model with its initial weights and
    the other ranks of a sharded layout built it on the meta device (what a run does);
    those weights are broadcast after sharding. Without it, a meta-built model is left
    for the caller to initialise (see ``fsdp``).
    """
    if (dims.sharded or accel.activation_checkpointing or accel.compile) and not wrap.any:
        raise ValueError("no wrap units: resolve them with resolve_wrap_units for this layout and these flags")
    if accel.compile:
        check_compile_supported(device)  # before any collective, so a refusal is one line on every rank
    mesh = dims.build_mesh(device.type)
    full_state = full_state_of_main(model) if dims.sharded and weights_from_main else {}
    if accel.activation_checkpointing:
        apply_activation_checkpointing(model, list(wrap.paths))
        checkpoint_groups(model, wrap.groups)
    if accel.compile:
        apply_compile(model, wrap)
    if not dims.sharded:
        return apply_ddp(model, wrap, dims, device)
    assert mesh is not None  # every sharded layout has a dp_shard axis
    parallel = apply_fsdp(model, wrap, dims, mesh, accel, device)
    if weights_from_main:
        broadcast_initial_weights(parallel, full_state)
    return parallel
