"""The LeRobot v3.0 dataset plugin, on datasets the tests write themselves (no download)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_dataset_factory import (
    ACTION_KEY,
    DONE_KEY,
    IMAGE_KEY,
    STATE_KEY,
    VIDEO_KEY,
    dataset_stats,
    hub_snapshot,
    write_lerobot_dataset,
)
from lerobot_kit.core.data.dataset import DatasetMeta
from lerobot_kit.core.errors import ConfigError, LerobotError
from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.plugins.datasets.lerobot.columns import FORMAT
from lerobot_kit.plugins.datasets.lerobot.files import LeRobotDatasetError
from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig
from lerobot_kit.plugins.datasets.lerobot.reader import make_lerobot_dataset
from lerobot_kit.core.registry.registry import get_registry

LENGTHS = [7, 12, 5]
CHUNK = {ACTION_KEY: list(range(8))}  # longer than the shortest episode


@pytest.fixture(autouse=True)
def isolated_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point every cache the reader searches into tmp_path, never at the user's real caches."""
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_LEROBOT_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return home


def load(root: Path | None, delta: dict[str, list[int]] | None = None, **fields: object):
    config = LeRobotDatasetConfig(repo_id="user/x", root=str(root) if root else None, **fields)
    return make_lerobot_dataset(config, CHUNK if delta is None else delta)


def test_registered_as_the_lerobot_type_and_picked_by_repo_id(tmp_path: Path) -> None:
    entry = get_registry().dataset("lerobot")
    assert entry.config_class is LeRobotDatasetConfig
    assert entry.load() is make_lerobot_dataset
    config = parse_train_config(
        ["--dataset.repo_id=user/x", f"--dataset.root={tmp_path}", "--dataset.episodes=[2,0,2]"]
    )
    assert isinstance(config.dataset, LeRobotDatasetConfig)
    assert config.dataset.type == "lerobot" and config.dataset.episodes == [0, 2]
    assert not config.dataset.allow_download


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--dataset.type=lerobot"], "--dataset: Value error, required for --dataset.type=lerobot"),
        (["--dataset.repo_id=justaname"], "--dataset.repo_id: Value error, expected a Hugging Face dataset id"),
        (["--dataset.repo_id=u/x", "--dataset.episodes=[]"], "--dataset.episodes: Value error, an empty episode list"),
        (["--dataset.repo_id=u/x", "--dataset.episodes=[-1]"], "episode indices are >= 0"),
    ],
)
def test_bad_flags_name_the_flag(args: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_train_config(args)
    assert expected in str(info.value)


def test_lengths_meta_and_tasks(tmp_path: Path) -> None:
    written = write_lerobot_dataset(tmp_path, LENGTHS, image=True)
    dataset = load(tmp_path)
    assert len(dataset) == sum(LENGTHS)
    meta = dataset.meta
    assert (meta.fps, meta.num_episodes, meta.num_frames) == (10, 3, 24)
    assert list(meta.features) == [STATE_KEY, ACTION_KEY, IMAGE_KEY, DONE_KEY]  # bookkeeping columns left out
    assert meta.features[STATE_KEY].shape == (4,)
    assert meta.features[STATE_KEY].names == ["x", "y", "target_x", "target_y"]
    assert meta.features[ACTION_KEY].names == ["vx", "vy"]  # LeRobot's {"motors": [...]} form, flattened
    assert meta.features[IMAGE_KEY].dtype == "image" and meta.features[IMAGE_KEY].shape == (3, 16, 16)
    assert meta.features[DONE_KEY].dtype == "bool"
    assert DatasetMeta.from_json(json.loads(json.dumps(meta.to_json()))).to_json() == meta.to_json()
    assert dataset.tasks == dict(enumerate(written.tasks))
    assert dataset.root == tmp_path and dataset.repo_id == "user/x"


def test_items_hold_the_written_frames(tmp_path: Path) -> None:
    written = write_lerobot_dataset(tmp_path, LENGTHS, image=True)
    dataset = load(tmp_path)
    for i in range(len(dataset)):
        item = dataset[i]
        assert set(item) == {STATE_KEY, ACTION_KEY, "action_is_pad", IMAGE_KEY, DONE_KEY, "episode_index", "index", "task"}
        assert item["task"] == written.tasks[written.task_index[i]]
        assert item[STATE_KEY].dtype == torch.float32
        assert torch.equal(item[STATE_KEY], torch.from_numpy(written.state[i]))
        image = item[IMAGE_KEY]
        assert image.dtype == torch.float32 and image.shape == (3, 16, 16)
        assert torch.equal(image, torch.from_numpy(written.cameras[IMAGE_KEY][i]).float() / 255.0)
        assert item[ACTION_KEY].shape == (8, 2) and item[ACTION_KEY].dtype == torch.float32
        assert item["action_is_pad"].dtype == torch.bool and item["action_is_pad"].shape == (8,)
        assert item[DONE_KEY].tolist() == [bool(written.done[i])]
        assert item["episode_index"].dtype == torch.int64 and item["episode_index"].item() == written.episode_index[i]
        assert item["index"].dtype == torch.int64 and item["index"].item() == i
    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=5)))
    assert batch[ACTION_KEY].shape == (5, 8, 2) and batch[IMAGE_KEY].shape == (5, 3, 16, 16)
    assert batch["task"] == [written.tasks[t] for t in written.task_index[:5]]


