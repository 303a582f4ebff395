"""``convert-dcp``: merge the DCP weight shards of a checkpoint into one safetensors file.

Runs offline in one process: no process group, no GPU. The model never sits in memory
at once: tensors are read from the shards a few at a time (at most the size of the
largest tensor per batch) and appended to a safetensors file whose header is computed
up front from the DCP metadata — the ``safetensors`` package only writes a whole dict
at once, which would cost the full model in RAM. Peak memory is therefore about twice
the largest tensor (one batch plus one shard chunk being decoded, or plus one tensor
re-read while verifying).

The output is written under a temporary name, fsynced, re-read and compared bit for bit
with a second read of the shards, and only then renamed into place; shards are deleted
(``delete_dcp``) only after that rename. A crash or a failed check leaves no output file
and the shards untouched.

PEFT checkpoints (``adapter_config.json`` next to the shards) become
``adapter_model.safetensors``. Keys are copied as they are: the PEFT saver writes shard
keys already in PEFT's own naming (adapter name stripped, as
``peft.get_peft_model_state_dict`` returns them), so no renaming happens here.

``.metadata`` is a pickle: it is read by ``dcp_metadata``'s restricted unpickler (no code
from the checkpoint runs), checked against the shard files, then handed to torch's own
``FileSystemReader`` as torch metadata objects, so torch never unpickles it itself.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from lerobot_kit.core.checkpoint import dcp_metadata
from lerobot_kit.core.checkpoint.atomic import fsync_dir
from lerobot_kit.core.checkpoint.safetensors_header import METADATA_KEY, read_safetensors_header, tensors
from lerobot_kit.core.checkpoint.layout import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    DCP_MODEL_DIR,
    MODEL_WEIGHTS,
    PRETRAINED_DIR,
    TMP_SUFFIX,
    find_step_dir,
)
from lerobot_kit.core.errors import CheckpointError

# torch dtype -> safetensors dtype tag. Optional dtypes are looked up by name so an
# older torch without them still imports this module.
_SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    dtype: tag
    for name, tag in [
        ("float64", "F64"),
        ("float32", "F32"),
        ("float16", "F16"),
        ("bfloat16", "BF16"),
        ("int64", "I64"),
        ("int32", "I32"),
        ("int16", "I16"),
        ("int8", "I8"),
        ("uint8", "U8"),
        ("bool", "BOOL"),
        ("uint16", "U16"),
        ("uint32", "U32"),
        ("uint64", "U64"),
        ("float8_e4m3fn", "F8_E4M3"),
        ("float8_e5m2", "F8_E5M2"),
        ("complex64", "C64"),
    ]
    if isinstance(dtype := getattr(torch, name, None), torch.dtype)
}


def _torch_metadata(dcp_dir: Path, safe: dcp_metadata.Metadata) -> Metadata:
    """The safely read stand-in metadata as torch's own classes, for torch's DCP reader,
    after refusing what cannot become a safetensors file."""
    problems = dcp_metadata.check_dcp_shards(dcp_dir, safe)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise CheckpointError(f"partial or damaged shard folder, cannot convert: {problems[0]}{more}")
    entries: dict[str, TensorStorageMetadata] = {}
    for name, entry in safe.state_dict_metadata.items():
        if not isinstance(entry, dcp_metadata.TensorStorageMetadata):
            raise CheckpointError(f"{dcp_dir}: entry {name!r} is not a tensor; safetensors can hold only tensors")
        dtype = getattr(torch, entry.properties.dtype.name, None)
        if dtype not in _SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"{dcp_dir}: tensor {name!r} has dtype {entry.properties.dtype}, which safetensors cannot store"
            )
        entries[name] = TensorStorageMetadata(
            properties=TensorProperties(dtype=dtype),
            size=torch.Size(entry.size),
            chunks=[ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)) for c in entry.chunks],
        )
    assert safe.storage_data is not None  # read_dcp_metadata checked it
    storage = {
        MetadataIndex(index.fqn, None if index.offset is None else torch.Size(index.offset), index.index): _StorageInfo(
            info.relative_path, info.offset, info.length, getattr(info, "transform_descriptors", None)
        )
        for index, info in safe.storage_data.items()
    }
    return Metadata(state_dict_metadata=entries, storage_data=storage)


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class ConvertResult:
    output: Path
    tensors: int
    nbytes: int
    seconds: float
    peft: bool
    deleted_dcp: bool

    def summary(self) -> str:
        rate = self.nbytes / 1e6 / max(self.seconds, 1e-9)
        size = f"{self.nbytes / 1e6:.1f} MB" if self.nbytes >= 100_000 else f"{self.nbytes} bytes"
        return (
            f"converted {self.tensors} tensors, {size} -> {self.output} in {self.seconds:.2f}s "
            f"({rate:.1f} MB/s)" + ("; DCP shards deleted" if self.deleted_dcp else "")
        )


Progress = Callable[[str, int, int], None]
"""``(phase, bytes_done, bytes_total)``; phase is "write" or "verify"."""


def resolve_pretrained_dir(checkpoint_dir: Path) -> Path:
    """A step folder, its ``pretrained_model/``, or a run folder (its ``last`` step)."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.exists():
        raise CheckpointError(f"{checkpoint_dir}: no such checkpoint folder")
    if (checkpoint_dir / DCP_MODEL_DIR).is_dir() or checkpoint_dir.name == PRETRAINED_DIR:
        return checkpoint_dir
    return find_step_dir(checkpoint_dir) / PRETRAINED_DIR


