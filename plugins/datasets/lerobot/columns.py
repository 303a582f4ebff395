"""The columns of one ``data/chunk-*/file-*.parquet``, memory-mapped from a cache built once.

Parquet is compressed, so it cannot be memory-mapped and a random row costs a whole
page to decompress. The first process that needs a data file converts it, once, into
plain arrays in one file beside the dataset (``<root>/.lerobot_kit_cache/``; a per-user
cache when the dataset folder is read-only): every numeric feature, ``timestamp`` and
``task_index``, and every image feature as its encoded bytes plus an ``[rows, 2]``
offset/length table, each array at an aligned offset the manifest records. Every later
process (each rank, each DataLoader worker) maps that file read-only, so a node holds
one copy of it, in the page cache, however many processes read it; process memory stays
flat in dataset size.

One file, one map: opening one file costs a fraction of opening one per column. A map
holds no file descriptor (``mapped``), so mapped data files never count against the
open-file limit, which is left to the video decoders. A process keeps at most
``MAX_OPEN_DATA_FILES`` data files mapped, all its datasets together
(``cached_file_columns``), so a run mixing thousands of datasets keeps a bounded number of
maps; the least recently used is dropped first, and unmapped with the last array that
views it (items hold copies, never views).

Rows are stored grouped by episode in episode-index order, each episode in
``frame_index`` order, so an episode is a contiguous row range. A cache entry is named
after its data file's size and modification time: a changed file gets a new entry.
Builders take a file lock, so concurrent ranks and workers build it once; an entry
appears by an atomic rename, so a reader never sees half of one. An entry is built only
after its file's float columns were found finite when the dataset was opened (``finite``).

An entry is checked whenever it is opened (``cache_entry``). A damaged one is moved
aside and rebuilt under the lock, with a warning; where its folder cannot be written,
the run stops with one line naming the folder to delete. A build that fails (a full
disk) removes its temporary folder and says, in one line, where, how much it needs and
how much is free (``cache_writes``); temporary folders of builders that were killed are
removed by the next build of their entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import math
import os
import shutil
from pathlib import Path
from typing import IO, TYPE_CHECKING, Hashable, Iterator

import numpy as np

from lerobot_kit.api import write_json
from lerobot_kit.plugins.datasets.lerobot.cache_entry import (
    ALIGNMENT,
    ARRAYS,
    FORMAT,
    MANIFEST,
    EntryDamaged,
    EntryMissing,
    FileColumns,
    open_entry,
)
from lerobot_kit.plugins.datasets.lerobot.cache_writes import (
    build_failed_line,
    cannot_lock_line,
    cannot_rebuild_line,
    estimated_bytes,
)
from lerobot_kit.plugins.datasets.lerobot.files import (
    LeRobotDatasetError,
    parquet_columns,
    read_parquet,
    require_pyarrow,
)
from lerobot_kit.plugins.datasets.lerobot.meta import EpisodeRow, LeRobotInfo, SourceFeature
from lerobot_kit.plugins.datasets.lerobot.open_files import MAX_FILE_BUDGET, OpenFiles

if TYPE_CHECKING:
    import pyarrow as pa

CACHE_DIR = ".lerobot_kit_cache"
IMAGE_BATCH_ROWS = 256  # rows of encoded images read at a time while building: bounds build memory
# Per process, all datasets together. A map holds no descriptor, so the bound is not the open-file limit's.
MAX_OPEN_DATA_FILES = MAX_FILE_BUDGET

logger = logging.getLogger("lerobot_kit")

_OPEN: OpenFiles[FileColumns] = OpenFiles(MAX_OPEN_DATA_FILES)  # this process's mapped data files


def cached_file_columns(
    owner: Hashable, info: LeRobotInfo, data_file: tuple[int, int], rows_in_file: list[EpisodeRow]
) -> FileColumns:
    """``open_file_columns``, opened once per process and ``owner`` (a dataset) while among the
    most recently used of this process's data files."""
    return _OPEN.get((owner, data_file), lambda: open_file_columns(info, data_file, rows_in_file))


