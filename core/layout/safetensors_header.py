"""Read and validate a safetensors header in pure Python.

``inspect-checkpoint`` must not import torch, and the ``safetensors`` package only
says "invalid header" without saying which file or how far it is truncated. Reading the
format by hand (8-byte little-endian header length, a JSON header, then the tensor
bytes) lets every check name the file and give the numbers a user needs to judge it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.file_access import CheckpointAccessError, access_line, open_checkpoint_file
from lerobot_kit.core.layout.json_file import UnusableJson, decode_json_bytes

# The reference implementation's own cap: a longer header is a corrupt length field.
MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"

# Bits per element; sub-byte types (F4, F6) pack several elements per byte.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


def read_safetensors_header(path: Path, label: str | None = None) -> dict[str, Any]:
    """The validated JSON header: tensor name -> {dtype, shape, data_offsets}, plus ``__metadata__``.

    Raises ``CheckpointError`` naming ``label`` (default: the path) when the file is not a
    complete, self-consistent safetensors file. Only the header is read, never the data.
    """
    path = Path(path)
    name = label or str(path)
    with open_checkpoint_file(path, name) as f:
        try:
            file_size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{name}: truncated: {file_size} bytes, too short for a safetensors header")
            header_len = int.from_bytes(prefix, "little")
            if header_len == 0 or header_len > MAX_HEADER_BYTES:
                raise CheckpointError(f"{name}: not a safetensors file: header length field reads {header_len}")
            if 8 + header_len > file_size:
                raise CheckpointError(
                    f"{name}: truncated: header says {header_len} bytes of header, file has {file_size - 8}"
                )
            raw = f.read(header_len)
        except OSError as err:
            raise CheckpointAccessError(access_line(name, err)) from err
    try:
        header = decode_json_bytes(raw)
    except UnusableJson as err:
        raise CheckpointError(f"{name}: header is {err}") from err
    if not isinstance(header, dict):
        raise CheckpointError(f"{name}: header is a JSON {type(header).__name__}, not an object")
    _check_metadata(name, header.get(METADATA_KEY))
    data_end = _check_offsets(name, {k: v for k, v in header.items() if k != METADATA_KEY})
    data_len = file_size - 8 - header_len
    if data_len < data_end:
        raise CheckpointError(f"{name}: truncated: header says {data_end} bytes of data, file has {data_len}")
    if data_len > data_end:
        raise CheckpointError(
            f"{name}: {data_len - data_end} unexpected bytes after the last tensor "
            f"(header says {data_end} bytes of data, file has {data_len})"
        )
    return header


def tensor_nbytes(dtype: str, shape: list[int]) -> int:
    """Bytes a tensor of ``dtype`` and ``shape`` occupies in the file."""
    return math.prod(shape) * DTYPE_BITS[dtype] // 8


def tensors(header: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The tensor entries of a header read by ``read_safetensors_header``, without ``__metadata__``."""
    return {k: v for k, v in header.items() if k != METADATA_KEY}


def _check_metadata(name: str, metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{name}: {METADATA_KEY} must be an object of strings")


def _check_offsets(name: str, entries: dict[str, Any]) -> int:
    """Check every entry and that the data regions tile [0, end) exactly; return end."""
    spans: list[tuple[int, int, str]] = []
    for tensor, entry in entries.items():
        where = f"{name}: tensor {tensor!r}"
        if not isinstance(entry, dict):
            raise CheckpointError(f"{where}: entry is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPE_BITS:
            raise CheckpointError(f"{where}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise CheckpointError(f"{where}: shape {shape!r} is not a list of non-negative integers")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_count(o) for o in offsets)
            or offsets[0] > offsets[1]
        ):
            raise CheckpointError(f"{where}: data_offsets {offsets!r} is not [begin, end] with begin <= end")
        bits = math.prod(shape) * DTYPE_BITS[dtype]
        if bits % 8:
            raise CheckpointError(f"{where}: {dtype} {shape} does not fill a whole number of bytes")
        if offsets[1] - offsets[0] != bits // 8:
            raise CheckpointError(
                f"{where}: data_offsets {offsets} hold {offsets[1] - offsets[0]} bytes, "
                f"but {dtype} {shape} needs {bits // 8}"
            )
        spans.append((offsets[0], offsets[1], tensor))
    end = 0
    for begin, stop, tensor in sorted(spans):
        if begin != end:
            kind = "overlaps the previous tensor" if begin < end else f"leaves a gap of {begin - end} bytes"
            raise CheckpointError(f"{name}: tensor {tensor!r} starts at byte {begin} and {kind} (ends at {end})")
        end = stop
    return end


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0
