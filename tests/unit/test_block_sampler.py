"""Episode-block sampling: the plan of an epoch, and the loader that follows it, resumed."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch

from lerobot_dataset_factory import write_lerobot_dataset
from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.data.blocks import BlockPlan, Window, shuffle_windows
from lerobot_kit.core.data.build import build_dataset
from lerobot_kit.core.data.loader import batch_to_device, build_loader
from lerobot_kit.core.data.sampler import DataPosition

LENGTHS = np.array([23, 9, 31, 17])  # 80 frames


def test_epoch_plans_split_shuffled_blocks_between_ranks() -> None:
    plans = [BlockPlan(LENGTHS, 6, 10, 4, 2, rank, seed=3) for rank in range(2)]
    starts = np.concatenate([[0], np.cumsum(LENGTHS)])
    assert plans[0].share == 80 // 8 * 4 == 40
    assert plans[0].window == 8  # the buffer's 10 frames, in whole batches of 4
    for epoch in range(3):
        epochs = [plan.epoch(epoch) for plan in plans]
        assert not set(epochs[0].inputs.tolist()) & set(epochs[1].inputs.tolist())
        everything = np.concatenate([e.inputs for e in epochs])  # the epoch's blocks, end to end
        run_starts = np.flatnonzero(np.diff(everything, prepend=-2) != 1)
        assert np.isin(everything[run_starts], plans[0].blocks[:, 0]).all()  # whole blocks: none is cut
        assert ((plans[0].blocks[:, 1] - plans[0].blocks[:, 0] <= 6)
                & (np.searchsorted(starts, plans[0].blocks[:, 0], side="right")
                   == np.searchsorted(starts, plans[0].blocks[:, 1] - 1, side="right"))).all()  # within an episode
        for e in epochs:
            assert len(e.inputs) == 40 and sorted(e.outputs.tolist()) == list(range(40))
            assert (e.outputs // 8 == np.arange(40) // 8).all()  # each window shuffled within itself
            windows = list(e.windows(12))  # from the middle of the second window on
            assert [len(w) for w in windows] == [4, 8, 8, 8]
            assert np.array_equal(np.concatenate(windows), e.inputs[e.outputs[12:]])
    assert not np.array_equal(plans[0].epoch(0).inputs, plans[0].epoch(1).inputs)  # reshuffled each epoch
    assert np.array_equal(plans[0].epoch(1).outputs, BlockPlan(LENGTHS, 6, 10, 4, 2, 0, seed=3).epoch(1).outputs)


def test_shuffle_windows_permutes_each_window_within_itself() -> None:
    out = shuffle_windows(1000, 16, np.random.default_rng(0))
    assert sorted(out.tolist()) == list(range(1000))
    assert (out // 16 == np.arange(1000) // 16).all() and not np.array_equal(out, np.arange(1000))
    assert shuffle_windows(5, 1, np.random.default_rng(0)).tolist() == [0, 1, 2, 3, 4]  # one frame: no shuffle
    assert shuffle_windows(0, 8, np.random.default_rng(0)).tolist() == []


def test_a_window_is_decoded_in_frame_order_a_group_at_a_time() -> None:
    window = Window([(0, 7), (0, 3), (0, 12), (0, 4), (0, 5)], batch_size=5, group=2)
    assert list(window.groups()) == [[1, 3], [4, 0], [2]]  # frames 3, 4 | 5, 7 | 12


def test_block_loader_resumes_exactly_and_serves_the_datasets_items(tmp_path: Path) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS.tolist(), video=True)
    flags = ["--dataset.repo_id=user/x", f"--dataset.root={tmp_path}", "--policy.chunk_size=3",
             "--policy.n_action_steps=3", "--batch_size=4", "--dataset.sampler.type=episode_blocks",
             "--dataset.sampler.block_size=5", "--dataset.sampler.buffer_size=12"]

    def batches(workers: int, start: DataPosition, count: int) -> list[dict[str, torch.Tensor]]:
        config = parse_train_config([*flags, f"--num_workers={workers}"])
        loader = build_loader(build_dataset(config), config, 1, 0, start, torch.device("cpu"))
        return list(itertools.islice(iter(loader), count))

    straight = batches(0, DataPosition(), 26)  # 20 steps per epoch: into the second epoch
    with_workers = batches(2, DataPosition(), 26)
    config = parse_train_config(flags)
    dataset = build_dataset(config)
    position = build_loader(dataset, config, 1, 0, DataPosition(), torch.device("cpu")).sampler.advance(
        DataPosition(), 17)
    resumed = batches(2, position, 9)
    assert len(with_workers) == len(straight)
    for a, b in zip(straight, with_workers):
        assert all(_same(a[k], b[k]) for k in a)
    for a, b in zip(straight[17:], resumed):
        assert all(_same(a[k], b[k]) for k in a)
    epoch0 = torch.cat([b["index"] for b in straight[:20]]).tolist()
    assert sorted(epoch0) == list(range(80))  # every frame once per epoch
    assert epoch0 != list(range(80))
    item = dataset[epoch0[5]]
    served = batch_to_device(straight[1], torch.device("cpu"), dataset.meta.image_keys())  # cameras leave it uint8
    assert all(_same(served[k][1], item[k]) for k in item)


def test_the_embedded_task_samples_blocks_through_the_same_contract() -> None:
    config = parse_train_config(["--dataset.num_episodes=3", "--dataset.episode_length=10", "--batch_size=5",
                                 "--dataset.sampler.type=episode_blocks", "--dataset.sampler.block_size=4",
                                 "--num_workers=0"])
    dataset = build_dataset(config)
    assert dataset.episode_lengths().tolist() == [10, 10, 10]
    loader = build_loader(dataset, config, 1, 0, DataPosition(), torch.device("cpu"))
    epoch = list(itertools.islice(iter(loader), 6))  # 30 frames, 6 batches of 5
    assert sorted(torch.cat([b["index"] for b in epoch]).tolist()) == list(range(30))
    assert torch.equal(epoch[0]["action"][0], dataset[int(epoch[0]["index"][0])]["action"])


def _same(a: object, b: object) -> bool:
    """Tensors element for element; anything else (a frame's task text) by equality."""
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
