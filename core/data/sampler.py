"""Data order that can be resumed exactly, on any number of data-parallel workers.

The order of an epoch is a pure function of ``(seed, epoch)`` (and, for a dataset mixture,
of its members' frames and shares: ``core.data.member_quota``); a position is
``(epoch, offset)`` in samples of that epoch. Each loop step takes one global batch of
``batch_size × dp_world_size`` consecutive samples of the permutation and gives worker
``r`` the ``r``-th slice of it, so the position after ``k`` steps is plain arithmetic
and a resume with the same world size and batch size replays the exact same batches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from lerobot_kit.core.data.member_quota import MemberQuota


@dataclass(frozen=True)
class DataPosition:
    epoch: int = 0
    offset: int = 0
    samples_seen: int = 0

    def to_json(self) -> dict[str, int]:
        return asdict(self)


def epoch_permutation(
    num_samples: int, seed: int, epoch: int, shuffle: bool, members: MemberQuota | None = None
) -> torch.Tensor:
    """The frame indices of an epoch in training order: a permutation, or for a mixture each
    member's quota of its frames, shuffled together."""
    if members is not None:
        return torch.from_numpy(members.epoch_samples(np.random.default_rng([seed, epoch]) if shuffle else None))
    if not shuffle:
        return torch.arange(num_samples)
    generator = torch.Generator()
    generator.manual_seed(seed * 100_003 + epoch)
    return torch.randperm(num_samples, generator=generator)


class ResumableBatchSampler(Sampler[list[int]]):
    """Endless batch sampler of one data-parallel worker, starting at ``start``."""

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        dp_world_size: int,
        dp_rank: int,
        seed: int,
        start: DataPosition = DataPosition(),
        shuffle: bool = True,
        members: MemberQuota | None = None,
    ) -> None:
        assert members is None or int(np.sum(members.frames)) == num_samples, "members cover the dataset"
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.dp_world_size = dp_world_size
        self.dp_rank = dp_rank
        self.seed = seed
        self.start = start
        self.shuffle = shuffle
        self.members = members
        self.global_batch = batch_size * dp_world_size
        if num_samples < self.global_batch:
            from lerobot_kit.core.errors import ConfigError

            raise ConfigError(
                f"the dataset has {num_samples} samples, fewer than one global batch "
                f"(batch_size {batch_size} × {dp_world_size} workers = {self.global_batch}); lower --batch_size"
            )

    def advance(self, position: DataPosition, steps: int) -> DataPosition:
        """Where the data stands after ``steps`` more loop steps from ``position``."""
        epoch, offset = position.epoch, position.offset
        for _ in range(steps):
            if offset + self.global_batch > self.num_samples:
                epoch, offset = epoch + 1, 0
            offset += self.global_batch
        return DataPosition(epoch, offset, position.samples_seen + steps * self.global_batch)

    def batches(self) -> Iterator[tuple[int, list[int]]]:
        """This worker's batches from ``start`` on, each with the epoch it belongs to."""
        epoch, offset = self.start.epoch, self.start.offset
        while True:
            order = epoch_permutation(self.num_samples, self.seed, epoch, self.shuffle, self.members)
            while offset + self.global_batch <= self.num_samples:
                first = offset + self.dp_rank * self.batch_size
                yield epoch, order[first : first + self.batch_size].tolist()
                offset += self.global_batch
            epoch, offset = epoch + 1, 0

    def __iter__(self) -> Iterator[list[int]]:
        for _, batch in self.batches():
            yield batch

    def __len__(self) -> int:  # batches per epoch; the sampler itself never ends
        return self.num_samples // self.global_batch
