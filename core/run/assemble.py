"""Model assembly: the policy a run trains, before any parallelism is applied.

One function for ``lerobot train`` and ``lerobot plan``: the policy from its config and
the dataset's features, its pretrained weights, its PEFT adapters and their dtypes. The
plan builds on the meta device and so sees exactly the modules, parameter shapes and
trainable flags the run will shard.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from lerobot_kit.core.data.dataset import DatasetMeta
from lerobot_kit.core.parallel.trainable_dtypes import align_trainable_dtypes
from lerobot_kit.core.parallel.wrap_units import WrapUnits, resolve_wrap_units
from lerobot_kit.core.run.spec import RunSpec


@dataclass(frozen=True)
class BuiltModel:
    model: nn.Module
    wrap: WrapUnits  # resolved here, once: the dtype check, ``parallelize`` and the plan read it


def build_model(spec: RunSpec, meta: DatasetMeta, device: torch.device) -> BuiltModel:
    """The policy of ``spec`` on ``device`` (``meta``: shapes only, no storage, no weights read),
    and its wrap units for the run's layout and flags.

    Seeded with ``--seed`` first, so every process that materialises the model draws the
    same initial weights as a one-process run. A resumed full-training run skips
    ``--policy.path``: its checkpoint replaces every weight. A PEFT run always loads the
    base (its checkpoints hold only the adapter) and wraps it here, on every rank alike,
    so FSDP later shards the frozen base and the adapters together.
    """
    from lerobot_kit.core.checkpoint.pretrained import load_pretrained_weights
    from lerobot_kit.core.model.policy import make_policy

    config = spec.config
    on_meta = device.type == "meta"
    torch.manual_seed(config.seed)
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        policy = make_policy(config.policy, meta)
    if config.policy.path and (spec.use_peft or not spec.resuming) and not on_meta:
        load_pretrained_weights(policy, Path(config.policy.path))
    if not spec.use_peft:
        wrap = resolve_wrap_units(policy, spec.dims, config.accelerator, declared_wrap_modules(policy))
        # A policy stored in bf16 with some parameters kept in fp32 (LeRobot's π0.5 in its bf16
        # mode): trainable ones one dtype per unit, as FSDP2 needs; frozen ones keep their dtype.
        align_trainable_dtypes(policy, config.accelerator, spec.dims, wrap)
        return BuiltModel(policy, wrap)
    from lerobot_kit.core.model.peft import wrap_policy

    assert spec.peft_base is not None
    model = wrap_policy(policy, config.peft, spec.peft_base)
    wrap = resolve_wrap_units(model, spec.dims, config.accelerator, declared_wrap_modules(model))
    align_trainable_dtypes(model, config.accelerator, spec.dims, wrap)
    return BuiltModel(model, wrap)


def declared_wrap_modules(model: nn.Module) -> list[str] | None:
    """The FSDP wrap units the policy class declares (``_fsdp_wrap_modules``), through a PEFT wrapper."""
    from lerobot_kit.core.model.policy import Policy

    policy = next((m for m in model.modules() if isinstance(m, Policy)), model)
    return getattr(type(policy), "_fsdp_wrap_modules", None)
