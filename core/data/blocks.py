"""Episode-block sampling (``--dataset.sampler.type=episode_blocks``): decode runs, shuffle windows.

Random access into video costs a seek and the frames from the key frame on; reading a
run of consecutive frames costs one seek for the whole run. So each epoch:

1. Episodes are cut into blocks of ``block_size`` consecutive frames (never across an
   episode's end), and the blocks are shuffled by ``(seed, epoch)``. For a dataset
   mixture, each member's blocks are drawn until they hold its share of the epoch's
   frames (``core.data.member_quota``) before the shuffle, so a block may come twice.
2. The shuffled blocks, laid end to end, are split into one equal share per
   data-parallel rank (``steps per epoch × batch_size`` frames, as uniform sampling
   uses; the remainder waits for the next epoch's shuffle).
3. A rank's share is cut into windows of ``buffer_size`` frames (rounded down to whole
   batches, at least one batch); each window's frames are shuffled, drawn from
   ``(seed, epoch, rank)``, and the shuffled window is cut into micro-batches.

One DataLoader worker builds a whole window (``Window``, ``core.data.packed``): it
decodes the window's frames in file order, each block front to back, and writes every
item straight into its row of the window's batches, so the main process copies nothing
and only hands the batches out. Everything is a pure function of ``(seed, epoch, rank)`` and the
position ``(epoch, offset)``, so a resume rebuilds the epoch's plan, asks only for the
batches not yet consumed, and continues with exactly the batches of the uninterrupted
run.

The trade-off: a batch mixes frames of the blocks of one window (about ``buffer_size /
block_size`` of them), and frames of one block appear only in its window's batches, so
batches are more correlated than under uniform sampling; every frame is still used once
per epoch. Memory: a worker builds its next window while the main process still hands
out batches of its last, so each worker holds two windows: about ``2 × workers ×
buffer_size`` decoded samples per rank (without workers, two windows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from lerobot_kit.core.data.member_quota import MemberQuota


@dataclass(frozen=True)
class EpochPlan:
    """One rank's epoch: the frames it streams (``inputs``, blocks end to end) and the order
    it trains on them. ``outputs[j]`` is the position in ``inputs`` of the ``j``-th sample;
    outputs come in windows of ``window`` samples, each a permutation of its own inputs."""

    inputs: np.ndarray
    outputs: np.ndarray
    window: int

    def windows(self, first_output: int) -> Iterator[np.ndarray]:
        """The frames of each window from ``first_output`` on (the rest of its window first),
        in training order."""
        lo = first_output
        while lo < len(self.outputs):
            hi = (lo // self.window + 1) * self.window
            yield self.inputs[self.outputs[lo:hi]]
            lo = hi


@dataclass(frozen=True)
class Window:
    """A DataLoader worker's request under block sampling: build one window's batches.
    ``keys[i]`` is the ``(epoch, frame)`` of the window's ``i``-th sample in training order."""

    keys: list[tuple[int, int]]
    batch_size: int
    group: int  # frames decoded at a time: what a worker holds besides the window

    def groups(self) -> Iterator[list[int]]:
        """Sample positions in frame order, ``group`` at a time: each file read front to back,
        a block's frames one after the other."""
        order = sorted(range(len(self.keys)), key=lambda i: self.keys[i][1])
        for lo in range(0, len(order), self.group):
            yield order[lo : lo + self.group]


class BlockPlan:
    """The block sampling of one data-parallel rank, for any epoch."""

    def __init__(
        self,
        episode_lengths: np.ndarray,
        block_size: int,
        buffer_size: int,
        batch_size: int,
        dp_world_size: int,
        dp_rank: int,
        seed: int,
        members: MemberQuota | None = None,
    ) -> None:
        starts = np.concatenate([[0], np.cumsum(episode_lengths)[:-1]]).astype(np.int64)
        assert members is None or (
            np.sum(members.frames) == np.sum(episode_lengths) and np.isin(members.starts, starts).all()
        ), "members are whole episodes, laid end to end"
        blocks = [
            (start + lo, start + min(lo + block_size, length))
            for start, length in zip(starts.tolist(), np.asarray(episode_lengths).tolist())
            for lo in range(0, length, block_size)
        ]
        self.blocks = np.asarray(blocks, dtype=np.int64).reshape(-1, 2)
        total = int(np.sum(episode_lengths))
        self.share = total // (batch_size * dp_world_size) * batch_size
        self.block_size = block_size
        self.window = max(batch_size, buffer_size // batch_size * batch_size)
        self.dp_rank = dp_rank
        self.seed = seed
        self.members = members

    def epoch(self, epoch: int) -> EpochPlan:
        rng = np.random.default_rng([self.seed, epoch])
        if self.members is None:
            order = rng.permutation(len(self.blocks))
        else:
            order = self.members.epoch_blocks(self.blocks, rng)
        frames = np.concatenate([np.arange(*self.blocks[b]) for b in order])
        lo = self.dp_rank * self.share
        inputs = frames[lo : lo + self.share]
        rng = np.random.default_rng([self.seed, epoch, self.dp_rank])
        return EpochPlan(inputs, shuffle_windows(len(inputs), self.window, rng), self.window)


def shuffle_windows(count: int, window: int, rng: np.random.Generator) -> np.ndarray:
    """A permutation of ``range(count)`` that shuffles each window of ``window`` positions
    within itself."""
    parts = [lo + rng.permutation(min(window, count - lo)) for lo in range(0, count, window)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def epoch_starts(first_epoch: int, first_output: int) -> Iterator[tuple[int, int]]:
    """``(epoch, first output)`` for the epochs from a position on: the rest of the first, then whole ones."""
    yield first_epoch, first_output
    epoch = first_epoch + 1
    while True:
        yield epoch, 0
        epoch += 1
