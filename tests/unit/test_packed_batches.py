"""What DataLoader workers return, packed in one block of shared memory (``core.data.packed``)
that the worker fills again once the main process is done (``core.data.shared_blocks``):
the same values, dtypes, shapes and strides as the tensors packed, and no batch ever
overwritten while the main process still holds it, whether a worker sends one batch or a
window's batches (episode-block sampling). Workers are real processes."""

from __future__ import annotations

import functools
import itertools
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lerobot_dataset_factory import VIDEO_KEY, write_lerobot_dataset
from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.data.build import build_dataset
from lerobot_kit.core.data.loader import batch_to_device, build_loader, collate
from lerobot_kit.core.data.packed import MismatchedItems, Packed
from lerobot_kit.core.data.sampler import DataPosition
from lerobot_kit.core.data.shared_blocks import SLOTS, LentBlocks, ReusedBlocks, SharedBlocks, release

CPU = torch.device("cpu")
TIMEOUT_S = 60


def items() -> list[dict[str, object]]:
    """Items as the LeRobot reader hands them out: channel-first views of channel-last frames,
    vectors, flags, 0-d views of one tensor, a text."""
    generator = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (5, 6, 8, 3), dtype=torch.uint8, generator=generator)
    indices = torch.arange(3).unbind()
    return [{"camera": frames[i : i + 2].permute(0, 3, 1, 2), "now": frames[i].permute(2, 0, 1),
             "action": torch.randn(4, 2, generator=generator),
             "action_is_pad": torch.tensor([False, True, True, False]),
             "index": indices[i], "task": f"task {i}", "empty": torch.zeros(0, 2)} for i in range(3)]


def assert_same(ours: dict[str, object], theirs: dict[str, object]) -> None:
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            got = ours[key]
            assert isinstance(got, torch.Tensor) and got.dtype == value.dtype and torch.equal(got, value), key
            if value.numel():
                assert got.stride() == value.stride(), key
        else:
            assert ours[key] == value, key


def test_a_packed_batch_is_the_collated_batch() -> None:
    batch = pickle.loads(pickle.dumps(Packed.batch(items()))).unpack()
    assert_same(batch, collate(items()))
    assert batch["now"].is_contiguous(memory_format=torch.channels_last)


def test_packed_batches_filled_in_any_order_are_the_collated_batches() -> None:
    window = items() + items()[::-1]  # six samples, two batches of three
    groups = [([4, 0], [window[4], window[0]]), ([5], [window[5]]), ([3, 1, 2], [window[3], window[1], window[2]])]
    batches = pickle.loads(pickle.dumps(Packed.batches(6, 3, groups))).unpack()
    assert len(batches) == 2
    for batch, lo in zip(batches, (0, 3)):
        assert_same(batch, collate(window[lo : lo + 3]))
        assert batch["now"].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("change", [lambda v: v[:1], lambda v: v.double()], ids=["shape", "dtype"])
def test_items_that_disagree_on_a_tensor_cannot_be_packed_into_batches(change) -> None:
    window = items()
    window[2]["action"] = change(window[2]["action"])
    with pytest.raises(MismatchedItems, match=r"items disagree on 'action': \(4, 2\) torch.float32 and"):
        Packed.batches(3, 3, [([0, 1, 2], window)])


def test_items_that_disagree_on_their_keys_cannot_be_packed_into_batches() -> None:
    window = items()
    del window[1]["task"]
    with pytest.raises(MismatchedItems, match="items disagree on their keys"):
        Packed.batches(3, 3, [([0, 1, 2], window)])


class _Numbers(Dataset):
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> int:
        return i


def _fill(numbers: list[int], blocks: SharedBlocks) -> tuple[tuple[str, int, int] | None, int, torch.Tensor]:
    """In the worker: a block filled with the batch's first number, its slot and its address there."""
    block, slot = blocks.take(4096)
    block.fill_(numbers[0] % 251)
    return slot, block.data_ptr(), block