def test_chunks_never_cross_an_episode_boundary(tmp_path: Path) -> None:
    written = write_lerobot_dataset(tmp_path, LENGTHS, episodes_per_file=2)
    offsets = list(range(-3, 9))
    dataset = load(tmp_path, {ACTION_KEY: offsets})
    bounds = written.episode_bounds()
    for i in range(len(dataset)):
        start, end = bounds[written.episode_index[i]]
        wanted = np.asarray(offsets) + i
        expected_pad = (wanted < start) | (wanted >= end)
        expected = written.action[np.clip(wanted, start, end - 1)]
        item = dataset[i]
        assert torch.equal(item["action_is_pad"], torch.from_numpy(expected_pad)), i
        assert torch.equal(item[ACTION_KEY], torch.from_numpy(expected)), i
        real = item[ACTION_KEY][~item["action_is_pad"]]
        assert torch.equal(real, torch.from_numpy(written.action[wanted[~expected_pad]]))
    last_of_first = dataset[LENGTHS[0] - 1]
    assert last_of_first["action_is_pad"].tolist() == [False] * 4 + [True] * 8


def test_stats_come_from_stats_json_else_are_computed(tmp_path: Path) -> None:
    written = write_lerobot_dataset(tmp_path, LENGTHS, image=True)
    stats_file = tmp_path / "meta/stats.json"
    stats = json.loads(stats_file.read_text())
    stats[STATE_KEY]["mean"] = [1.0, 2.0, 3.0, 4.0]
    stats[IMAGE_KEY]["std"] = [[[0.25]], [[0.5]], [[0.75]]]
    stats_file.write_text(json.dumps(stats))
    meta = load(tmp_path).meta
    assert meta.stats[STATE_KEY]["mean"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert meta.stats[IMAGE_KEY]["std"].shape == (3, 1, 1)
    assert meta.stats[IMAGE_KEY]["std"].ravel().tolist() == [0.25, 0.5, 0.75]
    assert meta.stats[ACTION_KEY]["max"].dtype == np.float32
    assert np.allclose(meta.stats[ACTION_KEY]["max"], written.action.max(0))
    assert set(meta.stats) == {STATE_KEY, ACTION_KEY, IMAGE_KEY}  # count extras and timestamp ignored
    # The quantiles LeRobot writes are kept, shaped like the other stats (QUANTILES normalisation reads them).
    assert set(meta.stats[ACTION_KEY]) == {"mean", "std", "min", "max", "q01", "q99"}
    assert np.allclose(meta.stats[ACTION_KEY]["q99"], np.quantile(written.action, 0.99, axis=0))
    assert meta.stats[IMAGE_KEY]["q01"].shape == (3, 1, 1)

    stats_file.unlink()
    computed = load(tmp_path).meta.stats
    from_file = dataset_stats(written)
    for key in (STATE_KEY, ACTION_KEY, IMAGE_KEY):
        for name in ("mean", "std", "min", "max"):
            expected = np.asarray(from_file[key][name], dtype=np.float32)
            assert computed[key][name].shape == expected.shape
            assert np.allclose(computed[key][name], expected, atol=1e-6), (key, name)


def test_episode_subset(tmp_path: Path) -> None:
    written = write_lerobot_dataset(tmp_path, LENGTHS, episodes_per_file=1, chunks_size=2)
    assert (tmp_path / "data/chunk-001/file-000.parquet").is_file()  # the third file rolls over to chunk 1
    dataset = load(tmp_path, episodes=[2, 0])
    assert len(dataset) == LENGTHS[0] + LENGTHS[2]
    assert dataset.meta.num_episodes == 2 and dataset.meta.num_frames == 12
    items = [dataset[i] for i in range(len(dataset))]
    assert [item["episode_index"].item() for item in items] == [0] * LENGTHS[0] + [2] * LENGTHS[2]
    keep = np.isin(written.episode_index, [0, 2])
    assert np.array_equal(np.stack([item[STATE_KEY].numpy() for item in items]), written.state[keep])
    end_of_first = dataset[LENGTHS[0] - 1]  # the next frame in memory belongs to episode 2
    assert end_of_first["action_is_pad"][1:].all()
    assert torch.equal(end_of_first[ACTION_KEY][1:], torch.from_numpy(written.action[LENGTHS[0] - 1]).expand(7, 2))
    with pytest.raises(LeRobotDatasetError, match=r"--dataset.episodes: \[5\] not in this dataset.*0\.\.2"):
        load(tmp_path, episodes=[0, 5])


def test_variants_seen_in_the_wild_read_the_same(tmp_path: Path) -> None:
    """Shuffled data rows, float fps, no ``length`` column, task text as pandas' unnamed index."""
    import pyarrow as pa

    written = write_lerobot_dataset(tmp_path, LENGTHS)
    data_file = tmp_path / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data_file)
    pq.write_table(table.take(np.random.default_rng(0).permutation(len(table))), data_file)
    info_file = tmp_path / "meta/info.json"
    info_file.write_text(info_file.read_text().replace('"fps": 10', '"fps": 10.0'))
    meta_file = tmp_path / "meta/episodes/chunk-000/file-000.parquet"
    pq.write_table(pq.read_table(meta_file).drop_columns(["length"]), meta_file)
    tasks_file = tmp_path / "meta/tasks.parquet"
    pq.write_table(pq.read_table(tasks_file).rename_columns(["task_index", "__index_level_0__"]), tasks_file)
    dataset = load(tmp_path)
    items = [dataset[i] for i in range(len(dataset))]
    assert np.array_equal(np.stack([item[STATE_KEY].numpy() for item in items]), written.state)
    assert [item["episode_index"].item() for item in items] == written.episode_index.tolist()
    assert dataset.meta.fps == 10 and dataset.tasks == dict(enumerate(written.tasks))
    pq.write_table(pa.table({"task_index": [0], "text": ["a"]}), tasks_file)
    with pytest.raises(LeRobotDatasetError, match="tasks.parquet: no 'task' column"):
        load(tmp_path)

