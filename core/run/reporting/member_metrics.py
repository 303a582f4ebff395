"""Per-member figures of a mixture's log window: the samples each member drew and its mean loss.

A mixture's batches carry each sample's member (``MEMBER_KEY``) and a policy may report
each sample's loss (``PER_SAMPLE_LOSS``). Each micro-batch adds both into per-member sums
that stay on the device, so a step never waits for it; at a log step one all-reduce of
a ``[3, members]`` tensor sums every rank's window, however many members the mixture has.

``samples`` counts every sample drawn, those of an update skipped for a non-finite loss
included (as ``samples_per_s`` does: the data was consumed); the loss leaves a skipped
update out, as the run's own ``loss`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lerobot_kit.core.data.dataset import MEMBER_KEY
from lerobot_kit.core.distributed.process_group import DistContext, all_reduce_sum_tensor
from lerobot_kit.core.model.policy import PER_SAMPLE_LOSS

# Rows of the per-member sums: samples drawn, samples with a reported loss, sum of their losses.
_SAMPLES, _LOSS_SAMPLES, _LOSS_SUM = range(3)


def member_keys(name: str) -> tuple[str, str]:
    """The row keys of a member's sample count and mean loss."""
    return f"member/{name}/samples", f"member/{name}/loss"


class MemberMetrics:
    """Sums of the update in progress and of the log window's applied updates; with no
    member names (a single dataset) every method does nothing."""

    def __init__(self, names: Sequence[str], device: torch.device) -> None:
        self.names = list(names)
        self._device = device
        self._update = self._zeros()
        self._window = self._zeros()

    def _zeros(self) -> torch.Tensor:
        # float64: counts stay exact and one dtype lets one collective carry every row.
        return torch.zeros(3, len(self.names), dtype=torch.float64, device=self._device)

    def add(self, batch: dict[str, torch.Tensor], per_sample_loss: torch.Tensor | None) -> None:
        """One micro-batch, ``per_sample_loss`` the policy's ``[B]`` losses or None."""
        if not self.names:
            return
        if MEMBER_KEY not in batch:
            raise ValueError(f"the dataset names members but a batch has no {MEMBER_KEY!r} key; a mixture's "
                             "items must each carry their member's position in member_names()")
        member = batch[MEMBER_KEY].reshape(-1)
        ones = torch.ones(member.shape, dtype=torch.float64, device=member.device)
        self._update[_SAMPLES].index_add_(0, member, ones)
        if per_sample_loss is None:
            return
        if per_sample_loss.shape != member.shape:
            raise ValueError(f"the policy's {PER_SAMPLE_LOSS!r} has shape {tuple(per_sample_loss.shape)}, "
                             f"expected one loss per sample of the batch, {tuple(member.shape)}")
        self._update[_LOSS_SAMPLES].index_add_(0, member, ones)
        self._update[_LOSS_SUM].index_add_(0, member, per_sample_loss.detach().to(torch.float64))

    def end_update(self, applied: bool) -> None:
        """Move the update's sums into the window; its losses only when the update was applied."""
        if not self.names:
            return
        self._window[_SAMPLES] += self._update[_SAMPLES]
        if applied:
            self._window[_LOSS_SAMPLES:] += self._update[_LOSS_SAMPLES:]
        self._update.zero_()

    def window_row(self, ctx: DistContext) -> dict[str, float]:
        """Collective: each member's samples over every rank and its mean loss (omitted when
        no sample of it has a loss in the window), then a new window."""
        if not self.names:
            return {}
        sums = all_reduce_sum_tensor(ctx, self._window).tolist()
        self._window = self._zeros()
        row: dict[str, float] = {}
        for m, name in enumerate(self.names):
            samples_key, loss_key = member_keys(name)
            row[samples_key] = int(sums[_SAMPLES][m])
            if sums[_LOSS_SAMPLES][m]:
                row[loss_key] = sums[_LOSS_SUM][m] / sums[_LOSS_SAMPLES][m]
        return row
