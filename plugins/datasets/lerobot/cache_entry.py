"""One entry of the column cache, opened only when it holds what its manifest says.

An entry is a folder of two files: ``manifest.json`` places each array (numeric features,
``timestamp``, ``task_index``, each camera's encoded bytes and their ``[rows, 2]``
offset/length table) at an aligned offset of ``arrays.bin``, which every process maps.
An entry can be damaged after it was built: a dataset folder copied with its cache onto
a disk that filled, a crash before the file's pages reached the disk (a renamed entry
whose file is empty), a repaired file system, a hand edit. Mapped as it is, a short file
makes numpy fail deep in a DataLoader worker, and a manifest of other shapes serves other
rows. So an entry is checked when opened, against what the format says it holds: a
manifest of this format whose arrays lie inside ``arrays.bin`` and fill it exactly; the
dataset's numeric features and cameras, in their dtypes and shapes, one row per frame
the data file holds; every image's byte span inside its camera's bytes. The check reads
the manifest and the span tables, never the data itself: a byte changed inside an array
is not found (a checksum would read every entry in full at every open).
"""

from __future__ import annotations

import errno
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lerobot_kit.api import UnusableJson, decode_json_bytes
from lerobot_kit.plugins.datasets.lerobot.files import LeRobotDatasetError
from lerobot_kit.plugins.datasets.lerobot.mapped import map_read_only
from lerobot_kit.plugins.datasets.lerobot.meta import LeRobotInfo

# Bump when the layout of an entry, or what building one guarantees, changes (2: checked finite;
# 3: all arrays in one file).
FORMAT = 3
MANIFEST = "manifest.json"
ARRAYS = "arrays.bin"
ALIGNMENT = 64  # of each array's offset in ``ARRAYS``
MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists a few arrays per feature: far less than this


@dataclass
class FileColumns:
    """One data file's rows, grouped by episode: arrays are read-only views of one memory map."""

    numeric: dict[str, np.ndarray]
    timestamp: np.ndarray | None
    task_index: np.ndarray | None
    image_bytes: dict[str, np.ndarray]  # uint8 blob per image feature
    image_spans: dict[str, np.ndarray]  # [rows, 2] offset, length into the blob

    def encoded_image(self, key: str, row: int) -> bytes:
        offset, length = self.image_spans[key][row]
        return self.image_bytes[key][offset : offset + length].tobytes()


class EntryMissing(Exception):
    """No entry there: not built yet (or being replaced by a rebuild)."""


class EntryDamaged(Exception):
    """The entry is not what its manifest says (``str``: what is wrong); it must be rebuilt."""


def open_entry(entry: Path, info: LeRobotInfo, rows: int | None) -> FileColumns:
    """Map ``entry`` after checking it against ``info`` and, when given, the data file's ``rows``.

    Raises ``EntryMissing``, ``EntryDamaged``, or ``LeRobotDatasetError`` when the system
    will not let this user read a file of it (its permissions, a disk error: not damage)."""
    if not os.path.lexists(entry):
        raise EntryMissing(str(entry))
    manifest = _manifest(entry)
    fd = _open_file(entry / ARRAYS)
    try:
        size = os.fstat(fd).st_size
        # mmap refuses an empty file; an entry whose arrays are all empty has nothing to map.
        # The map holds no descriptor (``mapped``): a process's maps never count against its open-file limit.
        data = map_read_only(fd, size) if size else b""
    finally:
        os.close(fd)
    arrays = _arrays(manifest, size)
    _check_contents(manifest, arrays, info, rows)

    def view(name: str) -> np.ndarray:
        offset, dtype, shape = arrays[name]
        return np.frombuffer(data, dtype, math.prod(shape), offset).reshape(shape)

    columns = FileColumns(
        numeric={key: view(name) for key, name in manifest["numeric"].items()},
        timestamp=None if manifest["timestamp"] is None else view(manifest["timestamp"]),
        task_index=None if manifest["task_index"] is None else view(manifest["task_index"]),
        image_bytes={key: view(blob) for key, (blob, _) in manifest["images"].items()},
        image_spans={key: view(spans) for key, (_, spans) in manifest["images"].items()},
    )
    _check_spans(columns)
    return columns


