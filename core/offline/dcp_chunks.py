"""Read the tensor chunks of a DCP shard folder one at a time, without ``dcp.load``.

``dcp.load`` wants a target tensor for every tensor it reads, and inside one call it keeps
the previous chunk alive while decoding the next, so streaming a checkpoint through it
costs a whole tensor of buffer plus two chunks. A ``FileSystemWriter`` stores each chunk
as its own ``torch.save`` record at a known offset of a shard file, so a chunk can be
decoded alone with ``torch.load(weights_only=True)`` (which runs no code from the file)
from a bounded view of that file: memory is one chunk, released before the next.

Chunk placement uses the metadata read by ``dcp_metadata``'s restricted unpickler; storage
transforms (DCP's experimental compression extensions) are not decoded here.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import torch

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.file_access import open_checkpoint_file
from lerobot_kit.core.layout import dcp_metadata


class _FileSlice(io.RawIOBase):
    """``length`` bytes of an open file from ``start``, as a seekable file of its own."""

    def __init__(self, file: BinaryIO, start: int, length: int) -> None:
        super().__init__()
        self._file, self._start, self._length, self._pos = file, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = min(max(base + offset, 0), self._length)
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")[: self._length - self._pos]
        self._file.seek(self._start + self._pos)
        got = self._file.readinto(view) or 0
        self._pos += got
        return got


def _stored_in_order(entry: dcp_metadata.TensorStorageMetadata) -> list[dcp_metadata.ChunkStorageMetadata]:
    """The chunks that hold data (empty ones have no storage record), by offsets."""
    return sorted((c for c in entry.chunks if math.prod(c.sizes)), key=lambda c: tuple(c.offsets))


def row_blocks(entry: dcp_metadata.TensorStorageMetadata) -> list[dcp_metadata.ChunkStorageMetadata] | None:
    """The non-empty chunks in file order when they tile the tensor as consecutive runs of
    whole rows (FSDP's dim-0 shards, or one chunk for the whole tensor): each chunk's bytes
    are then one stretch of the tensor's bytes. None when they do not (e.g. a column shard)."""
    chunks = _stored_in_order(entry)
    if not entry.size:
        return chunks if len(chunks) == 1 else None
    next_row = 0
    for chunk in chunks:
        if chunk.offsets[0] != next_row or any(chunk.offsets[1:]) or tuple(chunk.sizes[1:]) != tuple(entry.size[1:]):
            return None
        next_row += chunk.sizes[0]
    return chunks if next_row == entry.size[0] else None


class ChunkReader:
    """Decodes chunks from the shard files of one DCP folder, keeping each file open once."""

    def __init__(self, dcp_dir: Path, metadata: dcp_metadata.Metadata) -> None:
        self._dir = dcp_dir
        self._where = {
            (index.fqn, tuple(index.offset)): info
            for index, info in (metadata.storage_data or {}).items()
            if index.offset is not None
        }
        self._files: dict[str, BinaryIO] = {}
        self._stack = ExitStack()

    def __enter__(self) -> ChunkReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def read(self, name: str, chunk: dcp_metadata.ChunkStorageMetadata, dtype: torch.dtype) -> torch.Tensor:
        """One chunk of tensor ``name``, checked to have the shape and dtype the metadata gives."""
        info = self._where[(name, tuple(chunk.offsets))]
        where = f"{self._dir / info.relative_path}: {name!r} at offsets {list(chunk.offsets)}"
        if info.transform_descriptors:
            raise CheckpointError(
                f"{where} is stored with DCP transforms {info.transform_descriptors}, which convert-dcp "
                "does not decode; load the checkpoint with torch.distributed.checkpoint instead"
            )
        try:
            tensor = torch.load(
                _FileSlice(self._file(info.relative_path), info.offset, info.length),
                map_location="cpu",
                weights_only=True,
            )
        except Exception as exc:  # noqa: BLE001 - torch.load fails on damaged bytes with many types
            raise CheckpointError(f"{where}: cannot be read, corrupt shard file? ({_one_line(exc)})") from exc
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != dtype or tuple(tensor.shape) != tuple(chunk.sizes):
            found = f"{tensor.dtype} {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise CheckpointError(
                f"{where}: the shard holds {found} where the metadata says {dtype} {list(chunk.sizes)}, "
                "corrupt shard file?"
            )
        return tensor

    def chunks(
        self, name: str, entry: dcp_metadata.TensorStorageMetadata, dtype: torch.dtype
    ) -> Iterator[tuple[dcp_metadata.ChunkStorageMetadata, torch.Tensor]]:
        """Every non-empty chunk of ``name`` with its data, one decoded at a time."""
        for chunk in _stored_in_order(entry):
            yield chunk, self.read(name, chunk, dtype)

    def _file(self, relative_path: str) -> BinaryIO:
        if relative_path not in self._files:
            shard = self._dir / relative_path
            self._files[relative_path] = self._stack.enter_context(open_checkpoint_file(shard))
        return self._files[relative_path]


def _one_line(exc: BaseException) -> str:
    """The first sentence of an exception's first line: torch's loader errors run on for
    several sentences of advice about ``weights_only``."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else type(exc).__name__
    sentence_end = first.find(". ", 20)
    return first[: sentence_end + 1] if sentence_end > 0 else first[:300]