def episode_rows(rows_in_file: list[EpisodeRow]) -> dict[int, int]:
    """Episode index → its first row in the file's cache entry (episodes in index order)."""
    first, out = 0, {}
    for row in sorted(rows_in_file, key=lambda r: r.index):
        out[row.index] = first
        first += row.length
    return out


def open_file_columns(info: LeRobotInfo, data_file: tuple[int, int], rows_in_file: list[EpisodeRow]) -> FileColumns:
    """Map the cache entry of ``data_file`` (``rows_in_file``: every episode it holds), building
    it if needed and rebuilding it if damaged."""
    source = info.data_file(*data_file)
    entry = _entry_dir(info.root, source)
    rows = sorted(rows_in_file, key=lambda r: r.index)
    frames = sum(r.length for r in rows)
    try:
        return open_entry(entry, info, frames)
    except EntryMissing:
        damage = None
    except EntryDamaged as found:
        damage = found
    with _locked(entry, source, damage):
        try:
            return open_entry(entry, info, frames)  # built or repaired meanwhile by another process
        except EntryMissing:
            pass
        except EntryDamaged as found:
            _set_aside(entry, source, found)
        _remove_leftovers(entry)
        _build(info, source, rows, entry)
        try:
            return open_entry(entry, info, frames)
        except (EntryMissing, EntryDamaged) as exc:  # just written: the disk did not keep it
            raise LeRobotDatasetError(
                f"{entry}: the column cache entry just built from {source} does not read back ({exc}); "
                "the disk may be failing"
            ) from exc


def is_cached(info: LeRobotInfo, data_file: tuple[int, int]) -> bool:
    """Whether ``data_file`` has a sound cache entry, beside the dataset or in the user's cache; creates nothing."""
    source = info.data_file(*data_file)
    if not source.is_file():
        return False
    name = _entry_name(info.root, source)
    beside = info.root / CACHE_DIR / f"v{FORMAT}" / name
    # The user's cache is looked at only then: finding it resolves the dataset folder's path, component by component.
    return _sound(beside, info) or _sound(_user_cache_root(info.root) / f"v{FORMAT}" / name, info)


def _sound(entry: Path, info: LeRobotInfo) -> bool:
    try:
        open_entry(entry, info, None)
    except (EntryMissing, EntryDamaged, LeRobotDatasetError):
        return False
    return True


def _entry_dir(dataset_root: Path, source: Path) -> Path:
    return _cache_root(dataset_root) / f"v{FORMAT}" / _entry_name(dataset_root, source)


def _entry_name(dataset_root: Path, source: Path) -> str:
    try:
        stat = source.stat()
    except FileNotFoundError as exc:
        raise LeRobotDatasetError(f"{source}: missing; the dataset is incomplete (re-copy or re-download it)") from exc
    relative = source.relative_to(dataset_root).with_suffix("")
    return f"{'-'.join(relative.parts)}-{stat.st_size}-{stat.st_mtime_ns}"


def _cache_root(dataset_root: Path) -> Path:
    """Beside the dataset when its folder is writable, else under the user's cache folder."""
    beside = dataset_root / CACHE_DIR
    with contextlib.suppress(OSError):
        beside.mkdir(exist_ok=True)
        if os.access(beside, os.W_OK):
            return beside
    return _user_cache_root(dataset_root)


def _user_cache_root(dataset_root: Path) -> Path:
    user_cache = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser()
    digest = hashlib.sha1(str(dataset_root.resolve()).encode()).hexdigest()[:16]
    return user_cache / "lerobot_kit" / "datasets" / digest


