"""A full disk under the writers that are not checkpoints, and a damaged dataset cache, through the console scripts.

Each disk is a real tmpfs (tests run as root), filled to the last byte or too small for
what is written:

- the output folder's lock (``lerobot train``): one line naming the lock, the bytes it
  needs and the bytes free, exit 1, and no output folder left;
- ``convert-dcp``'s merged file: refused before writing when it cannot fit, and, when the
  disk fills while it is written, one line naming it, what it needs and what is free; the
  shards untouched and no ``.tmp`` left either way;
- a LeRobot dataset's column cache built beside the dataset: one line naming the entry,
  the bytes it needs and the free space, exit 1, and no ``.tmp-<pid>/`` left.

And a dataset's cache entry damaged on disk (cut short): ``lerobot train`` rebuilds it
with a warning and trains, or, where the cache's folder is read-only, stops at once with
one line naming the entry to delete (exit 1), never an internal error (exit 70).
"""

from __future__ import annotations

import os
import re
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

from conftest import TINY_ACT, launch_env, run_cli, tmpfs
from lerobot_dataset_factory import write_lerobot_dataset
from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.paths import DCP_MODEL_DIR, MODEL_WEIGHTS, PRETRAINED_DIR

DATASET = ["--dataset.repo_id=user/ds", *TINY_ACT, "--steps=1", "--batch_size=2", "--num_workers=1"]
BYTES = r"(?:\d+ bytes|[\d.]+ [KMGT]iB \(\d+ bytes\))"


def fill(disk: Path) -> None:
    """Write a file on ``disk`` until no byte is left."""
    with open(disk / "filler", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.strerror == "No space left on device"


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.fast  # refused before the run starts: the inner loop runs it
def test_a_full_disk_under_the_output_lock_is_one_line(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "size=64k") as disk:
        fill(disk)
        run = disk / "new" / "run"
        result = run_cli("train", "--steps=1", f"--output_dir={run}", env=launch_env(tmp_path))
        assert result.returncode == 1, result.stderr[-3000:]
        lock = run / ".lerobot-kit.lock"
        [line] = result.stderr.strip().splitlines()
        assert re.fullmatch(
            rf"error: --output_dir={run}: the run's lock could not be written: {lock}: No space left on device "
            rf"\(errno ENOSPC\) writing it; it needs \d+ bytes, and its disk has 0 bytes free; free space there, or "
            r"pass another --output_dir\. Nothing was written", line), line
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # the folders it made are gone


def _shards(pretrained: Path, floats: int) -> None:
    """DCP weight shards of two float32 tensors of ``floats`` values each, saved without a process group."""
    import torch.distributed.checkpoint as dcp

    state = {"a": torch.randn(floats), "b": torch.randn(floats)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(pretrained / DCP_MODEL_DIR)), no_dist=True)


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.fast  # no training run
def test_convert_dcp_that_cannot_fit_is_refused_before_writing(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "size=640k") as disk:
        pretrained = disk / "000004" / PRETRAINED_DIR
        _shards(pretrained, 64 * 1024)  # 512 KiB of shards; the merged file needs as much again
        before = _files(pretrained)
        result = run_cli("convert-dcp", f"--checkpoint_dir={pretrained}", env=launch_env(tmp_path))
        assert result.returncode == 1, result.stderr[-3000:]
        [line] = result.stderr.strip().splitlines()
        assert re.fullmatch(
            rf"error: {pretrained / MODEL_WEIGHTS}: not enough room on its disk to write it; it needs {BYTES}, and "
            rf"its disk has {BYTES} free; nothing was changed \(the DCP shards are intact, and no partial file is "
            r"left\): free space there, then run convert-dcp again", line), line
        assert _files(pretrained) == before


@pytest.mark.fast  # no training run
def test_convert_dcp_whose_disk_fills_while_it_writes_is_one_line(tmp_path: Path) -> None:
    from lerobot_kit.core.offline.convert import convert_dcp

    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        pretrained = disk / "000004" / PRETRAINED_DIR
        _shards(pretrained, 32 * 1024)  # 256 KiB of shards, and as much to write: room enough when it starts
        before = _files(pretrained)

        def another_writer_fills_the_disk(phase: str, done: int, total: int) -> None:
            if phase == "write" and done < total:
                fill(disk)

        with pytest.raises(CheckpointError) as error:
            convert_dcp(pretrained, progress=another_writer_fills_the_disk)
        line = str(error.value)
        assert re.fullmatch(
            rf"{pretrained / MODEL_WEIGHTS}: No space left on device \(errno ENOSPC\) writing it; it needs {BYTES}, "
            rf"and its disk has {BYTES} free; nothing was changed .*", line), line
        (disk / "filler").unlink()
        assert _files(pretrained) == before  # no model.safetensors.tmp