def test_unsupported_codebase_version_names_the_file_and_what_is_supported(tmp_path: Path) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS)
    info_file = tmp_path / "meta/info.json"
    info = json.loads(info_file.read_text())
    info["codebase_version"] = "v2.1"
    info_file.write_text(json.dumps(info))
    with pytest.raises(LeRobotDatasetError) as error:
        load(tmp_path)
    message = str(error.value)
    assert str(info_file) in message and "'v2.1'" in message and "v3.0" in message
    assert "convert_dataset_v21_to_v30" in message


@pytest.mark.parametrize(
    ("corrupt", "expected"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "features"}),
         "missing key(s) ['features']"),
        (lambda text: text.replace('"fps": 10', '"fps": -3'), "fps must be a positive whole number"),
        (lambda text: json.dumps({**json.loads(text), "features": {"action": {"dtype": "float32"}}}),
         "feature 'action' needs 'dtype' and 'shape'"),
        (lambda text: text.replace("{chunk_index:03d}/file", "{chunk:03d}/file"), "data_path template"),
        (lambda text: "[1, 2]", "expected a JSON object"),
    ],
)
def test_malformed_info_json_is_a_clear_error_naming_the_file(tmp_path: Path, corrupt, expected: str) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS)
    info_file = tmp_path / "meta/info.json"
    info_file.write_text(corrupt(info_file.read_text()))
    with pytest.raises(LeRobotDatasetError) as error:
        load(tmp_path)
    assert str(info_file) in str(error.value) and expected in str(error.value)
    assert isinstance(error.value, LerobotError)


