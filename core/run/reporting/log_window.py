"""The metrics of the steps between two log lines, kept as tensor sums until a log step.

Sums stay on the device (no sync per step). The micro-batches of an update are summed
apart until the update ends: an applied update joins the window, a skipped one
(non-finite, ``reliability.nonfinite``) is left out, so the logged means are those of applied updates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class LogWindow:
    skipped_before: int  # updates skipped before this window began (the guard's running count)
    sums: dict[str, torch.Tensor] = field(default_factory=dict)  # metric sums of applied updates
    update: dict[str, torch.Tensor] = field(default_factory=dict)  # this update's micro-batches so far
    steps: int = 0  # micro-batches since the last log line
    metric_steps: int = 0  # of those, the micro-batches of applied updates
    update_steps: int = 0  # micro-batches of this update so far
    start: float = field(default_factory=time.perf_counter)
    data_wait: float = 0.0  # seconds the steps waited for their batches (data_s)
    grad_norm: float | None = None  # of the last synced update, kept across windows

    def add_micro_batch(self, metrics: dict[str, torch.Tensor]) -> None:
        _add(self.update, metrics)
        self.update_steps += 1
        self.steps += 1

    def end_update(self, applied: bool) -> None:
        if applied:
            _add(self.sums, self.update)
            self.metric_steps += self.update_steps
        self.update, self.update_steps = {}, 0

    def local_means(self) -> dict[str, float]:
        """This rank's means of the window's applied micro-batches, and its data wait per step."""
        return {**{k: v.item() / self.metric_steps for k, v in self.sums.items()},
                "data_s": self.data_wait / self.steps}

    def samples_per_s(self, global_batch: int) -> float:
        elapsed = time.perf_counter() - self.start
        return self.steps * global_batch / elapsed if elapsed > 0 else 0.0

    def restart(self, skipped_before: int) -> None:
        """A new window after a log line; the last gradient norm carries over."""
        self.sums, self.steps, self.metric_steps, self.data_wait = {}, 0, 0, 0.0
        self.start, self.skipped_before = time.perf_counter(), skipped_before


def _add(into: dict[str, torch.Tensor], values: dict[str, torch.Tensor]) -> None:
    """Per-key running sums of metric tensors (no device sync)."""
    for key, value in values.items():
        into[key] = into[key] + value if key in into else value
