"""A damaged column cache entry of the LeRobot reader: found when opened, rebuilt, or refused in one line.

Each damage is done to a real entry on disk, the way it happens: a file cut short (a
disk that filled while the dataset folder was copied with its cache, a crash before the
file reached the disk), bytes added or overwritten, a manifest that no longer parses or
that describes other shapes, something other than a file in the entry's place. Opening
the dataset again must serve exactly the rows it served before, from a rebuilt entry,
with one warning; where the cache's folder is read-only (a real read-only tmpfs; tests
run as root, whom permissions do not stop), it is one line naming the entry to delete.
A build that runs out of space (a real full tmpfs) is one line naming the entry, the
bytes it needs and the free space, and leaves no temporary folder.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tmpfs
from lerobot_dataset_factory import ACTION_KEY, IMAGE_KEY, STATE_KEY, write_lerobot_dataset
from lerobot_kit.plugins.datasets.lerobot.cache_entry import ARRAYS, MANIFEST
from lerobot_kit.plugins.datasets.lerobot.columns import FORMAT, is_cached
from lerobot_kit.plugins.datasets.lerobot.files import LeRobotDatasetError
from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig
from lerobot_kit.plugins.datasets.lerobot.reader import make_lerobot_dataset

LENGTHS = [7, 12, 5]
CHUNK = {ACTION_KEY: list(range(4))}


def load(root: Path):
    return make_lerobot_dataset(LeRobotDatasetConfig(repo_id="user/x", root=str(root)), CHUNK)


def items(dataset) -> list[dict[str, torch.Tensor]]:
    return [{k: v for k, v in dataset[i].items() if isinstance(v, torch.Tensor)} for i in range(len(dataset))]


def assert_same_items(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def entries(cache: Path) -> list[Path]:
    return sorted((cache / f"v{FORMAT}").iterdir())


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, list[dict]]:
    """A dataset with a camera, its items as first served, and its one cache entry beside it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user_cache"))
    root = tmp_path / "dataset"
    write_lerobot_dataset(root, LENGTHS, image=True)
    first = items(load(root))
    [entry] = [p for p in entries(root / ".lerobot_kit_cache") if p.is_dir()]
    return root, entry, first


def _manifest(entry: Path) -> dict:
    return json.loads((entry / MANIFEST).read_text())


def _edit_manifest(entry: Path, change: Callable[[dict], None]) -> None:
    manifest = _manifest(entry)
    change(manifest)
    (entry / MANIFEST).write_text(json.dumps(manifest))


def _spans_outside(entry: Path) -> None:
    offset, _, shape = _manifest(entry)["arrays"]["image0.spans"]
    with open(entry / ARRAYS, "r+b") as handle:
        handle.seek(offset + 16 * (shape[0] - 1))
        handle.write(np.array([1 << 40, 10], dtype=np.int64).tobytes())


def _replace(entry: Path, name: str, make: Callable[[Path], None]) -> None:
    (entry / name).unlink()
    make(entry / name)


