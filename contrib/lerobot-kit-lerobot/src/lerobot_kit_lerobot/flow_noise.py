"""Flow-matching noise and time drawn per sample, so that training does not depend on how
the global batch is split between data-parallel ranks or into accumulation micro-batches.

π0, π0.5 and SmolVLA draw, in every training step, a noise tensor and a time per sample
from the global torch RNG (``sample_noise``, ``sample_time`` of LeRobot's model). Each
data-parallel rank has its own RNG, so two ranks draw other numbers for their halves of a
batch than one process draws for the whole: FSDP(2) and one process would train
different objectives. The bridge draws each sample's noise and time with LeRobot's own
functions, from the RNG seeded by (the run's seed, the sample's frame index in the
dataset, the epoch of the data order it was drawn in), both of which lerobot-kit's
training loader puts in every batch: the same numbers for the same sample on any number
of ranks, with any accumulation and after a resume (the data order's epoch is part of
the checkpoint), with the same distributions as LeRobot's, and new numbers each time a
frame comes back in a later epoch (within one, the order holds each frame once).

Inference (``select_action``), and a training batch without those keys, keep LeRobot's
draws from the global RNG. A shape-only trace (``lerobot plan``, on fake tensors) gets
tensors of LeRobot's shapes and dtype without a draw: LeRobot's Beta sampler checks its
parameters by value, which a fake tensor has not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from lerobot_kit.api import EPOCH_KEY, INDEX_KEY

NOISE, TIME = 0, 1  # the two streams drawn per sample


def sample_seed(*parts: int) -> int:
    """A 63-bit seed mixed from non-negative integers; equal parts, equal seed."""
    state = np.random.SeedSequence([p & 0xFFFFFFFF for p in parts] + [p >> 32 for p in parts]).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))


class PerSampleDraws:
    """Stands in for LeRobot's ``sample_noise`` / ``sample_time`` on its model while a training
    batch runs (``for_batch``); outside one it calls LeRobot's own, on the global RNG."""

    def __init__(self, model: Any, seed: int) -> None:
        self.seed = seed
        self._keys: list[tuple[int, int]] | None = None  # (frame, epoch) per row of the current batch
        self._shape_only = False
        self._noise: Callable[..., Tensor] = model.sample_noise
        self._time: Callable[..., Tensor] = model.sample_time
        model.sample_noise = self.sample_noise
        model.sample_time = self.sample_time

    @contextlib.contextmanager
    def for_batch(self, batch: dict[str, Any]) -> Iterator[None]:
        """Per-sample draws for this training batch, keyed by its frames' index and epoch."""
        indices, epochs = batch.get(INDEX_KEY), batch.get(EPOCH_KEY)
        if indices is None or epochs is None:
            yield
            return
        if is_fake(indices):  # a shape-only trace (lerobot plan)
            self._shape_only = True
            try:
                yield
            finally:
                self._shape_only = False
            return
        frames, drawn_in = indices.reshape(-1).tolist(), epochs.reshape(-1).tolist()
        self._keys = [(int(frame), int(epoch)) for frame, epoch in zip(frames, drawn_in, strict=True)]
        try:
            yield
        finally:
            self._keys = None

    def _per_sample(self, draw: Callable[[], Tensor], stream: int, device: torch.device) -> Tensor:
        assert self._keys is not None
        rows = []
        devices = [device] if device.type == "cuda" else []
        for frame, epoch in self._keys:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(sample_seed(self.seed, frame, epoch, stream))
                rows.append(draw())
        return torch.cat(rows)

    def sample_noise(self, shape: tuple[int, ...] | torch.Size, device: Any) -> Tensor:
        if self._shape_only:
            return torch.empty(shape, dtype=torch.float32, device=device)
        if self._keys is None or shape[0] != len(self._keys):
            return self._noise(shape, device)
        return self._per_sample(lambda: self._noise((1, *shape[1:]), device), NOISE, torch.device(device))

    def sample_time(self, bsize: int, device: Any) -> Tensor:
        if self._shape_only:
            return torch.empty(bsize, dtype=torch.float32, device=device)
        if self._keys is None or bsize != len(self._keys):
            return self._time(bsize, device)
        return self._per_sample(lambda: self._time(1, device), TIME, torch.device(device))
