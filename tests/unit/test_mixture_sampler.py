"""Sampling a dataset mixture: each member's share of the samples, by both samplers, on one
or two data-parallel ranks, resumed exactly; a single dataset's order unchanged."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.data.blocks import BlockPlan
from lerobot_kit.core.data.build import build_dataset
from lerobot_kit.core.data.dataset import InMemoryDataset
from lerobot_kit.core.data.loader import build_loader
from lerobot_kit.core.data.member_quota import MemberQuota, largest_remainder
from lerobot_kit.core.data.sampler import DataPosition, ResumableBatchSampler, epoch_permutation

FRAMES = np.array([300, 1200, 500])  # members laid end to end: 2000 frames
EPISODES = np.array([60] * 5 + [80] * 15 + [45, 55] * 5)  # whole episodes of each member in turn
WEIGHTED = MemberQuota(FRAMES, np.array([0.5, 0.2, 0.3]))  # the small member up, the large one down
BY_FRAMES = MemberQuota(FRAMES, FRAMES / FRAMES.sum())
BATCH, BLOCK, BUFFER, SEED = 16, 8, 32, 5
SAMPLES = 10_000


def member_of(indices: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.cumsum(FRAMES), indices, side="right")


def random_samples(members: MemberQuota | None, world: int, count: int, seed: int = SEED) -> np.ndarray:
    """The first global batches holding ``count`` samples: the union of every rank's batches, step by step."""
    samplers = [ResumableBatchSampler(int(FRAMES.sum()), BATCH, world, rank, seed, members=members)
                for rank in range(world)]
    steps = -(-count // (BATCH * world))
    per_rank = [list(itertools.islice(iter(sampler), steps)) for sampler in samplers]
    return np.array([index for step in zip(*per_rank) for batch in step for index in batch])


def block_samples(members: MemberQuota | None, world: int, count: int, seed: int = SEED) -> np.ndarray:
    """Whole epochs of every rank's block sampling until they hold ``count`` samples."""
    plans = [BlockPlan(EPISODES, BLOCK, BUFFER, BATCH, world, rank, seed, members) for rank in range(world)]
    samples: list[np.ndarray] = []
    epoch = 0
    while sum(map(len, samples)) < count:
        for plan in plans:
            rank_epoch = plan.epoch(epoch)
            samples.append(rank_epoch.inputs[rank_epoch.outputs])
        epoch += 1
    return np.concatenate(samples)


SAMPLERS = {"random": random_samples, "episode_blocks": block_samples}


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("members", [WEIGHTED, BY_FRAMES], ids=["weights", "by_frames"])
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_each_member_gets_its_share_of_the_samples(sampler: str, members: MemberQuota, world: int) -> None:
    samples = SAMPLERS[sampler](members, world, SAMPLES)
    assert len(samples) >= SAMPLES
    observed = np.bincount(member_of(samples), minlength=len(FRAMES)) / len(samples)
    assert np.all(np.abs(observed - members.shares) <= 0.02 * members.shares), (observed, members.shares)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_the_order_is_a_function_of_the_seed(sampler: str) -> None:
    draw = SAMPLERS[sampler]
    assert np.array_equal(draw(WEIGHTED, 2, 4000), draw(WEIGHTED, 2, 4000))
    assert not np.array_equal(draw(WEIGHTED, 2, 4000), draw(WEIGHTED, 2, 4000, seed=SEED + 1))


def test_a_resumed_random_sampler_yields_the_batches_of_the_uninterrupted_one() -> None:
    straight = ResumableBatchSampler(int(FRAMES.sum()), BATCH, 2, 1, SEED, members=WEIGHTED)
    position = straight.advance(DataPosition(), 100)  # 62 steps per epoch: into the second
    resumed = ResumableBatchSampler(int(FRAMES.sum()), BATCH, 2, 1, SEED, start=position, members=WEIGHTED)
    assert position.epoch == 1
    assert list(itertools.islice(iter(straight), 100, 140)) == list(itertools.islice(iter(resumed), 40))


def test_within_an_epoch_no_frame_of_a_member_repeats_before_all_its_frames_were_used() -> None:
    order = epoch_permutation(int(FRAMES.sum()), SEED, 3, True, WEIGHTED).numpy()
    assert len(order) == FRAMES.sum()
    for member, (start, frames, quota) in enumerate(zip(WEIGHTED.starts, FRAMES, WEIGHTED.quotas())):
        uses = np.bincount(order[member_of(order) == member] - start, minlength=frames)
        assert uses.sum() == quota and uses.max() - uses.min() <= 1  # 1000 of 300 frames: 3 or 4 times each

    blocks = BlockPlan(EPISODES, BLOCK, BUFFER, BATCH, 1, 0, SEED, WEIGHTED).blocks
    drawn = WEIGHTED.epoch_blocks(blocks, np.random.default_rng(0))
    for member, quota in enumerate(WEIGHTED.quotas()):
        own = drawn[member_of(blocks[drawn, 0]) == member]
        uses = np.bincount(own, minlength=len(blocks))[member_of(blocks[:, 0]) == member]
        frames = int(np.sum(blocks[own, 1] - blocks[own, 0]))
        assert uses.max() - uses.min() <= 1 and quota <= frames < quota + BLOCK

    plans = [BlockPlan(EPISODES, BLOCK, BUFFER, BATCH, 2, rank, SEED, WEIGHTED).epoch(2) for rank in range(2)]
    both_ranks = np.concatenate([plan.inputs for plan in plans])
    down_weighted = both_ranks[member_of(both_ranks) == 1]  # 400 of its 1200 frames
    assert len(np.unique(down_weighted)) == len(down_weighted)


def test_a_single_datasets_order_is_unchanged() -> None:
    generator = torch.Generator()
    generator.manual_seed(SEED * 100_003 + 2)
    expected = torch.randperm(2000, generator=generator)
    assert torch.equal(epoch_permutation(2000, SEED, 2, True), expected)
    start = ResumableBatchSampler(2000, BATCH, 2, 1, SEED).advance(DataPosition(), 62 * 2)
    sampler = ResumableBatchSampler(2000, BATCH, 2, 1, SEED, start=start)
    assert next(iter(sampler)) == expected[BATCH : 2 * BATCH].tolist()

    plan = BlockPlan(EPISODES, BLOCK, BUFFER, BATCH, 2, 1, SEED)
    order = np.random.default_rng([SEED, 2]).permutation(len(plan.blocks))
    frames = np.concatenate([np.arange(*plan.blocks[b]) for b in order])
    assert np.array_equal(plan.epoch(2).inputs, frames[plan.share : 2 * plan.share])


def test_largest_remainder_rounds_shares_to_counts_that_add_up() -> None:
    assert largest_remainder(10, np.full(3, 1 / 3)).tolist() == [4, 3, 3]
    assert largest_remainder(7, np.array([0.5, 0.5, 0.0])).tolist() == [4, 3, 0]
    assert largest_remainder(2000, WEIGHTED.shares).tolist() == [1000, 400, 600]
    assert largest_remainder(5, np.array([0.01, 0.99])).tolist() == [0, 5]
    assert BY_FRAMES.quotas().tolist() == FRAMES.tolist()


class ReportsMembers(InMemoryDataset):
    """The embedded task's frames reported as two members, as a mixture reports its own."""

    def __init__(self, dataset: InMemoryDataset, frames: list[int], shares: list[float]) -> None:
        super().__init__(dataset.meta, dataset.frames, dataset.episode_index, dataset.delta_indices)
        self.frames_per_member, self.shares = np.array(frames), np.array(shares)

    def member_frames(self) -> np.ndarray:
        return self.frames_per_member

    def member_shares(self) -> np.ndarray:
        return self.shares


@pytest.mark.parametrize("sampler", ["random", "episode_blocks"])
def test_the_loader_samples_the_datasets_members_and_resumes_exactly(sampler: str) -> None:
    flags = ["--dataset.num_episodes=4", "--dataset.episode_length=10", "--batch_size=4", "--num_workers=0",
             "--policy.chunk_size=2", "--policy.n_action_steps=2", f"--dataset.sampler.type={sampler}"]
    if sampler == "episode_blocks":
        flags.append("--dataset.sampler.block_size=3")
    config = parse_train_config(flags)
    dataset = ReportsMembers(build_dataset(config), [10, 30], [0.5, 0.5])  # the first episode, then three

    def batches(start: DataPosition, count: int) -> list[dict[str, torch.Tensor]]:
        loader = build_loader(dataset, config, 1, 0, start, torch.device("cpu"))
        return list(itertools.islice(iter(loader), count))

    straight = batches(DataPosition(), 30)  # 10 steps per epoch
    position = ResumableBatchSampler(40, 4, 1, 0, config.seed).advance(DataPosition(), 13)
    for a, b in zip(straight[13:], batches(position, 17), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
    indices = torch.cat([batch["index"] for batch in straight]).numpy()
    first_member = np.count_nonzero(indices < 10) / len(indices)
    assert first_member == 0.5 if sampler == "random" else abs(first_member - 0.5) < 0.1
