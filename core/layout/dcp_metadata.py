"""Read a torch DCP ``.metadata`` file without torch, and without running anything in it.

``.metadata`` is a pickle, and unpickling an untrusted pickle runs whatever it names.
Checkpoints are downloaded and shared, so the reader here admits only the classes a
``FileSystemWriter`` really puts in that file (found by disassembling real ones with
``pickletools``) and maps each to a small stand-in defined below. Anything else is
refused before it is called, and torch is never imported, which also keeps
``inspect-checkpoint`` fast.
"""

from __future__ import annotations

import math
import pickle
import stat
from collections import OrderedDict
from pathlib import Path, PurePath, PurePosixPath, PureWindowsPath
from typing import Any, NamedTuple

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.file_access import (
    CheckpointAccessError,
    access_line,
    not_a_file_line,
    open_checkpoint_file,
)
from lerobot_kit.core.layout.paths import DCP_METADATA, link_target, resolves_inside


class UnsafeMetadataError(CheckpointError):
    """The ``.metadata`` pickle names something other than a checkpoint-metadata class."""


class DType(NamedTuple):
    """Stands for a ``torch.dtype``; pickles reference dtypes as ``torch.<name>``.

    One instance per name is shared by every read, so it is a tuple: no ``__dict__`` and
    no ``__setstate__`` for a pickle's BUILD opcode to change it through.
    """

    name: str
    itemsize: int

    def __str__(self) -> str:
        return self.name


# torch dtype name -> bytes per element, as ``torch.<name>.itemsize`` reports it.
TORCH_DTYPE_ITEMSIZE: dict[str, int] = {
    **dict.fromkeys(["float64", "int64", "uint64", "complex64"], 8),
    **dict.fromkeys(["float32", "int32", "uint32", "qint32", "complex32"], 4),
    **dict.fromkeys(["float16", "bfloat16", "int16", "uint16", "bits16"], 2),
    "complex128": 16,
    **dict.fromkeys(
        ["bool", "int8", "uint8", "qint8", "quint8", "quint4x2", "quint2x4", "bits8", "bits1x8", "bits2x4",
         "bits4x2", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
         "float4_e2m1fn_x2", *(f"int{i}" for i in range(1, 8)), *(f"uint{i}" for i in range(1, 8))],
        1,
    ),
}


class Size(tuple):
    """Stands for ``torch.Size`` (a tuple of non-negative ints)."""

    __slots__ = ()

    def __new__(cls, dims: Any = ()) -> Size:
        dims = tuple(dims)
        if not all(type(d) is int and d >= 0 for d in dims):
            raise pickle.UnpicklingError(f"torch.Size{dims!r} is not a tuple of non-negative integers")
        return super().__new__(cls, dims)


_MEMORY_FORMATS = {0: "contiguous_format", 1: "channels_last", 2: "preserve_format"}


def _memory_format(code: Any) -> str:
    """Stands for the ``_MEM_FORMAT_ENCODING`` enum, which ``TensorProperties`` pickles by value."""
    if type(code) is not int or code not in _MEMORY_FORMATS:
        raise pickle.UnpicklingError(f"unknown memory format code {code!r}")
    return _MEMORY_FORMATS[code]


_LAYOUTS = frozenset(
    f"torch.{name}"
    for name in ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn", "jagged")
)


def _get_layout(name: Any) -> str:
    """Stands for ``torch.serialization._get_layout``: keeps the layout's name."""
    if name not in _LAYOUTS:
        raise pickle.UnpicklingError(f"unknown tensor layout {name!r}")
    return name


class _Record:
    """A stand-in whose fields arrive as pickle's BUILD state (a dict of str keys).

    Defining ``__setstate__`` keeps pickle from its generic path, which could ``setattr``
    arbitrary (slot) attributes; private and dunder names are refused, so a pickle cannot
    shadow a method such as ``__setstate__`` itself.
    """

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and state[1] is None:
            state = state[0]
        if not isinstance(state, dict) or not all(isinstance(k, str) and not k.startswith("_") for k in state):
            raise pickle.UnpicklingError(f"bad state for {type(self).__name__}")
        self.__dict__.update(state)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"{type(self).__name__}({fields})"


class TensorProperties(_Record):
    dtype: DType
    layout: str = "torch.strided"
    requires_grad: bool = False
    memory_format: str = "contiguous_format"
    pin_memory: bool = False

    def __setstate__(self, state: Any) -> None:
        # torch pickles these as a 5-tuple (its own __getstate__).
        if isinstance(state, tuple) and len(state) == 5:
            self.dtype, self.layout, self.requires_grad, self.memory_format, self.pin_memory = state
        else:
            super().__setstate__(state)
        if not isinstance(getattr(self, "dtype", None), DType):
            raise pickle.UnpicklingError("TensorProperties without a torch dtype")