def _open_file(path: Path) -> int:
    """A read-only descriptor of ``path`` when it is a regular file (never blocking on a named pipe)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise EntryDamaged(f"it has no {path.name}") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            raise EntryDamaged("it is not a folder") from exc
        raise _unreadable(path, exc) from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise EntryDamaged(f"its {path.name} is {'a folder' if stat.S_ISDIR(mode) else 'not a regular file'}")
    return fd


def _unreadable(path: Path, exc: OSError) -> LeRobotDatasetError:
    """A file of the cache the system will not read: its permissions or the disk, not damage."""
    return LeRobotDatasetError(
        f"{path}: the dataset's column cache cannot be read: {exc.strerror} (errno "
        f"{errno.errorcode.get(exc.errno or 0, exc.errno)}); fix its permissions (or the disk), or delete "
        f"{path.parent} to have it rebuilt"
    )


def _manifest(entry: Path) -> dict:
    path = entry / MANIFEST
    with os.fdopen(_open_file(path), "rb") as handle:
        try:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
        except OSError as exc:
            raise _unreadable(path, exc) from exc
    if len(raw) > MAX_MANIFEST_BYTES:
        raise EntryDamaged(f"its {MANIFEST} is over {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = decode_json_bytes(raw)
    except UnusableJson as exc:
        raise EntryDamaged(f"its {MANIFEST} is {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise EntryDamaged(f"its {MANIFEST} is not one of format {FORMAT} (format: {found!r})")
    return manifest


Array = tuple[int, np.dtype, tuple[int, ...]]  # offset, dtype, shape


def _arrays(manifest: dict, size: int) -> dict[str, Array]:
    """The manifest's arrays, each inside ``arrays.bin``, which they fill exactly (``size`` bytes)."""
    listed = manifest.get("arrays")
    if not isinstance(listed, dict):
        raise EntryDamaged(f"its {MANIFEST} lists no arrays")
    arrays, end = {}, 0
    for name, spec in listed.items():
        try:
            offset, dtype_name, shape = spec
            dtype = np.dtype(dtype_name)
            shape = tuple(shape)
        except (TypeError, ValueError) as exc:
            raise EntryDamaged(f"its {MANIFEST} describes array {name!r} as {spec!r}") from exc
        if (not isinstance(offset, int) or offset < 0 or offset % ALIGNMENT or dtype.hasobject
                or not all(isinstance(n, int) and n >= 0 for n in shape)):
            raise EntryDamaged(f"its {MANIFEST} describes array {name!r} as {spec!r}")
        arrays[name] = (offset, dtype, shape)
        end = max(end, offset + dtype.itemsize * math.prod(shape))
    if size != end:
        raise EntryDamaged(f"its {ARRAYS} holds {size} bytes where its {MANIFEST} places {end}")
    return arrays


def _check_contents(manifest: dict, arrays: dict[str, Array], info: LeRobotInfo, rows: int | None) -> None:
    """The arrays are the dataset's features, in their dtypes and shapes, one row per frame."""
    held = manifest.get("rows")
    if not isinstance(held, int) or held < 0:
        raise EntryDamaged(f"its {MANIFEST} gives no row count")
    if rows is not None and held != rows:
        raise EntryDamaged(f"it holds {held} rows where the data file holds {rows} frames")

    def check(name: object, what: str, dtype: np.dtype | None, shape: tuple[int | None, ...]) -> None:
        """``name`` is an array of ``dtype`` (any when None) and ``shape`` (None: any length there)."""
        if not isinstance(name, str) or name not in arrays:
            raise EntryDamaged(f"its {MANIFEST} names no array for {what}")
        _, found_dtype, found_shape = arrays[name]
        fits = len(found_shape) == len(shape) and all(w is None or w == n for w, n in zip(shape, found_shape))
        if (dtype is not None and found_dtype != dtype) or not fits:
            wanted = [n if n is not None else "any" for n in shape]
            raise EntryDamaged(f"{what} is {found_dtype} {list(found_shape)} where the dataset's is "
                               f"{found_dtype if dtype is None else dtype} {wanted}")

    if "timestamp" not in manifest or "task_index" not in manifest:
        raise EntryDamaged(f"its {MANIFEST} lacks the timestamp or task_index entry")
    if info.keys("video") and manifest["timestamp"] is None:
        raise EntryDamaged("it has no timestamps, which the dataset's videos are read by")
    for name, kinds in (("timestamp", "f"), ("task_index", "iu")):  # seconds; indices into the task list
        if manifest[name] is not None:
            check(manifest[name], name, None, (held,))
            if arrays[manifest[name]][1].kind not in kinds:
                raise EntryDamaged(f"its {name} array is {arrays[manifest[name]][1]}")
    numeric = {key: f for key, f in info.features.items() if f.kind == "numeric"}
    cameras = info.keys("image")
    listed_numeric, listed_images = manifest.get("numeric"), manifest.get("images")
    if not isinstance(listed_numeric, dict) or set(listed_numeric) != set(numeric):
        raise EntryDamaged(f"its numeric features are not the dataset's {sorted(numeric)}")
    if not isinstance(listed_images, dict) or set(listed_images) != set(cameras):
        raise EntryDamaged(f"its cameras are not the dataset's {sorted(cameras)}")
    for key, feature in numeric.items():
        check(listed_numeric[key], repr(key), np.dtype(feature.spec.dtype), (held, *feature.spec.shape))
    for key in cameras:
        pair = listed_images[key]
        if not isinstance(pair, list) or len(pair) != 2:
            raise EntryDamaged(f"its {MANIFEST} describes camera {key!r} as {pair!r}")
        check(pair[0], f"the bytes of {key!r}", np.dtype(np.uint8), (None,))
        check(pair[1], f"the spans of {key!r}", np.dtype(np.int64), (held, 2))


def _check_spans(columns: FileColumns) -> None:
    """Every image's bytes lie inside its camera's blob."""
    for key, spans in columns.image_spans.items():
        size = len(columns.image_bytes[key])
        offsets, lengths = spans[:, 0], spans[:, 1]
        if len(spans) and not ((offsets >= 0) & (lengths >= 0) & (offsets <= size) & (lengths <= size - offsets)).all():
            raise EntryDamaged(f"an image of {key!r} lies outside the {size} bytes held for that camera")