def convert_dcp(
    checkpoint_dir: Path,
    *,
    overwrite: bool = False,
    delete_dcp: bool = False,
    progress: Progress | None = None,
) -> ConvertResult:
    """Merge ``pretrained_model/pytorch_model_fsdp_0/`` into ``model.safetensors``.

    Raises CheckpointError, leaving every existing file as it was, when the shards are
    missing, partial or corrupt, when the output exists and ``overwrite`` is false, or
    when the written file does not read back equal to the shards.
    """
    started = time.monotonic()
    pretrained = resolve_pretrained_dir(checkpoint_dir)
    dcp_dir = pretrained / DCP_MODEL_DIR
    peft = (pretrained / ADAPTER_CONFIG).is_file()
    output = pretrained / (ADAPTER_WEIGHTS if peft else MODEL_WEIGHTS)
    if not dcp_dir.is_dir():
        existing = f"; {output.name} exists and may already hold the weights" if output.exists() else ""
        raise CheckpointError(
            f"{pretrained}: this checkpoint has no DCP weight shards ({DCP_MODEL_DIR}/ is missing){existing}"
        )
    if output.exists() and not overwrite:
        raise CheckpointError(f"{output} already exists; pass --overwrite=true to replace it")

    metadata = _torch_metadata(dcp_dir, dcp_metadata.read_dcp_metadata(dcp_dir))
    entries = _entries(metadata)
    reader = _CachedMetadataReader(dcp_dir, metadata)
    tmp = output.with_name(output.name + TMP_SUFFIX)
    try:
        _write(tmp, entries, reader, progress)
        _verify(tmp, entries, reader, progress)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, output)
    fsync_dir(pretrained)
    if delete_dcp:
        try:
            shutil.rmtree(dcp_dir)
        except OSError as exc:
            raise CheckpointError(
                f"{output} is written and verified, but deleting {dcp_dir} failed ({exc.strerror or exc}); "
                "delete it by hand"
            ) from exc
    return ConvertResult(
        output=output,
        tensors=len(entries),
        nbytes=sum(e.nbytes for e in entries),
        seconds=time.monotonic() - started,
        peft=peft,
        deleted_dcp=delete_dcp,
    )


def _entries(metadata: Metadata) -> list[_Entry]:
    """Tensors in safetensors' own order: widest dtype first, then by name, which keeps
    every tensor aligned to its element size in the file."""
    entries = []
    for name, entry in metadata.state_dict_metadata.items():
        assert isinstance(entry, TensorStorageMetadata)  # _torch_metadata refused the rest
        dtype = entry.properties.dtype
        shape = tuple(entry.size)
        entries.append(_Entry(name, dtype, shape, math.prod(shape) * dtype.itemsize))
    return sorted(entries, key=lambda e: (-e.dtype.itemsize, e.name))