class ChunkStorageMetadata(_Record):
    """One saved piece of a tensor: where it starts in the global tensor and its size."""

    offsets: Size
    sizes: Size


class TensorStorageMetadata(_Record):
    properties: TensorProperties
    size: Size
    chunks: list[ChunkStorageMetadata]


class BytesStorageMetadata(_Record):
    """A non-tensor value (an int, a dict...) saved with ``torch.save`` as bytes."""


class MetadataIndex(_Record):
    """Key of ``storage_data``: a tensor name and the chunk's offsets (None for bytes)."""

    fqn: str
    offset: Size | None = None
    index: int | None = None

    def __hash__(self) -> int:
        return hash((self.fqn, self.offset))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MetadataIndex) and (self.fqn, self.offset) == (other.fqn, other.offset)


class StorageInfo(_Record):
    """Where a chunk lies: ``relative_path`` inside the DCP folder, ``offset``, ``length``."""

    relative_path: str
    offset: int
    length: int
    transform_descriptors: list[str] | None = None


class StorageMeta(_Record):
    checkpoint_id: Any = None
    save_id: str | None = None
    load_id: str | None = None
    modules: list[str] = []


class Metadata(_Record):
    """Stands for ``torch.distributed.checkpoint.metadata.Metadata``."""

    state_dict_metadata: dict[str, TensorStorageMetadata | BytesStorageMetadata]
    planner_data: Any = None
    storage_data: dict[MetadataIndex, StorageInfo] | None = None
    storage_meta: StorageMeta | None = None
    version: str | None = None


_META = "torch.distributed.checkpoint.metadata"
_ALLOWED: dict[tuple[str, str], Any] = {
    (_META, "Metadata"): Metadata,
    (_META, "TensorStorageMetadata"): TensorStorageMetadata,
    (_META, "BytesStorageMetadata"): BytesStorageMetadata,
    (_META, "ChunkStorageMetadata"): ChunkStorageMetadata,
    (_META, "TensorProperties"): TensorProperties,
    (_META, "MetadataIndex"): MetadataIndex,
    (_META, "StorageMeta"): StorageMeta,
    (_META, "_MEM_FORMAT_ENCODING"): _memory_format,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): StorageInfo,
    ("torch", "Size"): Size,
    ("torch.serialization", "_get_layout"): _get_layout,
    ("collections", "OrderedDict"): OrderedDict,
    # StorageMeta.checkpoint_id is the Path given to dcp.save; pure paths touch no disk.
    **{
        (module, name): PureWindowsPath if "Windows" in name else PurePosixPath
        for module in ("pathlib", "pathlib._local")
        for name in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")
    },
    **{("torch", name): DType(name, size) for name, size in TORCH_DTYPE_ITEMSIZE.items()},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError as exc:
            raise UnsafeMetadataError(
                f"refusing to load {module}.{name} from {DCP_METADATA}: not a checkpoint-metadata class"
            ) from exc


def read_dcp_metadata(dcp_dir: Path, label: str | None = None) -> Metadata:
    """The ``.metadata`` of a DCP folder, as stand-ins; raises ``CheckpointError`` naming ``label``."""
    dcp_dir = Path(dcp_dir)
    name = label or str(dcp_dir)
    meta_path = dcp_dir / DCP_METADATA
    if meta_path.is_symlink() and not resolves_inside(meta_path, dcp_dir):
        raise CheckpointError(
            f"{name}/{DCP_METADATA}: links outside the shard folder; nothing outside a checkpoint is read through it"
        )
    try:
        with open_checkpoint_file(meta_path, f"{name}/{DCP_METADATA}") as f:
            metadata = _MetadataUnpickler(f).load()
    except UnsafeMetadataError as err:
        raise UnsafeMetadataError(f"{name}: {err}") from err
    except CheckpointError as err:
        if isinstance(err.__cause__, FileNotFoundError):
            raise CheckpointError(f"{name}: {DCP_METADATA} is missing, so the shards cannot be read") from err
        raise
    except OSError as err:
        raise CheckpointAccessError(access_line(f"{name}/{DCP_METADATA}", err)) from err
    except Exception as err:  # a damaged pickle fails in many ways; all mean the same to the user
        raise CheckpointError(f"{name}/{DCP_METADATA}: not a readable DCP metadata file ({err!r})") from err
    _check_structure(name, metadata)
    return metadata