def test_missing_or_broken_parquet_files_are_named(tmp_path: Path) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS, episodes_per_file=2)
    second = tmp_path / "data/chunk-000/file-001.parquet"
    second.unlink()
    with pytest.raises(LeRobotDatasetError) as error:
        load(tmp_path)
    assert f"{second}: missing; it should hold the frames of episode(s) [2]" in str(error.value)
    load(tmp_path, episodes=[0, 1])  # the episodes of the first file do not need it

    first = tmp_path / "data/chunk-000/file-000.parquet"
    first.write_bytes(first.read_bytes()[:100])
    with pytest.raises(LeRobotDatasetError, match=f"{first}: not a readable parquet file"):
        load(tmp_path, episodes=[0])

    meta_file = tmp_path / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(meta_file).drop_columns(["dataset_to_index"])
    pq.write_table(table, meta_file)
    with pytest.raises(LeRobotDatasetError, match=r"file-000.parquet: missing column\(s\) \['dataset_to_index'\]"):
        load(tmp_path)
    for path in (tmp_path / "meta/episodes").glob("*/*.parquet"):
        path.unlink()
    with pytest.raises(LeRobotDatasetError, match="meta/episodes: no episode metadata"):
        load(tmp_path)


def test_data_that_disagrees_with_the_episode_index_is_an_error(tmp_path: Path) -> None:
    import pyarrow as pa

    write_lerobot_dataset(tmp_path, LENGTHS)
    data_file = tmp_path / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data_file)
    pq.write_table(table.slice(0, len(table) - 1), data_file)  # the last frame of episode 2 is gone
    with pytest.raises(LeRobotDatasetError) as error:  # from the parquet footer, before any frame is read
        load(tmp_path)
    assert f"{data_file}: holds 23 frames, but meta/episodes puts 24 frames of episode(s) [0, 1, 2]" in str(error.value)

    # Same row count, but one frame of episode 1 is labelled episode 2: found when the file's float columns are
    # read at start-up to be checked for NaN/inf.
    episodes = table.column("episode_index").to_numpy().copy()
    episodes[LENGTHS[0]] = 2
    pq.write_table(table.set_column(table.schema.get_field_index("episode_index"), "episode_index",
                                    pa.array(episodes)), data_file)
    with pytest.raises(LeRobotDatasetError, match="holds 11 frames of episode 1, but meta/episodes says 12"):
        load(tmp_path)


def test_video_features_are_decoded(tmp_path: Path) -> None:
    import av  # noqa: F401  - the video extra is part of the test extras
    written = write_lerobot_dataset(tmp_path, LENGTHS, image=True, video=True, episodes_per_file=2)
    dataset = load(tmp_path, episodes=[1, 2])  # episode 2 starts at 0 s of the second video file
    assert dataset.meta.features[VIDEO_KEY].dtype == "image" and dataset.meta.features[VIDEO_KEY].shape == (3, 16, 16)
    keep = np.isin(written.episode_index, [1, 2])
    decoded = np.stack([(dataset[i][VIDEO_KEY] * 255).round().to(torch.int16).numpy() for i in range(len(dataset))])
    truth = written.cameras[VIDEO_KEY][keep].astype(np.int16)
    assert decoded.shape == truth.shape
    assert np.abs(decoded - truth).max() <= 8  # near-lossless codec; a wrong frame is off by far more
    neighbours = np.abs(decoded[1:] - truth[:-1]).max(axis=(1, 2, 3))
    assert neighbours.max() > 8  # frames differ from their neighbours, so the match above is frame-exact
    assert dataset[0][VIDEO_KEY].shape == (3, 16, 16)
    assert dataset.meta.stats[VIDEO_KEY]["mean"].shape == (3, 1, 1)


