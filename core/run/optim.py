"""Optimizer and LR schedule from the config.

The scheduler is a ``LambdaLR`` stepped once per loop step, whatever the
number of processes; its whole state is ``last_epoch``, so it round-trips through JSON.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lerobot_kit.core.config.schema import OptimizerConfig, SchedulerConfig


def build_optimizer(params: list[torch.nn.Parameter], config: OptimizerConfig) -> torch.optim.Optimizer:
    """AdamW with sharded (DTensor) and plain parameters in separate groups: a foreach
    step cannot mix the two, and FSDP's ignored modules keep plain parameters."""
    from torch.distributed.tensor import DTensor

    sharded = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    groups = [{"params": group} for group in (sharded, plain) if group]
    return torch.optim.AdamW(
        groups,
        lr=config.lr,
        betas=tuple(config.betas),
        eps=config.eps,
        weight_decay=config.weight_decay,
        foreach=True,
    )


def lr_factor(step: int, config: SchedulerConfig, total_steps: int) -> float:
    warmup = config.num_warmup_steps
    if warmup and step < warmup:
        return (step + 1) / warmup
    if config.type == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: SchedulerConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config, total_steps))


class ScheduleState:
    """The LR schedule as checkpoint state: ``last_epoch`` and the base LRs, as JSON.

    ``LambdaLR.state_dict`` holds its lambdas, which JSON cannot; they are rebuilt from the
    flags, so only the position in the schedule and its base is saved.
    """

    def __init__(self, scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
        self.scheduler = scheduler

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.scheduler.last_epoch, "base_lrs": list(self.scheduler.base_lrs)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        scheduler = self.scheduler
        scheduler.base_lrs = [float(x) for x in state_dict["base_lrs"]]
        scheduler.last_epoch = int(state_dict["last_epoch"])
        for group, base_lr, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base_lr * factor(scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
