"""A loss or gradient norm that is not finite, caught at its step, the same way on every rank.

One NaN in a batch makes the loss NaN, then every gradient, and after one optimizer update
every weight: the run goes on, exits 0, and each later checkpoint holds nothing usable. The
guard decides before the update, from values the step computes anyway:

- ``fold`` puts the loss into the gradients: backward runs on ``loss * (1 + 0 * loss)``, whose
  value and gradients are the loss's own while it is finite and NaN throughout when it is
  not. So a non-finite loss on any rank, in any micro-batch, reaches the gradients, and the
  data-parallel reduction hands it to every rank.
- ``check`` reads the global gradient norm that clipping computed (the same float on every
  rank): one number, no collective per step. Only when it is not finite do the ranks
  exchange what their losses were, so that every rank names the cause in the same words.
- Under fp16 the loss scaler owns infinite gradients: it skips such an update itself and
  lowers its scale. There only a non-finite loss counts.

``--nonfinite=stop`` raises ``NonFiniteError`` before the update, so the weights, and the
checkpoints, stay as they were. ``--nonfinite=skip`` drops the update: gradients zeroed, no
optimizer step, and the LR schedule does not advance (as Accelerate does for a step its fp16
scaler skipped); ``--nonfinite_max_consecutive`` skips in a row stop the run. Before each
save, ``weights_finite`` checks the weights themselves (one max-abs pass over them, small
next to writing them): a finite but huge update can still overflow them.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict

import torch
from torch.distributed.tensor import DTensor

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.distributed.process_group import DistContext, all_reduce_sum
from lerobot_kit.core.errors import LerobotError

logger = logging.getLogger("lerobot_kit")

FIX = ("fix: check the data (a LeRobot dataset's non-finite values are reported when it is opened) "
       "or lower --optimizer.lr")


class NonFiniteError(LerobotError):
    """Training met a non-finite loss, gradient norm or weight; nothing was saved from that state."""


class NonFiniteGuard:
    """Per rank; ``check`` takes the same decision on every rank at the same step."""

    def __init__(self, config: TrainConfig, ctx: DistContext, scaled: bool) -> None:
        """``scaled``: an fp16 loss scaler handles this run's overflowing gradients."""
        self.ctx = ctx
        self.policy = config.nonfinite
        self.max_consecutive = config.nonfinite_max_consecutive
        self.scaled = scaled
        self.consecutive = 0
        self.skipped = 0  # updates skipped since this process started
        self._losses: list[torch.Tensor] = []  # this update's micro-batch losses, on the device

    def fold(self, loss: torch.Tensor, scaled: torch.Tensor) -> torch.Tensor:
        """``scaled`` (what backward runs on) with ``loss``'s finiteness in its gradients; no sync."""
        self._losses.append(loss.detach())
        return scaled * (1 + loss.detach() * 0)

    def check(self, step: int, grad_norm: float) -> bool:
        """After clipping, before the update of ``step``: True to apply it, False to skip it.

        Raises ``NonFiniteError`` under ``stop``, and under ``skip`` at the
        ``max_consecutive``-th skip in a row.
        """
        losses, self._losses = self._losses, []
        if math.isfinite(grad_norm):
            self.consecutive = 0
            return True
        loss = self._agreed_loss(losses)  # every rank is here: the norm is global
        if loss == "finite" and self.scaled:
            return True  # the fp16 scaler's overflow: it skips this update itself
        cause = f"loss is {loss} (grad_norm {grad_norm})" if loss != "finite" else f"grad_norm is {grad_norm}"
        if self.policy == "stop":
            raise NonFiniteError(
                f"step {step}: {cause}; stopped before updating the weights, so no checkpoint holds this state "
                f"and checkpoints/last is unchanged; {FIX}, or pass --nonfinite=skip to skip such steps"
            )
        self.consecutive += 1
        self.skipped += 1
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteError(
                f"step {step}: {cause}, {self.consecutive} updates in a row skipped "
                f"(--nonfinite_max_consecutive={self.max_consecutive}); stopped, no checkpoint holds a skipped "
                f"state and checkpoints/last is unchanged; {FIX}"
            )
        logger.warning(f"step {step}: {cause}; update skipped (--nonfinite=skip)")
        return False

    def _agreed_loss(self, losses: list[torch.Tensor]) -> str:
        """``nan``, ``inf`` or ``finite``: the worst loss of this update over every rank."""
        values = [value.item() for value in losses]
        local = {"nan": float(any(math.isnan(v) for v in values)), "inf": float(any(math.isinf(v) for v in values))}
        agreed = all_reduce_sum(self.ctx, local)
        return "nan" if agreed["nan"] else "inf" if agreed["inf"] else "finite"


def weights_finite(model: torch.nn.Module, ctx: DistContext, sharded: bool) -> bool:
    """Whether every trained weight of ``model`` is finite, on every rank (collective when
    ``sharded``; replicated weights are the same everywhere)."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for param in model.parameters():
        if param.requires_grad:
            local = param.to_local() if isinstance(param, DTensor) else param
            if local.numel():
                groups[(local.device, local.dtype)].append(local.detach())
    with torch.no_grad():
        finite = all(bool(torch.isfinite(torch.stack(torch._foreach_norm(group, math.inf))).all())
                     for group in groups.values())
    if sharded:
        finite = all_reduce_sum(ctx, {"bad": float(not finite)})["bad"] == 0
    return finite