def test_video_that_does_not_match_the_episode_index_is_an_error(tmp_path: Path) -> None:
    import av  # noqa: F401  - the video extra is part of the test extras
    write_lerobot_dataset(tmp_path, LENGTHS, video=True)
    meta_file = tmp_path / "meta/episodes/chunk-000/file-000.parquet"
    rows = pq.read_table(meta_file).to_pylist()
    rows[1][f"videos/{VIDEO_KEY}/from_timestamp"] += 5.0  # past the end of the 2.4 s video
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows), meta_file)
    dataset = load(tmp_path)  # opening reads no frames
    assert dataset[0][VIDEO_KEY].shape == (3, 16, 16)
    with pytest.raises(LeRobotDatasetError) as error:
        dataset[LENGTHS[0]]
    video = tmp_path / f"videos/{VIDEO_KEY}/chunk-000/file-000.mp4"
    assert f"{video}: episode 1 needs the frame at 5.7000s of {VIDEO_KEY!r} but the video has nearest frame at 2.3000s" \
        in str(error.value)


def test_video_without_a_decoder_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A video feature is declared but no mp4 written: the decoder check comes before any file is read.
    write_lerobot_dataset(tmp_path, LENGTHS)
    info_file = tmp_path / "meta/info.json"
    info = json.loads(info_file.read_text())
    info["features"][VIDEO_KEY] = {"dtype": "video", "shape": [16, 16, 3], "names": ["height", "width", "channels"]}
    info["video_path"] = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    info_file.write_text(json.dumps(info))
    with pytest.raises(ConfigError, match="--dataset.video_backend=torchcodec is not supported; supported: pyav"):
        load(tmp_path, video_backend="torchcodec")
    monkeypatch.setitem(sys.modules, "av", None)  # as if PyAV were not installed
    with pytest.raises(LeRobotDatasetError) as error:
        load(tmp_path)
    assert f"['{VIDEO_KEY}'] as video" in str(error.value) and "pip install 'lerobot-kit[video]'" in str(error.value)


def test_missing_pyarrow_or_pillow_names_the_dataset_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS, image=True)
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(LeRobotDatasetError, match=r"need Pillow: pip install 'lerobot-kit\[dataset\]'"):
        load(tmp_path)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(LeRobotDatasetError, match=r"needs pyarrow: pip install 'lerobot-kit\[dataset\]'"):
        load(tmp_path)


def test_found_in_the_lerobot_home_then_the_hub_caches(tmp_path: Path, isolated_caches: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LeRobotDatasetError) as error:
        load(None)
    message = str(error.value)
    for place in (isolated_caches / "lerobot/user/x", isolated_caches / "lerobot/hub/datasets--user--x",
                  isolated_caches / "hub/datasets--user--x"):
        assert str(place) in message
    assert "--dataset.root" in message and "--dataset.allow_download=true" in message

    # The system hub cache ($HF_HOME/hub): refs/main names the snapshot; a commit works as the revision.
    write_lerobot_dataset(hub_snapshot(isolated_caches / "hub", "user/x", commit="c" * 40), [3, 4])
    write_lerobot_dataset(hub_snapshot(isolated_caches / "hub", "user/x", commit="d" * 40, ref="v3.0"), [4, 4])
    assert len(load(None)) == 8  # LeRobot's v3.0 tag before main
    assert len(load(None, revision="main")) == 7
    assert len(load(None, revision="c" * 40)) == 7
    with pytest.raises(LeRobotDatasetError, match="at revision 'v9.9' not found locally"):
        load(None, revision="v9.9")

    # HF_HUB_CACHE moves the system cache; LeRobot's own hub cache is searched before it.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    with pytest.raises(LeRobotDatasetError, match=str(tmp_path / "elsewhere")):
        load(None)
    write_lerobot_dataset(hub_snapshot(isolated_caches / "lerobot/hub", "user/x", ref=None), [2, 3])
    assert len(load(None)) == 5  # no ref: the newest complete snapshot

    # $HF_LEROBOT_HOME/<repo_id> comes first of all.
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lerobot_home"))
    write_lerobot_dataset(tmp_path / "lerobot_home/user/x", [6])
    assert len(load(None)) == 6
    write_lerobot_dataset(tmp_path / "given", [2])
    assert len(load(tmp_path / "given")) == 2  # an explicit root wins