def test_a_dataset_cache_that_does_not_fit_is_one_line(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        root = disk / "ds"
        write_lerobot_dataset(root, [10, 10], image=True)
        fill(disk)
        result = run_cli("train", f"--dataset.root={root}", *DATASET, f"--output_dir={tmp_path / 'run'}",
                         env=launch_env(tmp_path), timeout=300)
        assert result.returncode == 1, result.stderr[-3000:]
        cache = root / ".lerobot_kit_cache"
        [lock] = (cache / "v3").iterdir()  # the builders' lock: no entry, no .tmp-<pid>/
        [line] = error_lines(result.stderr)
        assert re.fullmatch(
            rf"error: {lock.with_suffix('')}: building the column cache of {root / 'data/chunk-000/file-000.parquet'} "
            rf"failed: No space left on device \(errno ENOSPC\); it needs about {BYTES}, and the disk of {cache} has 0 "
            r"bytes free; nothing of it was left: free space there .*", line), line
        assert "Traceback" not in result.stderr


def _build_cache(root: Path) -> Path:
    """Build ``root``'s cache in this process as a run would; its one entry's ``arrays.bin``."""
    from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig
    from lerobot_kit.plugins.datasets.lerobot.reader import make_lerobot_dataset

    make_lerobot_dataset(LeRobotDatasetConfig(repo_id="user/ds", root=str(root)), {})[0]
    [arrays] = [*Path(os.environ["XDG_CACHE_HOME"]).glob("lerobot_kit/datasets/*/v3/*/arrays.bin"),
                *(root / ".lerobot_kit_cache").glob("v3/*/arrays.bin")]
    return arrays


def test_a_damaged_dataset_cache_is_rebuilt_and_the_run_trains(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user_cache"))
    root = tmp_path / "ds"
    write_lerobot_dataset(root, [10, 10], image=True)
    arrays = _build_cache(root)
    size = arrays.stat().st_size
    os.truncate(arrays, size // 2)
    result = run_cli("train", f"--dataset.root={root}", *DATASET, f"--output_dir={tmp_path / 'run'}",
                     env=launch_env(tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "user_cache")}), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"warning: {arrays.parent}: this column cache entry of {root / 'data/chunk-000/file-000.parquet'} was "
            f"damaged (its arrays.bin holds {size // 2} bytes where its manifest.json places {size}); rebuilding it"
            in result.stderr), result.stderr[-3000:]
    assert arrays.stat().st_size == size
    assert (tmp_path / "run/checkpoints/last/pretrained_model/model.safetensors").is_file()


def test_a_damaged_dataset_cache_that_cannot_be_rebuilt_is_one_line(tmp_path: Path, monkeypatch) -> None:
    with tmpfs(tmp_path / "data", "size=4m") as data, tmpfs(tmp_path / "cache", "size=4m") as cache:
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        root = data / "ds"
        write_lerobot_dataset(root, [10, 10], image=True)
        subprocess.run(["mount", "-o", "remount,ro", str(data)], check=True)  # so the cache is the user's
        arrays = _build_cache(root)
        os.truncate(arrays, 100)
        subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
        result = run_cli("train", f"--dataset.root={root}", *DATASET, f"--output_dir={tmp_path / 'run'}",
                         env=launch_env(tmp_path, {"XDG_CACHE_HOME": str(cache)}), timeout=300)
        assert result.returncode == 1, result.stderr[-3000:]
        [line] = error_lines(result.stderr)
        entry = arrays.parent
        assert line.startswith(f"error: {entry}: this column cache entry of {root / 'data/chunk-000/file-000.parquet'} "
                               "is damaged (its arrays.bin holds 100 bytes where its manifest.json places "), line
        assert line.endswith(f"cannot be rebuilt there (Read-only file system (errno EROFS)): delete that folder "
                             f"(rm -r {entry}) or make {entry.parent} writable, then run again; the entry is rebuilt "
                             "from the dataset's files"), line
        assert "Traceback" not in result.stderr
