"""On resume, the optimizer runs with the flags' hyperparameters, not the checkpoint's.

Restoring a checkpoint loads the optimizer's parameter groups (lr, betas, eps, weight
decay) and the scheduler's base learning rates as saved, which would silently ignore
``--optimizer.lr=...`` given on resume while ``train_config.json`` records it. So after
the restore the config's values are applied: the scheduler adopts the new base LR and
the current LR becomes ``new base × the schedule's factor at the restored step`` (the
schedule itself is already rebuilt from the flags). Unchanged flags leave every value
bit-identical, so an unchanged resume stays exact.
"""

from __future__ import annotations

import torch

from lerobot_kit.core.config.schema import OptimizerConfig


def apply_optimizer_config(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, config: OptimizerConfig
) -> list[str]:
    """Set ``config``'s hyperparameters over a restored optimizer; returns a line per value that changed."""
    wanted = {"lr": config.lr, "betas": tuple(config.betas), "eps": config.eps, "weight_decay": config.weight_decay}
    restored = {"lr": scheduler.base_lrs[0], **{k: optimizer.param_groups[0][k] for k in wanted if k != "lr"}}
    changes = [
        f"--optimizer.{key}={_show(value)} replaces the checkpoint's {_show(restored[key])}"
        for key, value in wanted.items() if _show(value) != _show(restored[key])
    ]
    scheduler.base_lrs = [config.lr for _ in optimizer.param_groups]
    for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas):
        group.update(initial_lr=config.lr, lr=config.lr * factor(scheduler.last_epoch), betas=wanted["betas"],
                     eps=config.eps, weight_decay=config.weight_decay)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    return changes


def _show(value: object) -> str:
    return str(tuple(value)) if isinstance(value, (list, tuple)) else repr(float(value))  # type: ignore[arg-type]