@contextlib.contextmanager
def _locked(entry: Path, source: Path, damage: EntryDamaged | None) -> Iterator[None]:
    """Hold the lock of ``entry``'s builders; a folder where it cannot be taken is one line,
    naming the entry to delete when it is ``damage``d."""
    lock_file = entry.with_name(entry.name + ".lock")
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_file, "a")
    except OSError as exc:
        if damage is not None:
            raise LeRobotDatasetError(cannot_rebuild_line(entry, source, damage, exc)) from exc
        raise LeRobotDatasetError(cannot_lock_line(lock_file.parent, exc)) from exc
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _set_aside(entry: Path, source: Path, damage: EntryDamaged) -> None:
    """Move a damaged entry out of the way of its rebuild (processes mapping it keep their map)."""
    aside = entry.with_name(f"{entry.name}.damaged-{os.getpid()}")
    try:
        os.rename(entry, aside)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LeRobotDatasetError(cannot_rebuild_line(entry, source, damage, exc)) from exc
    logger.warning(f"warning: {entry}: this column cache entry of {source} was damaged ({damage}); rebuilding it")
    _remove(aside)


def _remove_leftovers(entry: Path) -> None:
    """Temporary and set-aside copies of ``entry``: their builders are gone, as its lock is held here."""
    for leftover in entry.parent.glob(f"{entry.name}.tmp-*"):
        _remove(leftover)
    for leftover in entry.parent.glob(f"{entry.name}.damaged-*"):
        _remove(leftover)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


