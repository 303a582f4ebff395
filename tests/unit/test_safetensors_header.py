"""The torch-free safetensors header reader ``inspect-checkpoint`` uses: every malformed
header is one CheckpointError naming the file, and valid files read as the library wrote them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.safetensors_header import read_safetensors_header


def _raw_safetensors(path: Path, header: dict[str, Any], data: bytes, header_len: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes((header_len if header_len is not None else len(raw)).to_bytes(8, "little") + raw + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, None),
        (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
            b"\0" * 12,
            "4 unexpected bytes after the last tensor",
        ),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 6]}}, b"\0" * 6, "hold 6 bytes, but F32 [2] needs 8"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "leaves a gap of 4 bytes"),
        (
            {
                "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]},
            },
            b"\0" * 6,
            "'b' starts at byte 2 and overlaps the previous tensor",
        ),
        ({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}, b"\0", "unknown dtype 'Q9'"),
        (
            {"a": {"dtype": "F16", "shape": [-1], "data_offsets": [0, 2]}},
            b"\0\0",
            "is not a list of non-negative integers",
        ),
        ({"__metadata__": {"format": 1}}, b"", "__metadata__ must be an object of strings"),
        ([1, 2], b"", "header is a JSON list"),
    ],
)
def test_safetensors_header_checks(tmp_path: Path, header: Any, data: bytes, message: str | None) -> None:
    path = _raw_safetensors(tmp_path / "x.safetensors", header, data)
    if message is None:
        assert read_safetensors_header(path, label="x.safetensors") == header
    else:
        with pytest.raises(CheckpointError, match="^x.safetensors: .*" + re.escape(message)):
            read_safetensors_header(path, label="x.safetensors")


def test_safetensors_header_length_and_json(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\1\2\3")
    with pytest.raises(CheckpointError, match="truncated: 3 bytes, too short"):
        read_safetensors_header(path)
    _raw_safetensors(path, {}, b"", header_len=10_000)
    with pytest.raises(CheckpointError, match="truncated: header says 10000 bytes of header, file has 2"):
        read_safetensors_header(path)
    _raw_safetensors(path, {}, b"", header_len=1 << 40)
    with pytest.raises(CheckpointError, match="not a safetensors file: header length field reads"):
        read_safetensors_header(path)
    path.write_bytes((5).to_bytes(8, "little") + b"{nope")
    with pytest.raises(CheckpointError, match="header is not valid JSON"):
        read_safetensors_header(path)


def test_safetensors_reader_agrees_with_the_library(tmp_path: Path) -> None:
    tensors = {
        "w": torch.randn(3, 5),
        "h": torch.zeros(7, dtype=torch.bfloat16),
        "i": torch.arange(4),
        "e": torch.zeros(0, 2),
    }
    save_file(tensors, tmp_path / "t.safetensors", metadata={"format": "pt"})
    header = read_safetensors_header(tmp_path / "t.safetensors")
    assert header["__metadata__"] == {"format": "pt"}
    assert {k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"} == {
        "w": ("F32", [3, 5]), "h": ("BF16", [7]), "i": ("I64", [4]), "e": ("F32", [0, 2])
    }
