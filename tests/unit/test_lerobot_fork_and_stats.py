"""LeRobot datasets across a fork, and their ``meta/stats.json`` checked when opened.

A dataset without ``meta/stats.json`` decodes camera frames in the training process to
measure them; DataLoader workers are forked after that. A forked child that inherited open
FFmpeg decoders and freed them waited forever for threads it does not have, so the
children here are real ``fork`` processes, watched with a timeout.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_dataset_factory import ACTION_KEY, IMAGE_KEY, STATE_KEY, VIDEO_KEY, write_lerobot_dataset
from lerobot_kit.plugins.datasets.lerobot.files import LeRobotDatasetError
from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig
from lerobot_kit.plugins.datasets.lerobot.reader import LeRobotDataset, make_lerobot_dataset

CHILD_TIMEOUT_S = 30


@pytest.fixture(autouse=True)
def isolated_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.delenv("HF_LEROBOT_HOME", raising=False)


def load(root: Path, delta_indices: dict[str, list[int]] | None = None) -> LeRobotDataset:
    return make_lerobot_dataset(LeRobotDatasetConfig(repo_id="user/x", root=str(root)), delta_indices or {})


def _decode_in_child(dataset: LeRobotDataset, index: int, results: multiprocessing.Queue) -> None:
    results.put(dataset.item(index, uint8_cameras=True)[VIDEO_KEY].numpy())


def test_a_forked_child_decodes_after_the_parent_measured_the_camera(tmp_path: Path) -> None:
    write_lerobot_dataset(tmp_path, [20, 20], video=True, stats=False)
    dataset = load(tmp_path, {VIDEO_KEY: [-1, 0]})  # camera stats computed here: the parent has decoded frames
    assert dataset.meta.stats[VIDEO_KEY]["mean"].shape == (3, 1, 1)
    expected = dataset.item(15, uint8_cameras=True)[VIDEO_KEY].numpy()  # and holds decoders open now
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    child = fork.Process(target=_decode_in_child, args=(dataset, 15, results))
    child.start()
    child.join(CHILD_TIMEOUT_S)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"the forked child did not decode one item in {CHILD_TIMEOUT_S} s (deadlocked)")
    assert child.exitcode == 0
    assert np.array_equal(results.get(timeout=10), expected)
    # The parent's own decoders were closed for the fork; it opens them again as needed.
    assert torch.equal(dataset.item(15, uint8_cameras=True)[VIDEO_KEY], torch.from_numpy(expected))


def _with_stat(root: Path, key: str, name: str, value: object) -> None:
    path = root / "meta/stats.json"
    stats = json.loads(path.read_text())
    stats[key][name] = value
    path.write_text(json.dumps(stats))


@pytest.mark.parametrize(
    ("key", "name", "value", "expected"),
    [
        (ACTION_KEY, "std", [0.5, float("nan")], "action.std[1] is nan, not a finite float32;"),
        (STATE_KEY, "max", [1.0, float("inf"), 2.0, float("-inf")],
         "observation.state.max[1] is inf, not a finite float32 (2 of its 4 values are not finite);"),
        (STATE_KEY, "mean", [0.0, 1e39, 0.0, 0.0], "observation.state.mean[1] is 1e+39, not a finite float32;"),
        (IMAGE_KEY, "min", [[[0.0]], [[float("nan")]], [[0.0]]], "observation.images.top.min[1][0][0] is nan"),
    ],
    ids=["nan", "infinities", "beyond_float32", "camera"],
)
def test_a_non_finite_stat_is_refused_when_the_dataset_is_opened(
    tmp_path: Path, key: str, name: str, value: object, expected: str
) -> None:
    write_lerobot_dataset(tmp_path, [6, 5], image=True)
    _with_stat(tmp_path, key, name, value)
    with pytest.raises(LeRobotDatasetError) as raised:
        load(tmp_path)
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 'meta/stats.json'}: ") and expected in message, message
    assert message.endswith(f"fix: correct it, or remove the {key!r} entry from meta/stats.json to have its stats "
                            "computed from the data")
    assert "\n" not in message
