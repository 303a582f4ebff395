"""The replicated layouts: DDP over the data-parallel ranks, or one process without a wrapper.

DDP broadcasts rank 0's parameters and buffers when it wraps the model, so replicas
start equal. It cannot wrap meta tensors: a meta-built model gets its storage here and
its values from the caller's initialisation afterwards; DDP does not broadcast again,
so seeding every rank identically is what keeps the replicas equal then.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.parallel.parallel_model import Parallelized, has_meta
from lerobot_kit.core.parallel.wrap_units import WrapUnits


def apply_ddp(model: nn.Module, wrap: WrapUnits, dims: ParallelDims, device: torch.device) -> Parallelized:
    """DDP for a multi-process layout; the bare model on ``device`` for a single process."""
    if not has_meta(model):
        model.to(device)
    elif dims.layout == "ddp":  # DDP broadcasts and buckets real storage
        model.to_empty(device=device)
    module: nn.Module = model
    if dims.layout == "ddp":
        module = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return Parallelized(module, model, dims, wrap, device, device)