def _check_structure(name: str, metadata: Any) -> None:
    """The stand-ins admit any field values; check the ones readers rely on."""
    where = f"{name}/{DCP_METADATA}"
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{where}: holds a {type(metadata).__name__}, not DCP Metadata")
    entries = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(entries, dict):
        raise CheckpointError(f"{where}: has no state_dict_metadata")
    for fqn, entry in entries.items():
        if isinstance(entry, BytesStorageMetadata):
            continue
        if not (
            isinstance(entry, TensorStorageMetadata)
            and isinstance(getattr(entry, "properties", None), TensorProperties)
            and isinstance(getattr(entry.properties, "dtype", None), DType)
            and isinstance(getattr(entry, "size", None), Size)
            and isinstance(getattr(entry, "chunks", None), list)
            and all(
                isinstance(c, ChunkStorageMetadata)
                and isinstance(getattr(c, "offsets", None), Size)
                and isinstance(getattr(c, "sizes", None), Size)
                for c in entry.chunks
            )
        ):
            raise CheckpointError(f"{where}: entry {fqn!r} is not a well-formed tensor or bytes entry")
    storage = metadata.storage_data
    if not isinstance(storage, dict) or not all(
        isinstance(k, MetadataIndex)
        and isinstance(v, StorageInfo)
        and isinstance(getattr(v, "relative_path", None), str)
        and all(type(getattr(v, f, None)) is int and getattr(v, f) >= 0 for f in ("offset", "length"))
        for k, v in storage.items()
    ):
        raise CheckpointError(f"{where}: storage_data is not a file-system DCP index (file, offset, length)")


def check_dcp_shards(dcp_dir: Path, metadata: Metadata, label: str | None = None) -> list[str]:
    """Problems that stop the shards from being read in full, one line per file or tensor.

    Checks every tensor is covered by its chunks, every chunk and bytes entry has a
    storage record, and every record's shard file exists inside the folder (links
    followed: nothing outside a checkpoint is read through it) and is long enough.
    """
    dcp_dir = Path(dcp_dir)
    name = label or str(dcp_dir)
    storage = metadata.storage_data or {}
    return [*_unstored_entries(metadata, storage, name), *_shard_file_problems(dcp_dir, storage, name)]


def _unstored_entries(metadata: Metadata, storage: dict[MetadataIndex, StorageInfo], name: str) -> list[str]:
    """Tensors whose chunks do not cover them, and entries or chunks without a storage record."""
    problems: list[str] = []
    stored = {(k.fqn, k.offset) for k in storage}
    for fqn, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata):
            if (fqn, None) not in stored:
                problems.append(f"{name}/{DCP_METADATA}: {fqn!r} has no storage record")
            continue
        covered = sum(math.prod(c.sizes) for c in entry.chunks)
        if covered != math.prod(entry.size):
            problems.append(
                f"{name}/{DCP_METADATA}: tensor {fqn!r} of shape {list(entry.size)} has chunks covering "
                f"{covered} of its {math.prod(entry.size)} elements"
            )
        unstored = [c for c in entry.chunks if (fqn, c.offsets) not in stored and math.prod(c.sizes)]
        if unstored:
            problems.append(
                f"{name}/{DCP_METADATA}: tensor {fqn!r}: chunk at offsets {list(unstored[0].offsets)} "
                "has no storage record"
            )
    return problems


def _shard_file_problems(dcp_dir: Path, storage: dict[MetadataIndex, StorageInfo], name: str) -> list[str]:
    """Shard files the records name that are outside the folder, missing, not files, or too short."""
    problems: list[str] = []
    needed: dict[str, tuple[int, str, int]] = {}  # file -> (bytes needed, by which tensor, records)
    for index, info in storage.items():
        end = info.offset + info.length
        prev_end, prev_fqn, count = needed.get(info.relative_path, (0, "", 0))
        needed[info.relative_path] = (end, index.fqn, count + 1) if end > prev_end else (prev_end, prev_fqn, count + 1)
    for rel, (end, fqn, count) in sorted(needed.items()):
        rel_path = PurePath(rel)
        if rel_path.is_absolute() or ".." in rel_path.parts or not rel_path.parts:
            problems.append(f"{name}/{DCP_METADATA}: refers to {rel!r}, which is not a file inside the folder")
            continue
        shard = dcp_dir / rel_path
        if not resolves_inside(shard, dcp_dir):
            problems.append(
                f"{name}/{rel}: links outside the shard folder (to {link_target(shard)}); nothing outside a checkpoint "
                "is read through it: copy the shard in instead of linking it"
            )
            continue
        try:
            status = shard.stat()
        except OSError:
            status = None
        size = status.st_size if status is not None and stat.S_ISREG(status.st_mode) else None
        if status is not None and size is None:
            problems.append(not_a_file_line(f"{name}/{rel}", status.st_mode))
        elif size is None:
            problems.append(f"{name}/{rel}: missing shard ({DCP_METADATA} stores {count} entries in it)")
        elif size < end:
            problems.append(
                f"{name}/{rel}: truncated shard: {DCP_METADATA} needs {end} bytes ({fqn!r} ends there), "
                f"file has {size}"
            )
    return problems


def tensor_entries(metadata: Metadata) -> dict[str, TensorStorageMetadata]:
    """The tensor entries (name -> global shape, dtype, chunks), without the bytes entries."""
    return {k: v for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