DAMAGES: dict[str, Callable[[Path], None]] = {
    "arrays cut short": lambda e: os.truncate(e / ARRAYS, (e / ARRAYS).stat().st_size // 2),
    "arrays emptied by a crash": lambda e: os.truncate(e / ARRAYS, 0),
    "bytes added to the arrays": lambda e: (e / ARRAYS).open("ab").write(b"\0" * 100),
    "manifest not JSON": lambda e: (e / MANIFEST).write_text('{"format": 3, "rows'),
    "manifest gone": lambda e: (e / MANIFEST).unlink(),
    "manifest of another shape": lambda e: _edit_manifest(e, lambda m: m["arrays"]["numeric1"][2].__setitem__(1, 3)),
    "manifest of another row count": lambda e: _edit_manifest(e, lambda m: m.__setitem__("rows", 20)),
    "manifest without a feature": lambda e: _edit_manifest(e, lambda m: m["numeric"].pop(ACTION_KEY)),
    "manifest with an array past the end": lambda e: _edit_manifest(
        e, lambda m: m["arrays"]["numeric0"].__setitem__(0, 1 << 20)),
    "an image outside its camera's bytes": _spans_outside,
    "arrays replaced by a folder": lambda e: _replace(e, ARRAYS, Path.mkdir),
    "arrays replaced by a named pipe": lambda e: _replace(e, ARRAYS, os.mkfifo),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_entry_is_found_when_opened_and_rebuilt(built, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    root, entry, first = built
    DAMAGES[damage](entry)
    logger = logging.getLogger("lerobot_kit")  # a training run in this process may have stopped its propagation
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="lerobot_kit"):
            assert not is_cached(load(root).info, (0, 0))  # so its float columns are checked again before the rebuild
            assert_same_items(items(load(root)), first)
    finally:
        logger.removeHandler(caplog.handler)
    [warning] = {r.getMessage() for r in caplog.records}  # once, however many handlers saw it
    assert warning.startswith(f"warning: {entry}: this column cache entry of ") and "was damaged (" in warning
    assert warning.endswith("rebuilding it")
    assert [p.name for p in entries(root / ".lerobot_kit_cache")] == [entry.name, entry.name + ".lock"]
    assert is_cached(load(root).info, (0, 0))


def test_an_entry_replaced_by_a_file_is_rebuilt(built) -> None:
    root, entry, first = built
    for child in entry.iterdir():
        child.unlink()
    entry.rmdir()
    entry.write_bytes(b"not a folder")
    assert_same_items(items(load(root)), first)
    assert (entry / MANIFEST).is_file()


def test_a_damaged_entry_in_the_users_cache_is_rebuilt_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user_cache"))
    root = tmp_path / "dataset"
    write_lerobot_dataset(root, LENGTHS, image=True)
    (root / ".lerobot_kit_cache").write_text("the dataset folder holds no cache")
    first = items(load(root))
    [arrays] = (tmp_path / "user_cache/lerobot_kit/datasets").glob(f"*/v{FORMAT}/*/{ARRAYS}")
    os.truncate(arrays, 100)
    assert_same_items(items(load(root)), first)
    assert arrays.stat().st_size > 100


def test_leftovers_of_killed_builders_are_removed_by_the_next_build(built) -> None:
    root, entry, first = built
    for leftover in (f"{entry.name}.tmp-999999", f"{entry.name}.damaged-999998"):
        (entry.parent / leftover).mkdir()
        (entry.parent / leftover / ARRAYS).write_bytes(b"half")
    DAMAGES["arrays cut short"](entry)
    assert_same_items(items(load(root)), first)
    assert [p.name for p in entries(root / ".lerobot_kit_cache")] == [entry.name, entry.name + ".lock"]


@pytest.fixture
def read_only_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A dataset on a read-only tmpfs, so its cache is the user's, itself on a tmpfs made read-only
    once the entry is built; yields the root, the entry and the first items."""
    with tmpfs(tmp_path / "data", "size=4m") as data, tmpfs(tmp_path / "cache", "size=4m") as cache:
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        root = data / "dataset"
        write_lerobot_dataset(root, LENGTHS, image=True)
        subprocess.run(["mount", "-o", "remount,ro", str(data)], check=True)
        first = items(load(root))
        [entry] = (cache / "lerobot_kit/datasets").glob(f"*/v{FORMAT}/data-chunk-000-file-000-*[0-9]")
        yield root, entry, first, cache


def test_a_sound_entry_in_a_read_only_cache_is_read(read_only_cache) -> None:
    root, _, first, cache = read_only_cache
    subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
    assert_same_items(items(load(root)), first)


def test_a_damaged_entry_that_cannot_be_rebuilt_is_one_line_naming_the_folder_to_delete(read_only_cache) -> None:
    root, entry, _, cache = read_only_cache
    os.truncate(entry / ARRAYS, 100)
    subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
    with pytest.raises(LeRobotDatasetError) as error:
        load(root)[0]
    line = str(error.value)
    assert "\n" not in line
    assert line.startswith(f"{entry}: this column cache entry of {root / 'data/chunk-000/file-000.parquet'} is "
                           "damaged (its arrays.bin holds 100 bytes where its manifest.json places ")
    assert "cannot be rebuilt there (Read-only file system (errno EROFS))" in line
    assert f"delete that folder (rm -r {entry})" in line


def test_a_build_that_fills_the_disk_is_one_line_and_leaves_no_temporary_folder(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        root = disk / "dataset"
        write_lerobot_dataset(root, LENGTHS, image=True)
        filler = disk / "filler"
        with open(filler, "wb", buffering=0) as handle, pytest.raises(OSError):
            while True:
                handle.write(b"\0" * 4096)
        dataset = load(root)
        with pytest.raises(LeRobotDatasetError) as error:
            dataset[0]
        line = str(error.value)
        cache = root / ".lerobot_kit_cache"
        [lock] = entries(cache)  # no entry, no temporary folder: the builders' lock alone
        entry = lock.with_suffix("")
        assert "\n" not in line and lock.suffix == ".lock"
        assert line.startswith(f"{entry}: building the column cache of {root / 'data/chunk-000/file-000.parquet'} "
                               "failed: No space left on device (errno ENOSPC); it needs about ")
        assert f"the disk of {cache} has 0 bytes free; nothing of it was left: free space there" in line
        needed = int(re.search(r"it needs about (?:[\d.]+ [KMGT]iB \()?(\d+) bytes", line).group(1))

        filler.unlink()
        assert dataset[0][STATE_KEY].shape == (4,) and IMAGE_KEY in dataset[0]
        [built] = [p for p in entries(cache) if p.is_dir()]
        size = sum(f.stat().st_size for f in built.iterdir())
        assert size <= needed <= 2 * size + 4096  # "about": never less than it takes