def test_a_worker_fills_its_blocks_again_only_once_the_main_process_released_them() -> None:
    blocks = SharedBlocks(workers=1)
    loader = DataLoader(_Numbers(), batch_size=1, num_workers=1, timeout=TIMEOUT_S,
                        collate_fn=functools.partial(_fill, blocks=blocks))
    batches = iter(loader)
    held = [(n % 251, *next(batches)) for n in range(12)]
    # Nothing released yet: the worker used each of its blocks once, then made fresh ones.
    assert [slot is not None for _, slot, _, _ in held] == [True] * SLOTS + [False] * (12 - SLOTS)
    assert all(torch.all(block == value) for value, _, _, block in held)  # none was overwritten
    first = {address for _, slot, address, _ in held if slot is not None}
    for _, slot, _, _ in held:
        if slot is not None:
            release(slot)
    held.clear()
    again = []
    for n in range(12, 36):
        slot, address, block = next(batches)
        assert torch.all(block == n % 251)
        again.append((slot, address))
        del block
        if slot is not None:
            release(slot)
    # Past the batches it prefetched before the release, each batch is in one of its blocks, filled again.
    assert all(slot is not None for slot, _ in again[4:])
    assert {address for slot, address in again if slot is not None} <= first


def _sizes(numbers: list[int], blocks: SharedBlocks) -> list[tuple[int | None, int, int]]:
    """In the worker: three blocks taken one after the other, each freed before the next
    (as the main process frees one), as ``(slot, address, bytes)``."""
    taken = []
    for size in (4096, 1024, 8192):
        block, slot = blocks.take(size)
        assert slot is not None
        taken.append((slot[2], block.data_ptr(), block.numel()))
        blocks.free[slot[1], slot[2]] = 1
    return taken


def test_a_free_block_large_enough_serves_a_smaller_request_and_a_small_one_is_replaced() -> None:
    blocks = SharedBlocks(workers=1)
    loader = DataLoader(_Numbers(), batch_size=1, num_workers=1, timeout=TIMEOUT_S,
                        collate_fn=functools.partial(_sizes, blocks=blocks))
    (first, second, third) = next(iter(loader))
    assert first[0] == second[0] and first[1:] == second[1:] == (first[1], 4096)  # the same block serves 1024 bytes
    assert third[0] == first[0] and third[2] == 8192  # too small for 8192: the slot gets a new block


def test_reused_blocks_fill_a_block_again_only_once_nothing_views_its_batches() -> None:
    reused = ReusedBlocks()
    window = [([0, 1, 2], items())]
    held = Packed.batches(3, 3, window, reused).unpack()
    camera = held[0]["camera"][1:]  # a view of a view keeps the block in use
    address = held[0]["action"].untyped_storage().data_ptr()
    del held
    second = Packed.batches(3, 3, window, reused).unpack()
    assert second[0]["action"].untyped_storage().data_ptr() != address
    assert torch.equal(camera, collate(items())["camera"][1:])
    del camera, second
    third = Packed.batches(3, 3, window, reused).unpack()
    # Where torch does not count a storage's users, every window gets a fresh block.
    assert (third[0]["action"].untyped_storage().data_ptr() == address) == LentBlocks.COUNTED
    assert_same(third[0], collate(items()))
    every_one_held = [Packed.batches(3, 3, window, reused).unpack() for _ in range(SLOTS + 1)]
    assert all(held[0]["action"].untyped_storage().data_ptr() != address for held in every_one_held[1:])
    assert all(torch.equal(held[0]["action"], third[0]["action"]) for held in every_one_held)


@pytest.mark.parametrize("sampler", [[], ["--dataset.sampler.type=episode_blocks", "--dataset.sampler.buffer_size=8"]],
                         ids=["random", "episode_blocks"])
def test_a_loaders_batches_held_by_the_consumer_are_never_overwritten(tmp_path: Path, sampler: list[str]) -> None:
    """Batches of uint8 frames travel in reused blocks (a window of two batches a block under
    episode-block sampling); every batch is kept here until the end, and each equals the
    batch the loader makes without workers."""
    write_lerobot_dataset(tmp_path, [9, 14, 7], image=True, video=True)
    flags = ["--dataset.repo_id=user/x", f"--dataset.root={tmp_path}", "--policy.chunk_size=4",
             "--policy.n_action_steps=4", "--batch_size=4", "--seed=3", *sampler]
    batches = []
    for workers in (0, 2):
        config = parse_train_config([*flags, f"--num_workers={workers}"])
        loader = build_loader(build_dataset(config), config, 1, 0, DataPosition(), CPU)
        batches.append(list(itertools.islice(iter(loader), 5 * SLOTS)))
    for alone, with_workers in zip(*batches):
        assert_same(with_workers, alone)


