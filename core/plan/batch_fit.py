"""The largest micro-batch whose step fits a device, found by tracing, not by extrapolating.

Activation bytes grow roughly linearly with the batch, but not exactly: which moment of
the step is the peak can change with the batch (a batch-independent weight cast early
in the forward against batch-sized saved tensors at the start of the backward), and
kernels choose their temporaries by shape. So a straight line through two traced batch
sizes only proposes where to look; the answer is a batch size ``b`` that was traced and
fits while ``b + 1`` was traced and does not. Bigger batches never need less memory, so
each trace narrows a bracket (largest that fits, smallest that does not) until the two
are adjacent; the line usually lands on the answer, costing two more traces.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BatchFit:
    budget_bytes: int
    fixed_bytes: int  # what the device holds whatever the batch (parameters, gradients, optimizer state)
    largest: int | None  # None: not even a batch of 1 fits
    traced: dict[int, int] = field(default_factory=dict)  # batch size -> activation bytes

    def needs(self, batch_size: int) -> int:
        """Device bytes at a traced batch size."""
        return self.fixed_bytes + self.traced[batch_size]


def largest_batch(activation_bytes: Callable[[int], int], fixed_bytes: int, budget_bytes: int) -> BatchFit:
    """The largest batch size ``b`` with ``fixed_bytes + activation_bytes(b) <= budget_bytes``,
    with ``b + 1`` traced too. Activations grow with the batch at least by the batch itself,
    so the search ends."""
    traced: dict[int, int] = {}

    def fits(batch_size: int) -> bool:
        if batch_size not in traced:
            traced[batch_size] = activation_bytes(batch_size)
        return fixed_bytes + traced[batch_size] <= budget_bytes

    if not fits(1):
        return BatchFit(budget_bytes, fixed_bytes, None, traced)
    if not fits(2):
        return BatchFit(budget_bytes, fixed_bytes, 1, traced)
    low, high = 2, None  # low fits; high, once found, does not
    halve = False
    while high is None or high - low > 1:
        width = None if high is None else high - low
        if halve and high is not None:
            guess = (low + high) // 2
        else:
            guess = _line_guess(traced, budget_bytes - fixed_bytes, low, high)
        for candidate in (guess, guess + 1):  # the answer is where one fits and the next does not
            if low < candidate and (high is None or candidate < high):
                if fits(candidate):
                    low = candidate
                else:
                    high = candidate
                    break
        # The line can creep towards the answer from one side; halve when it did not halve the bracket.
        halve = width is not None and high is not None and high - low > width // 2
    return BatchFit(budget_bytes, fixed_bytes, low, traced)


def _line_guess(traced: dict[int, int], room: int, low: int, high: int | None) -> int:
    """The largest batch that the line through two traced sizes predicts to fit in ``room``:
    the two largest (all fit) until one does not, then the bracket's ends; halfway when
    it lands on an end."""
    b0, b1 = sorted(traced)[-2:] if high is None else (low, high)
    a0, a1 = traced[b0], traced[b1]
    slope = (a1 - a0) / (b1 - b0)
    guess = b0 + math.floor((room - a0) / slope) if slope > 0 else 2 * low
    if high is None:
        return max(guess, low)
    return guess if low < guess < high else (low + high) // 2
