"""Episode-block sampling (``--dataset.sampler.type=episode_blocks``): decode runs, shuffle in a buffer.

Random access into video costs a seek and the frames from the key frame on; reading a
run of consecutive frames costs one seek for the whole run. So each epoch:

1. Episodes are cut into blocks of ``block_size`` consecutive frames (never across an
   episode's end), and the blocks are shuffled by ``(seed, epoch)``. For a dataset
   mixture, each member's blocks are drawn until they hold its share of the epoch's
   frames (``core.data.member_quota``) before the shuffle, so a block may come twice.
2. The shuffled blocks, laid end to end, are split into one equal share per
   data-parallel rank (``steps per epoch × batch_size`` frames, as uniform sampling
   uses; the remainder waits for the next epoch's shuffle).
3. A rank streams its share through a shuffle buffer of ``buffer_size`` frames: each
   output is a random frame of the buffer (drawn from ``(seed, epoch, rank)``), whose
   place the next frame of the stream takes. Consecutive outputs form micro-batches.

DataLoader workers get *tasks* — the frames of one block a rank still needs, in stream
order — so a worker decodes a block front to back; the main process keeps the decoded
items until the buffer order asks for them (at most about ``buffer_size`` of them,
plus the tasks in flight). Everything is a pure function of ``(seed, epoch, rank)`` and
the position ``(epoch, offset)``, so a resume rebuilds the epoch's plan, asks only for
the frames not yet consumed, and continues with exactly the batches of the
uninterrupted run.

The trade-off: a batch mixes frames of the few blocks that share the buffer (about
``buffer_size / block_size``), and frames of one block appear in nearby batches, so
batches are more correlated than under uniform sampling; every frame is still used once
per epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from lerobot_kit.core.data.member_quota import MemberQuota


@dataclass(frozen=True)
class EpochPlan:
    """One rank's epoch: the frames it streams (``inputs``) and the buffer's output order.

    ``outputs[j]`` is the position in ``inputs`` of the ``j``-th sample the rank trains on;
    ``block_of[p]`` is the run of the epoch's block order that input position ``p`` came
    from (a block a mixture draws twice is two runs, decoded as two tasks).
    """

    inputs: np.ndarray
    outputs: np.ndarray
    block_of: np.ndarray

    def tasks(self, first_output: int) -> list[np.ndarray]:
        """Input positions still needed from ``first_output`` on, one sorted array per block run."""
        needed = np.sort(self.outputs[first_output:])
        if not len(needed):
            return []
        cuts = np.flatnonzero(np.diff(self.block_of[needed])) + 1
        return np.split(needed, cuts)


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
        self.buffer_size = buffer_size
        self.dp_rank = dp_rank
        self.seed = seed
        self.members = members

    def epoch(self, epoch: int) -> EpochPlan:
        rng = np.random.default_rng([self.seed, epoch])
        if self.members is None:
            order = rng.permutation(len(self.blocks))
        else:
            order = self.members.epoch_blocks(self.blocks, rng)
        lengths = self.blocks[order, 1] - self.blocks[order, 0]
        block_of = np.repeat(np.arange(len(order)), lengths)
        frames = np.concatenate([np.arange(*self.blocks[b]) for b in order])
        lo = self.dp_rank * self.share
        inputs, block_of = frames[lo : lo + self.share], block_of[lo : lo + self.share]
        rng = np.random.default_rng([self.seed, epoch, self.dp_rank])
        return EpochPlan(inputs, shuffle_buffer(len(inputs), self.buffer_size, rng), block_of)


def shuffle_buffer(count: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """The order in which a buffer of ``size`` emits a stream of ``count`` items: each output
    is a uniformly drawn slot, refilled by the next item of the stream."""
    buffer = list(range(min(size, count)))
    upcoming = len(buffer)
    draws = rng.random(count)
    out = np.empty(count, dtype=np.int64)
    for j in range(count):
        slot = int(draws[j] * len(buffer))
        out[j] = buffer[slot]
        if upcoming < count:
            buffer[slot] = upcoming
            upcoming += 1
        else:
            buffer[slot] = buffer[-1]
            buffer.pop()
    return out


def epoch_starts(first_epoch: int, first_output: int) -> Iterator[tuple[int, int]]:
    """``(epoch, first output)`` for the epochs from a position on: the rest of the first, then whole ones."""
    yield first_epoch, first_output
    epoch = first_epoch + 1
    while True:
        yield epoch, 0
        epoch += 1