@pytest.mark.parametrize("sampler", [[], ["--dataset.sampler.type=episode_blocks", "--dataset.sampler.buffer_size=8"]],
                         ids=["random", "episode_blocks"])
def test_a_loaders_block_is_filled_again_once_nothing_views_its_batch(tmp_path: Path, sampler: list[str]) -> None:
    """Batches are delivered without a copy: their tensors view the worker's block (one
    batch's, or a window's under episode-block sampling), which goes back to the worker once
    every tensor of its batches, view of one or NumPy array of one, is gone. A NumPy array
    of a camera batch, all that is kept of it, is never overwritten; dropped batches'
    blocks are filled again."""
    write_lerobot_dataset(tmp_path, [9, 14, 7], video=True)
    flags = ["--dataset.repo_id=user/x", f"--dataset.root={tmp_path}", "--policy.chunk_size=4",
             "--policy.n_action_steps=4", "--batch_size=4", "--seed=3", *sampler]
    expected = []
    config = parse_train_config([*flags, "--num_workers=0"])
    for batch in itertools.islice(iter(build_loader(build_dataset(config), config, 1, 0, DataPosition(), CPU)), 24):
        expected.append(batch[VIDEO_KEY].numpy().copy())
    config = parse_train_config([*flags, "--num_workers=2"])
    loader = build_loader(build_dataset(config), config, 1, 0, DataPosition(), CPU)
    kept, blocks = [], []
    for n, batch in enumerate(itertools.islice(iter(loader), 24)):
        frames = batch[VIDEO_KEY]
        blocks.append(frames.untyped_storage().data_ptr())
        if n % 3 == 0:
            kept.append((n, frames[1:].numpy()))  # a view of a view, as NumPy: the batch itself is dropped
        del batch, frames
    loader.close()
    assert all(np.array_equal(array, expected[n][1:]) for n, array in kept)
    # Workers take turns, so consecutive results never share a block: a block seen again was filled again.
    results = 1 + sum(a != b for a, b in zip(blocks, blocks[1:]))
    assert len(set(blocks)) < results


def test_cameras_leave_the_loader_as_stored_and_become_the_datasets_float_items_on_the_device(
        tmp_path: Path) -> None:
    """A quarter of the bytes cross from the workers (and to a GPU): the loader's camera batches
    are uint8, and ``batch_to_device`` turns them into exactly the float items the dataset serves."""
    write_lerobot_dataset(tmp_path, [9, 14], image=True, video=True)
    config = parse_train_config(["--dataset.repo_id=user/x", f"--dataset.root={tmp_path}", "--policy.chunk_size=4",
                                 "--policy.n_action_steps=4", "--batch_size=4", "--num_workers=2"])
    dataset = build_dataset(config)
    cameras = dataset.meta.image_keys()
    loader = build_loader(dataset, config, 1, 0, DataPosition(), CPU)
    served = list(itertools.islice(iter(loader), 3))
    assert len(cameras) == 2 and all(batch[key].dtype == torch.uint8 for batch in served for key in cameras)
    for batch in served:
        moved = batch_to_device(batch, CPU, cameras)
        items = dataset.items(batch["index"].tolist())
        for key in cameras:
            assert moved[key].dtype == torch.float32
            assert torch.equal(moved[key], torch.stack([item[key] for item in items]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_pinned_uint8_batch_becomes_the_same_float_frames_on_the_gpu() -> None:
    """The copy to the GPU does not block (page-locked source) and the conversion there gives
    the values the host's conversion gives, bit for bit."""
    frames = torch.arange(256, dtype=torch.uint8).repeat(2, 3, 4, 1).permute(0, 3, 1, 2).pin_memory()
    batch = {"camera": frames, "action": torch.randn(2, 3).pin_memory(), "task": ["a", "b"]}
    on_gpu = batch_to_device(batch, torch.device("cuda"), ["camera"])
    on_host = batch_to_device(batch, CPU, ["camera"])
    assert on_gpu["camera"].device.type == "cuda" and on_gpu["task"] == ["a", "b"]
    assert torch.equal(on_gpu["camera"].cpu(), on_host["camera"])
