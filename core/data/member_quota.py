"""The share of each member of a dataset mixture in an epoch, for both samplers.

A mixture lays its members end to end in the index space and asks for a fraction of the
samples for each (``PolicyDataset.member_shares``). An epoch keeps its length, the total
number of frames, so a position and its arithmetic (resume, another number of ranks) do not
depend on the mixture; only which frames fill the epoch does. Member ``m`` gets
``quotas()[m]`` of them, drawn from successive fresh permutations of its own frames (or
episode blocks): a member asked for fewer samples than it has uses a prefix of one
permutation, so none of its frames comes twice in an epoch; one asked for more goes through
all its frames before any comes again. The draws are a pure function of the generator the
sampler seeds from ``(seed, epoch)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lerobot_kit.core.data.dataset import PolicyDataset


@dataclass(frozen=True)
class MemberQuota:
    """Frames per member (laid end to end) and each member's target fraction of the samples."""

    frames: np.ndarray
    shares: np.ndarray

    def __post_init__(self) -> None:
        assert len(self.frames) == len(self.shares) > 0, "one share per member"
        assert (np.asarray(self.shares) >= 0).all() and np.sum(self.shares) > 0, "shares are fractions"
        assert (np.asarray(self.frames) > 0).all(), "every member has frames"

    @classmethod
    def of(cls, dataset: PolicyDataset) -> MemberQuota | None:
        """The dataset's members, or None for a single dataset (sampled uniformly)."""
        frames, shares = dataset.member_frames(), dataset.member_shares()
        if frames is None or shares is None:
            return None
        return cls(np.asarray(frames, dtype=np.int64), np.asarray(shares, dtype=np.float64))

    @property
    def starts(self) -> np.ndarray:
        """The index of each member's first frame."""
        return np.concatenate([[0], np.cumsum(self.frames)[:-1]]).astype(np.int64)

    def quotas(self) -> np.ndarray:
        """Samples per member in an epoch: the total number of frames split by share, rounded by
        largest remainder so that they add up to it exactly."""
        return largest_remainder(int(np.sum(self.frames)), self.shares)

    def epoch_samples(self, rng: np.random.Generator | None) -> np.ndarray:
        """An epoch's frame indices in training order; members' frames in index order without ``rng``."""
        samples = np.concatenate([
            start + permutations(int(frames), int(quota), rng)
            for start, frames, quota in zip(self.starts, self.frames, self.quotas())
        ])
        return samples if rng is None else rng.permutation(samples)

    def epoch_blocks(self, blocks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """An epoch's order of ``blocks`` (``[n, 2]`` frame ranges, none across two members): each
        member's blocks drawn until they hold its quota of frames, then all shuffled together."""
        member_of = np.searchsorted(self.starts, blocks[:, 0], side="right") - 1
        lengths = blocks[:, 1] - blocks[:, 0]
        chosen = []
        for member, quota in enumerate(self.quotas().tolist()):
            own = np.flatnonzero(member_of == member)
            if quota == 0:
                continue
            cycles = -(-quota // int(self.frames[member]))  # each pass over the blocks holds all its frames
            drawn = own[permutations(len(own), cycles * len(own), rng)]
            enough = int(np.searchsorted(np.cumsum(lengths[drawn]), quota)) + 1
            chosen.append(drawn[:enough])
        return rng.permutation(np.concatenate(chosen))


def largest_remainder(total: int, shares: np.ndarray) -> np.ndarray:
    """``total × shares`` (normalised) as integers adding up to ``total``: each rounded down, the
    units left over given to the largest remainders (the first member on a tie)."""
    exact = total * np.asarray(shares, dtype=np.float64) / np.sum(shares)
    counts = np.floor(exact).astype(np.int64)
    leftover = total - int(counts.sum())
    counts[np.argsort(counts - exact, kind="stable")[:leftover]] += 1
    return counts


def permutations(size: int, count: int, rng: np.random.Generator | None) -> np.ndarray:
    """The first ``count`` items of successive fresh permutations of ``range(size)`` (of
    ``range(size)`` itself, repeated, without ``rng``)."""
    passes = [rng.permutation(size) if rng is not None else np.arange(size) for _ in range(-(-count // size))]
    return np.concatenate(passes)[:count] if passes else np.empty(0, dtype=np.int64)
