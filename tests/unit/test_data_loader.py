"""The training data pipeline (``core.data.loader``) with real DataLoader worker processes."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_dataset_factory import VIDEO_KEY, write_lerobot_dataset
from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.data.build import build_dataset
from lerobot_kit.core.data.loader import auto_num_workers, build_loader, sample_seed
from lerobot_kit.core.data.sampler import DataPosition
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.plugins.datasets.lerobot.files import LeRobotDatasetError

LENGTHS = [9, 14, 7]
CPU = torch.device("cpu")


def video_flags(root: Path) -> list[str]:
    return ["--dataset.repo_id=user/x", f"--dataset.root={root}", "--policy.chunk_size=4", "--policy.n_action_steps=4",
            "--batch_size=4"]


def batches(flags: list[str], count: int, start: DataPosition = DataPosition(), rank: int = 0, world: int = 1):
    config = parse_train_config(flags)
    loader = build_loader(build_dataset(config), config, world, rank, start, CPU)
    return loader, list(itertools.islice(iter(loader), count))


def assert_same_batches(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            same = torch.equal(x[key], y[key]) if isinstance(x[key], torch.Tensor) else x[key] == y[key]  # task text
            assert same, key


def test_workers_and_augmentations_give_the_batches_of_one_process_and_resume_exactly(tmp_path: Path) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS, video=True, image=True)
    flags = [*video_flags(tmp_path), "--dataset.image_transforms.enable=true", "--seed=5"]
    _, alone = batches([*flags, "--num_workers=0"], 12)  # 30 frames, 7 batches of 4 per epoch: crosses an epoch
    loader, with_workers = batches([*flags, "--num_workers=2"], 12)
    assert loader.num_workers == 2 and loader.loader.persistent_workers
    assert_same_batches(alone, with_workers)
    position = loader.sampler.advance(DataPosition(), 9)
    assert position.epoch == 1
    _, resumed = batches([*flags, "--num_workers=2"], 3, start=position)
    assert_same_batches(with_workers[9:], resumed)

    _, plain = batches([*video_flags(tmp_path), "--seed=5", "--num_workers=0"], 12)
    camera = "observation.images.top"
    changed = [not torch.equal(p[camera], a[camera]) for p, a in zip(plain, alone)]
    assert all(changed)  # augmentations are on, and draw differently for each sample
    assert all(torch.equal(p["action"], a["action"]) for p, a in zip(plain, alone))  # cameras only
    assert all(torch.equal(p["index"], a["index"]) for p, a in zip(plain, alone))
    # Each sample names the epoch of the order it was drawn in: 7 batches of epoch 0, then epoch 1
    # (the resumed loader's too); with its index, one draw of a frame.
    assert [b["epoch"].tolist() for b in alone] == [[0] * 4] * 7 + [[1] * 4] * 5
    draws = [(e, i) for b in alone[:7] for e, i in zip(b["epoch"].tolist(), b["index"].tolist())]
    assert len(set(draws)) == len(draws) == 28


def test_ranks_load_disjoint_slices_of_each_global_batch(tmp_path: Path) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS, video=True)
    flags = [*video_flags(tmp_path), "--num_workers=1"]
    _, rank0 = batches(flags, 3, rank=0, world=2)
    _, rank1 = batches(flags, 3, rank=1, world=2)
    for a, b in zip(rank0, rank1):
        assert not set(a["index"].tolist()) & set(b["index"].tolist())


@pytest.mark.parametrize("sampler", [[], ["--dataset.sampler.type=episode_blocks"]], ids=["random", "episode_blocks"])
def test_a_bad_frame_in_a_worker_is_the_readers_one_line_in_the_main_process(tmp_path: Path,
                                                                            sampler: list[str]) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS, video=True)
    meta_file = tmp_path / "meta/episodes/chunk-000/file-000.parquet"
    rows = pq.read_table(meta_file).to_pylist()
    rows[1][f"videos/{VIDEO_KEY}/from_timestamp"] += 10.0  # episode 1 points past the end of the video
    pq.write_table(pa.Table.from_pylist(rows), meta_file)
    config = parse_train_config([*video_flags(tmp_path), "--num_workers=2", *sampler])
    loader = build_loader(build_dataset(config), config, 1, 0, DataPosition(), CPU)
    with pytest.raises(LeRobotDatasetError) as error:
        for _ in itertools.islice(iter(loader), 20):
            pass
    message = str(error.value)
    video = tmp_path / f"videos/{VIDEO_KEY}/chunk-000/file-000.mp4"
    assert message.startswith(f"{video}: episode 1 needs the frame at ") and "\n" not in message
    assert "of 'observation.images.wrist' but the video has nearest frame at 2.9000s" in message


@pytest.mark.parametrize("sampler", [[], ["--dataset.sampler.type=episode_blocks"]], ids=["random", "episode_blocks"])
def test_a_corrupt_video_names_file_episode_and_time(tmp_path: Path, sampler: list[str]) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS, video=True, episodes_per_file=1)
    video = tmp_path / f"videos/{VIDEO_KEY}/chunk-000/file-001.mp4"
    video.write_bytes(b"\x00" * 64 + video.read_bytes()[64:200])
    config = parse_train_config([*video_flags(tmp_path), "--num_workers=1", *sampler])
    loader = build_loader(build_dataset(config), config, 1, 0, DataPosition(), CPU)
    with pytest.raises(LeRobotDatasetError) as error:
        for _ in itertools.islice(iter(loader), 20):
            pass
    message = str(error.value)
    assert message.startswith(f"{video}: cannot decode video 'observation.images.wrist' at ") and "\n" not in message
    assert "(episode 1): InvalidDataError" in message


@pytest.mark.parametrize(
    ("cpus", "local_world", "expected"), [(1, None, 0), (2, None, 1), (2, "2", 0), (16, "2", 4), (8, "1", 4)]
)
def test_automatic_workers_leave_each_rank_its_core(monkeypatch: pytest.MonkeyPatch, cpus: int,
                                                    local_world: str | None, expected: int) -> None:
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    if local_world is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world)
    assert auto_num_workers(world_size=1, cpus=cpus) == expected


def test_workers_default_to_none_for_data_held_in_memory_and_to_automatic_for_files(tmp_path: Path) -> None:
    """The reach data is generated into memory: a worker would only copy its batches
    between processes. A LeRobot dataset decodes per item: it gets the automatic count."""
    in_memory, _ = batches(["--batch_size=4"], 1)
    assert in_memory.num_workers == 0
    write_lerobot_dataset(tmp_path, LENGTHS, video=True)
    from_files, _ = batches(video_flags(tmp_path), 1)
    assert from_files.num_workers == auto_num_workers(world_size=1)


class GlobalRandom:
    """A plugin dataset that draws from the worker's global RNGs."""

    meta = None

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        info = torch.utils.data.get_worker_info()
        return {"torch": torch.randint(0, 2**30, ()), "numpy": torch.tensor(np.random.randint(0, 2**30)),
                "worker": torch.tensor(info.id)}