class _ArrayWriter:
    """Appends arrays to an open file, each at an ``ALIGNMENT``-aligned offset, recording
    ``name -> [offset, dtype, shape]`` for the manifest."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.arrays: dict[str, list] = {}

    def add(self, name: str, array: np.ndarray) -> None:
        offset = self.align()
        self.out.write(memoryview(np.ascontiguousarray(array).reshape(-1)).cast("B"))  # a copy only if strided
        self.record(name, offset, array.dtype, array.shape)

    def align(self) -> int:
        """Pad to the next aligned offset, and return it."""
        offset = self.out.tell()
        padding = -offset % ALIGNMENT
        self.out.write(bytes(padding))
        return offset + padding

    def record(self, name: str, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.arrays[name] = [offset, dtype.str, list(shape)]


def _build(info: LeRobotInfo, source: Path, rows: list[EpisodeRow], entry: Path) -> None:
    """Write the entry into a temporary folder, then rename it into place; a failed write
    leaves no temporary folder."""
    what = f"the frames of episode(s) {[r.index for r in rows]}"
    present = parquet_columns(source, what)
    numeric = [f for f in info.features.values() if f.kind == "numeric"]
    images = [f for f in info.features.values() if f.kind == "image"]
    needed = {"timestamp"} if info.keys("video") else set()  # video frames are found by timestamp
    extras = [c for c in ("frame_index", "timestamp", "task_index") if c in present or c in needed]
    table = read_parquet(source, ["episode_index", *extras, *(f.key for f in numeric)], what)
    order = row_order(source, table, rows)
    source_rows = table.num_rows
    tmp = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
    manifest: dict[str, object] = {"format": FORMAT, "source": str(source), "rows": len(order)}
    images_of: dict[str, list[str]] = {}
    try:
        tmp.mkdir(parents=True)
        with open(tmp / ARRAYS, "wb") as out:
            writer = _ArrayWriter(out)
            for n, feature in enumerate(numeric):
                writer.add(f"numeric{n}", numeric_values(source, feature, table.column(feature.key))[order])
            manifest["numeric"] = {feature.key: f"numeric{n}" for n, feature in enumerate(numeric)}
            for name in ("timestamp", "task_index"):
                manifest[name] = None
                if name in extras:
                    writer.add(name, table.column(name).to_numpy()[order])
                    manifest[name] = name
            del table
            for n, feature in enumerate(images):
                offset = writer.align()
                spans = _write_image_bytes(source, feature, out, source_rows)
                writer.record(f"image{n}", offset, np.dtype(np.uint8), (out.tell() - offset,))
                writer.add(f"image{n}.spans", spans[order])
                images_of[feature.key] = [f"image{n}", f"image{n}.spans"]
        manifest["images"] = images_of
        manifest["arrays"] = writer.arrays
        write_json(tmp / MANIFEST, manifest)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            in_user_cache = not entry.is_relative_to(info.root / CACHE_DIR)
            line = build_failed_line(entry, source, exc, estimated_bytes(info, source, len(order)), in_user_cache)
            raise LeRobotDatasetError(line) from exc
        raise
    try:
        os.rename(tmp, entry)
    except OSError:  # another process renamed its copy first (only without working locks)
        shutil.rmtree(tmp, ignore_errors=True)


def row_order(source: Path, table: pa.Table, rows: list[EpisodeRow]) -> np.ndarray:
    """Source row numbers in cache order: episodes in index order, each by ``frame_index``."""
    episode_column = table.column("episode_index").to_numpy()
    frame_index = table.column("frame_index").to_numpy() if "frame_index" in table.column_names else None
    order = []
    for row in rows:
        picked = np.flatnonzero(episode_column == row.index)
        if len(picked) != row.length:
            raise LeRobotDatasetError(
                f"{source}: holds {len(picked)} frames of episode {row.index}, but meta/episodes says {row.length}; "
                "the dataset is inconsistent (re-copy or re-download it)"
            )
        if frame_index is not None:
            picked = picked[np.argsort(frame_index[picked], kind="stable")]
        order.append(picked)
    return np.concatenate(order) if order else np.empty(0, dtype=np.int64)


def numeric_values(path: Path, feature: SourceFeature, column: pa.ChunkedArray) -> np.ndarray:
    """``[N, *shape]`` in the item dtype, from a scalar, list, or nested fixed-size-list column."""
    import pyarrow as pa

    values = column.combine_chunks()
    n = len(values)
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or pa.types.is_fixed_size_list(
        values.type
    ):
        values = values.flatten()
    shape = feature.spec.shape
    if len(values) != n * math.prod(shape):
        raise LeRobotDatasetError(
            f"{path}: column {feature.key!r} holds {len(values)} values for {n} frames; "
            f"meta/info.json declares shape {list(shape)}"
        )
    if values.null_count:
        raise LeRobotDatasetError(f"{path}: column {feature.key!r} has {values.null_count} missing values")
    return values.to_numpy(zero_copy_only=False).astype(feature.spec.dtype).reshape(n, *shape)


def _write_image_bytes(source: Path, feature: SourceFeature, out: IO[bytes], num_rows: int) -> np.ndarray:
    """Append every row's encoded image to ``out``; ``[rows, 2]`` offset (from where it started)
    and length, in source row order. A failed write is the ``OSError`` itself, never taken
    for a bad parquet file."""
    spans = np.zeros((num_rows, 2), dtype=np.int64)
    offset = 0
    for row, data in enumerate(_encoded_images(source, feature)):
        out.write(data)
        spans[row] = (offset, len(data))
        offset += len(data)
    return spans


def _encoded_images(source: Path, feature: SourceFeature) -> Iterator[bytes]:
    """Each row's encoded image of ``feature``, in source row order, a batch at a time."""
    import pyarrow as pa

    pq = require_pyarrow()
    row = 0
    try:
        batches = pq.ParquetFile(source).iter_batches(batch_size=IMAGE_BATCH_ROWS, columns=[feature.key])
        for batch in batches:
            values = batch.column(0)
            if pa.types.is_struct(values.type) and values.type.get_field_index("bytes") >= 0:
                values = values.field("bytes")
            if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
                raise LeRobotDatasetError(
                    f"{source}: image column {feature.key!r} has type {values.type}; "
                    "expected struct<bytes, path> of encoded images"
                )
            for data in values.to_pylist():
                if data is None:
                    raise LeRobotDatasetError(
                        f"{source}: row {row} of {feature.key!r} has no embedded image bytes "
                        "(images referenced by path only are not supported)"
                    )
                yield data
                row += 1
    except LeRobotDatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise LeRobotDatasetError(f"{source}: not a readable parquet file ({exc}); it holds {feature.key!r}") from exc
