"""Hundreds of LeRobot datasets read in one process, as each DataLoader worker of a mixture reads its members.

Every open video decoder and every memory-mapped data file holds a file descriptor. Kept
per dataset, they would grow with the number of datasets, past the open-file limit of
1024 that many machines set. The reader shares one bounded pool of each per process, so
here a real child process whose limit is 1024 opens 300 datasets and reads them in turn,
twice, then forks a child that does the same (as a DataLoader worker forked from it
would). Its open descriptors stay under a bound that does not depend on the number of
datasets, and every item equals the written data, the second round's (everything closed
and reopened since) the first's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lerobot_dataset_factory import STATE_KEY, VIDEO_KEY, WrittenDataset, write_lerobot_dataset
from lerobot_kit.plugins.datasets.lerobot import video
from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig
from lerobot_kit.plugins.datasets.lerobot.reader import make_lerobot_dataset

DATASETS = 300
EPISODES = [4, 3]
OPEN_FILE_LIMIT = 1024
CHILD_TIMEOUT_S = 240
# Descriptors the child may hold beyond its imports: every decoder its pool allows (three
# quarters of its limit; mapped data files hold none), a file being opened, and the queue of
# the forked child.
BOUND = OPEN_FILE_LIMIT * 3 // 4 + 16

CHILD = r"""
import hashlib, json, multiprocessing, os, resource, sys

args = json.loads(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (args["limit"], resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

import torch
from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig
from lerobot_kit.plugins.datasets.lerobot.reader import make_lerobot_dataset

roots, frames, timeout = args["roots"], args["frames"], args["timeout"]

def open_fds():
    return len(os.listdir("/proc/self/fd"))

def read_all(datasets):
    most, values = open_fds(), []
    for dataset, frame in zip(datasets, frames):
        item = dataset.item(frame, uint8_cameras=True)
        camera = hashlib.sha256(item[args["camera"]].contiguous().numpy().tobytes()).hexdigest()
        values.append([item[args["state"]].tolist(), camera])
        most = max(most, open_fds())
    return most, values

def in_forked_child(datasets, baseline, results):
    most, values = read_all(datasets)
    results.put({"grown": most - baseline, "values": values})

baseline = open_fds()
datasets = [make_lerobot_dataset(LeRobotDatasetConfig(repo_id=f"user/member{n}", root=root), {})
            for n, root in enumerate(roots)]
first_most, first = read_all(datasets)
second_most, second = read_all(datasets)
fork = multiprocessing.get_context("fork")
results = fork.Queue()
child = fork.Process(target=in_forked_child, args=(datasets, baseline, results))
child.start()
forked = results.get(timeout=timeout)
child.join(timeout)
print(json.dumps({"grown": max(first_most, second_most) - baseline, "rounds": [first, second], "forked": forked,
                  "limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "exitcode": child.exitcode}))
"""


@pytest.fixture(scope="module")
def many_datasets(tmp_path_factory: pytest.TempPathFactory) -> list[WrittenDataset]:
    """Tiny datasets of one 16×16 H.264 camera, each of its own data (``seed``)."""
    folder = tmp_path_factory.mktemp("many_datasets")
    return [write_lerobot_dataset(folder / f"member{n}", EPISODES, video=True, seed=n, codec="h264")
            for n in range(DATASETS)]


def test_hundreds_of_datasets_read_in_turn_stay_under_an_open_file_limit(many_datasets: list[WrittenDataset]) -> None:
    frames = [n % sum(EPISODES) for n in range(DATASETS)]  # every frame of an episode, the last included
    args = {"roots": [str(written.root) for written in many_datasets], "frames": frames, "limit": OPEN_FILE_LIMIT,
            "timeout": CHILD_TIMEOUT_S, "camera": VIDEO_KEY, "state": STATE_KEY}
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True,
                            timeout=CHILD_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["limit"] == OPEN_FILE_LIMIT and report["exitcode"] == 0
    assert report["grown"] <= BOUND and report["forked"]["grown"] <= BOUND, (report["grown"], report["forked"]["grown"])
    assert report["grown"] <= DATASETS + 16, report["grown"]  # a descriptor per open decoder; the 300 maps hold none
    first, second = report["rounds"]
    assert first == second == report["forked"]["values"]
    for (state, _), written, frame in zip(first, many_datasets, frames):
        assert np.array_equal(np.asarray(state, dtype=np.float32), written.state[frame])
    assert len({camera for _, camera in first}) > DATASETS // 2  # each dataset's own video, not a neighbour's


def test_datasets_read_in_alternation_each_decode_their_frames_once(tmp_path: Path) -> None:
    """The pool is shared, but each dataset finds its decoder where it left it: reading the
    frames of an episode in order decodes each once, whatever other datasets read between."""
    length = 30
    roots = [write_lerobot_dataset(tmp_path / f"member{n}", [length], video=True, seed=n).root for n in range(3)]
    datasets = [make_lerobot_dataset(LeRobotDatasetConfig(repo_id="user/member", root=str(root)), {}) for root in roots]
    for frame in range(length):
        for dataset in datasets:
            dataset.item(frame, uint8_cameras=True)
    for dataset in datasets:
        path = dataset.info.video_file(VIDEO_KEY, dataset.episodes[0].videos[VIDEO_KEY])
        decoder = video._OPEN.peek((dataset._videos._owner, path))
        assert decoder is not None and decoder.decoded == length