def _header(entries: list[_Entry]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for e in entries:
        header[e.name] = {
            "dtype": _SAFETENSORS_DTYPES[e.dtype],
            "shape": list(e.shape),
            "data_offsets": [offset, offset + e.nbytes],
        }
        offset += e.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _write(tmp: Path, entries: list[_Entry], reader: _CachedMetadataReader, progress: Progress | None) -> None:
    total = sum(e.nbytes for e in entries)
    done = 0
    with tmp.open("wb") as file:
        file.write(_header(entries))
        for batch in _load_batches(entries, reader):
            for e in batch:
                tensor = batch[e]
                file.write(memoryview(_as_bytes(tensor).numpy()))
                done += e.nbytes
            del tensor
            batch.clear()  # before the next batch loads, not after
            if progress:
                progress("write", done, total)
        file.flush()
        os.fsync(file.fileno())


def _verify(tmp: Path, entries: list[_Entry], reader: _CachedMetadataReader, progress: Progress | None) -> None:
    """Re-read both sides and compare bytes (not values: NaN != NaN, and -0.0 == 0.0).

    safetensors maps the file and the pages a comparison touches stay in this process's
    RSS until the file is closed, so it is reopened per batch to keep the peak at one
    batch of shard tensors plus one batch of file pages.
    """
    from safetensors import safe_open

    header = read_safetensors_header(tmp)
    listed = {name: (entry["dtype"], tuple(entry["shape"])) for name, entry in tensors(header).items()}
    expected = {e.name: (_SAFETENSORS_DTYPES[e.dtype], e.shape) for e in entries}
    if listed != expected:
        first = next(n for n in sorted(set(listed) | set(expected)) if listed.get(n) != expected.get(n))
        raise CheckpointError(
            f"{tmp}: the file just written lists {first!r} as {listed.get(first)}, "
            f"the shards hold {expected.get(first)}"
        )
    if header.get(METADATA_KEY) != {"format": "pt"}:
        raise CheckpointError(f"{tmp}: the file just written lacks safetensors' torch format tag")

    total = sum(e.nbytes for e in entries)
    done = 0
    for batch in _load_batches(entries, reader):
        with safe_open(str(tmp), framework="pt") as file:
            for e in batch:
                written = file.get_tensor(e.name)
                same = written.dtype == e.dtype and torch.equal(_as_bytes(written), _as_bytes(batch[e]))
                del written
                if not same:
                    raise CheckpointError(
                        f"{tmp}: {e.name} reads back different from the shards; disk or memory fault?"
                    )
                done += e.nbytes
        batch.clear()
        if progress:
            progress("verify", done, total)


def _load_batches(entries: list[_Entry], reader: _CachedMetadataReader) -> Iterator[dict[_Entry, torch.Tensor]]:
    """Consecutive entries loaded from the shards, at most one largest tensor's bytes at a
    time (one tensor per ``dcp.load`` would make many small tensors slow)."""
    budget = max((e.nbytes for e in entries), default=0)
    batch: list[_Entry] = []
    size = 0
    for e in entries:
        if batch and size + e.nbytes > budget:
            yield _load(batch, reader)
            batch, size = [], 0
        batch.append(e)
        size += e.nbytes
    if batch:
        yield _load(batch, reader)


def _load(batch: list[_Entry], reader: _CachedMetadataReader) -> dict[_Entry, torch.Tensor]:
    state = {e.name: torch.empty(e.shape, dtype=e.dtype) for e in batch}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load(state, storage_reader=reader, planner=DefaultLoadPlanner(flatten_state_dict=False), no_dist=True)
    except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
        root = next(iter(exc.failures.values()))[0] if isinstance(exc, CheckpointException) else exc
        names = ", ".join(e.name for e in batch[:3]) + (", ..." if len(batch) > 3 else "")
        raise CheckpointError(
            f"{reader.path}: cannot read {names} from the shards, corrupt shard file? ({_one_line(root)})"
        ) from exc
    return {e: state[e.name] for e in batch}


class _CachedMetadataReader(FileSystemReader):
    """A FileSystemReader that reuses the metadata already read safely, instead of
    unpickling it unrestricted once per ``dcp.load`` call."""

    def __init__(self, path: Path, metadata: Metadata) -> None:
        super().__init__(path)
        self._metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self._metadata


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _one_line(exc: BaseException) -> str:
    """The first sentence of an exception's first line: torch's reader errors run on for
    several sentences of generic advice."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else type(exc).__name__
    sentence_end = first.find(". ", 20)
    return first[: sentence_end + 1] if sentence_end > 0 else first[:300]
