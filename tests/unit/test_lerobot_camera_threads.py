"""A request's cameras read at once on threads (``camera_threads``): the same items, every
read finished before an error leaves, and forked workers that read on threads of their own."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_dataset_factory import IMAGE_KEY, VIDEO_KEY, write_lerobot_dataset
from lerobot_kit.api import camera_to_float
from lerobot_kit.plugins.datasets.lerobot.camera_threads import read_cameras
from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig
from lerobot_kit.plugins.datasets.lerobot.reader import LeRobotDataset, make_lerobot_dataset

CHILD_TIMEOUT_S = 30
HISTORY = {IMAGE_KEY: [-1, 0], VIDEO_KEY: [-2, 0, 1]}


def load(root: Path) -> LeRobotDataset:
    return make_lerobot_dataset(LeRobotDatasetConfig(repo_id="user/x", root=str(root)), HISTORY)


def test_cameras_are_read_on_threads_at_once_and_each_read_ends_before_an_error_is_raised() -> None:
    started, finished = [], []
    both_started = threading.Barrier(2, timeout=10)  # passes only if the two reads run at once

    def read(key: str) -> str:
        started.append((key, threading.current_thread().name))
        both_started.wait()
        if key == "bad":
            raise ValueError("bad camera")
        time.sleep(0.05)
        finished.append(key)
        return key.upper()

    assert read_cameras(read, ["a", "b"], max_threads=4) == {"a": "A", "b": "B"}
    assert all(name.startswith("cameras") for _, name in started)
    both_started.reset()
    with pytest.raises(ValueError, match="bad camera"):
        read_cameras(read, ["bad", "slow"], max_threads=4)
    assert finished[-1] == "slow"  # the other read had finished when the error was raised
    assert read_cameras(str.upper, ["a", "b", "c"], max_threads=2) == {"a": "A", "b": "B", "c": "C"}  # in turn


def test_items_read_on_threads_equal_items_read_camera_by_camera(tmp_path: Path) -> None:
    """``items`` reads the image and the video camera on threads, ``item`` one after the other."""
    write_lerobot_dataset(tmp_path, [9, 14, 7], image=True, video=True, episodes_per_file=2)
    dataset = load(tmp_path)
    indices = np.random.default_rng(3).integers(0, len(dataset), 24).tolist()
    for i, item in zip(indices, dataset.items(indices, uint8_cameras=True)):
        alone = dataset.item(i, uint8_cameras=True)
        assert item.keys() == alone.keys()
        for key in item:
            assert item[key] == alone[key] if key == "task" else torch.equal(item[key], alone[key]), (i, key)


def _items_in_child(dataset: LeRobotDataset, indices: list[int], results: multiprocessing.Queue) -> None:
    results.put([item[VIDEO_KEY].numpy() for item in dataset.items(indices, uint8_cameras=True)])


def test_a_forked_child_reads_cameras_on_threads_of_its_own(tmp_path: Path) -> None:
    write_lerobot_dataset(tmp_path, [20, 20], image=True, video=True)
    dataset = load(tmp_path)
    indices = [3, 25, 7, 39]
    expected = [item[VIDEO_KEY].numpy() for item in dataset.items(indices, uint8_cameras=True)]  # threads started
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    child = fork.Process(target=_items_in_child, args=(dataset, indices, results))
    child.start()
    child.join(CHILD_TIMEOUT_S)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"the forked child did not read {len(indices)} items in {CHILD_TIMEOUT_S} s (deadlocked)")
    assert child.exitcode == 0
    assert all(np.array_equal(a, b) for a, b in zip(results.get(timeout=10), expected))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_camera_frames_become_float_as_lerobot_divides_them(device: str) -> None:
    every_value = torch.arange(256, dtype=torch.uint8, device=device).repeat(2, 3, 4, 1)  # [2, 3, 4, 256]
    frames = every_value.permute(0, 3, 1, 2)  # channel-first view of channel-last memory, as the reader hands out
    converted = camera_to_float(frames)
    assert converted.dtype == torch.float32 and converted.device == frames.device
    assert torch.equal(converted, frames.to(torch.float32) / 255)  # as LeRobot: the float frame divided by 255
    assert converted.is_contiguous(memory_format=torch.channels_last)
