"""FSDP2's dtype rule for trainable parameters, applied before a model is parallelised.

FSDP2 shards each unit's trainable parameters as one flat group of one dtype, so a policy
stored in bf16 with some parameters kept in fp32 (LeRobot's π0.5 in its bf16 mode), or a
PEFT adapter in fp32 beside a bf16 base, must be made uniform or refused before
``parallelize`` runs. The rule sits with the other FSDP code so the layout that needs it
owns it; model assembly calls it for plain and PEFT models alike.
"""

from __future__ import annotations

import torch
from torch import nn

from lerobot_kit.core.config.schema import AcceleratorConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.parallel.wrap_units import WrapUnits


def align_trainable_dtypes(model: nn.Module, accel: AcceleratorConfig, dims: ParallelDims, wrap: WrapUnits) -> None:
    """FSDP2 needs one dtype among each unit's trainable parameters.

    Under mixed precision every trainable parameter becomes fp32 (autocast computes in
    low precision anyway, and a loss scaler needs fp32 gradients). Without it a sharded
    layout with mixed trainable dtypes in one unit is refused, naming the parameters:
    casting them silently would change what the user asked to train.
    """
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if accel.mixed_precision != "no":
        for _, param in trainable:
            if param.dtype != torch.float32:
                param.data = param.data.float()
        return
    if not dims.sharded:
        return
    ignored = set(wrap.ignored_params(model))
    by_unit: dict[str, dict[torch.dtype, list[str]]] = {}
    for name, param in trainable:
        if param not in ignored:
            by_unit.setdefault(wrap.unit_of(name), {}).setdefault(param.dtype, []).append(name)
    for unit, dtypes in by_unit.items():
        if len(dtypes) > 1:
            listed = "; ".join(
                f"{str(dtype).removeprefix('torch.')}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
                for dtype, names in dtypes.items()
            )
            raise ConfigError(
                f"FSDP unit {unit or '<root>'!r} has trainable parameters of different dtypes ({listed}); "
                "FSDP2 shards a unit's trainable parameters as one dtype: set --accelerator.mixed_precision=bf16 "
                "(trainable parameters are then kept in fp32), or give the base model one dtype"
            )