def test_root_without_a_dataset_is_an_error_that_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(LeRobotDatasetError) as error:
        load(tmp_path / "nothing")
    assert f"--dataset.root={tmp_path / 'nothing'}: no LeRobot dataset there" in str(error.value)
    assert "--dataset.allow_download=true" in str(error.value)


@pytest.mark.parametrize("special", ["named pipe", "folder"])
def test_a_dataset_file_that_is_a_named_pipe_or_a_folder_is_named_as_such(tmp_path: Path, special: str) -> None:
    """Opening never blocks on a named pipe, and the message says what is there instead of
    calling the file missing."""
    import os

    write_lerobot_dataset(tmp_path, LENGTHS, video=True)
    kind = {"named pipe": "a named pipe, not a file", "folder": "a folder, not a file"}[special]
    for relative in ("meta/info.json", "data/chunk-000/file-000.parquet", f"videos/{VIDEO_KEY}/chunk-000/file-000.mp4"):
        path = tmp_path / relative
        kept = path.read_bytes()
        path.unlink()
        if special == "named pipe":
            os.mkfifo(path)
        else:
            path.mkdir()
        with pytest.raises(LeRobotDatasetError) as error:
            load(tmp_path)
        message = str(error.value)
        assert message.startswith(f"{path}: {kind}; ") and "re-download" in message and "\n" not in message
        if special == "folder":
            path.rmdir()
        else:
            path.unlink()
        path.write_bytes(kept)
    assert len(load(tmp_path)) == sum(LENGTHS)


def test_opening_reads_metadata_only_and_the_column_cache_is_built_once(tmp_path: Path) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS, image=True, video=True)
    dataset = load(tmp_path)
    cache = tmp_path / ".lerobot_kit_cache"
    assert len(dataset) == sum(LENGTHS) and not cache.exists()  # len, features and stats from meta/ alone
    first = dataset[3]
    entries = [p for p in (cache / f"v{FORMAT}").iterdir() if p.is_dir()]
    assert [p.name.split("-")[:3] for p in entries] == [["data", "chunk", "000"]]
    built = {p: p.stat().st_mtime_ns for p in entries[0].iterdir()}
    again = load(tmp_path)  # another process or rank: maps the same files, builds nothing
    assert all(_same(first[k], again[3][k]) for k in first)
    assert {p: p.stat().st_mtime_ns for p in entries[0].iterdir()} == built
    import pickle

    copy = pickle.loads(pickle.dumps(again))  # what a spawned worker gets: no maps, no open decoders
    assert all(_same(first[k], copy[3][k]) for k in first)


def _same(a: object, b: object) -> bool:
    """Item values: tensors equal in dtype and values; the task text equal."""
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_the_column_cache_moves_to_the_user_cache_when_the_dataset_folder_cannot_hold_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "dataset"
    written = write_lerobot_dataset(root, LENGTHS)
    (root / ".lerobot_kit_cache").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user_cache"))
    assert torch.equal(load(root)[5][STATE_KEY], torch.from_numpy(written.state[5]))
    entries = (tmp_path / "user_cache/lerobot_kit/datasets").glob(f"*/v{FORMAT}/data-chunk-000-file-000-*/manifest.json")
    assert list(entries)