def test_worker_rngs_are_seeded_from_seed_rank_epoch_and_worker() -> None:
    from lerobot_kit.core.data.loader import _seed_worker

    loader = torch.utils.data.DataLoader(GlobalRandom(), batch_size=1, num_workers=2,
                                         worker_init_fn=lambda w: _seed_worker(w, seed=7, rank=1, epoch=3))
    first = {int(b["worker"]): b for b in itertools.islice(loader, 2)}
    for worker, batch in first.items():
        expected = sample_seed(7, 1, 3, worker)
        assert int(batch["torch"]) == int(torch.randint(0, 2**30, (), generator=torch.Generator().manual_seed(expected)))
        assert int(batch["numpy"]) == np.random.RandomState(expected % 2**32).randint(0, 2**30)
    assert len({sample_seed(7, 1, 3, 0), sample_seed(7, 1, 3, 1), sample_seed(7, 0, 3, 1), sample_seed(7, 1, 4, 0)}) == 4


def test_a_dataset_feature_named_epoch_is_refused_not_overwritten() -> None:
    config = parse_train_config(["--num_workers=0"])
    dataset = build_dataset(config)
    dataset.meta.features["epoch"] = dataset.meta.features["observation.state"]  # as a dataset that recorded one
    with pytest.raises(ConfigError, match="feature named 'epoch'.*rename that feature"):
        build_loader(dataset, config, 1, 0, DataPosition(), CPU)
