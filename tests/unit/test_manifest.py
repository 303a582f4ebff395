"""The checksum manifest on its own: what it records, what it finds changed, and that
it tells a folder without a manifest from a damaged one. Torch-free, like its module."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lerobot_kit.core.layout.manifest import (
    MANIFEST,
    NoManifestError,
    file_digest,
    has_manifest,
    read_manifest,
    verify_manifest,
    write_manifest,
)
from lerobot_kit.core.errors import CheckpointError


@pytest.fixture
def step_dir(tmp_path: Path) -> Path:
    step = tmp_path / "000004"
    (step / "pretrained_model/pytorch_model_fsdp_0").mkdir(parents=True)
    (step / "training_state").mkdir()
    (step / "pretrained_model/model.safetensors").write_bytes(bytes(range(256)) * 4000)
    (step / "pretrained_model/config.json").write_text('{"type": "act"}')
    (step / "pretrained_model/pytorch_model_fsdp_0/.metadata").write_bytes(b"\x80\x04meta")
    (step / "pretrained_model/pytorch_model_fsdp_0/__0_0.distcp").write_bytes(b"shard" * 100)
    (step / "training_state/training_step.json").write_text('{"step": 4}')
    return step


def test_records_every_file_with_size_and_sha256(step_dir: Path) -> None:
    write_manifest(step_dir)
    body = json.loads((step_dir / MANIFEST).read_text())
    assert body["algorithm"] == "sha256"
    files = {p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST}
    assert set(body["files"]) == files
    weights = step_dir / "pretrained_model/model.safetensors"
    entry = body["files"]["pretrained_model/model.safetensors"]
    assert entry == {"bytes": weights.stat().st_size, "sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}
    assert verify_manifest(step_dir) == []
    assert not list(step_dir.glob("*.tmp"))


def test_known_digests_are_used_and_vanished_ones_dropped(step_dir: Path) -> None:
    shard = "pretrained_model/pytorch_model_fsdp_0/__0_0.distcp"
    known = {shard: file_digest(step_dir / shard), "gone.bin": file_digest(step_dir / shard)}
    write_manifest(step_dir, known)
    assert read_manifest(step_dir)[shard] == known[shard] and "gone.bin" not in read_manifest(step_dir)


def test_flipped_byte_size_change_and_missing_file_are_named(step_dir: Path) -> None:
    write_manifest(step_dir)
    weights = step_dir / "pretrained_model/model.safetensors"
    data = bytearray(weights.read_bytes())
    data[5000] ^= 0x01
    weights.write_bytes(bytes(data))
    (step_dir / "training_state/training_step.json").write_text('{"step": 40}')
    (step_dir / "pretrained_model/pytorch_model_fsdp_0/__0_0.distcp").unlink()
    problems = verify_manifest(step_dir)
    assert len(problems) == 3
    assert any(str(weights) in p and "sha256 differs" in p for p in problems)
    assert any("training_step.json: 12 bytes, but checksums.json records 11" in p for p in problems)
    assert any("__0_0.distcp: missing" in p for p in problems)


def test_only_limits_the_check_to_files_and_folders(step_dir: Path) -> None:
    write_manifest(step_dir)
    (step_dir / "training_state/training_step.json").write_text("{}")
    assert verify_manifest(step_dir, only=["pretrained_model"]) == []
    assert verify_manifest(step_dir, only=["pretrained_model/config.json"]) == []
    assert len(verify_manifest(step_dir, only=["training_state/"])) == 1
    (step_dir / "pretrained_model/extra.json").write_text("{}")
    [problem] = verify_manifest(step_dir, only=["pretrained_model/extra.json"])
    assert "extra.json: not recorded in checksums.json" in problem


def test_no_manifest_is_told_apart_from_damage(step_dir: Path) -> None:
    assert not has_manifest(step_dir)
    with pytest.raises(NoManifestError):
        verify_manifest(step_dir)
    (step_dir / MANIFEST).write_text("{not json")
    with pytest.raises(CheckpointError, match="not a readable checksum manifest") as info:
        verify_manifest(step_dir)
    assert not isinstance(info.value, NoManifestError)
    (step_dir / MANIFEST).write_text(json.dumps({"algorithm": "sha256", "files": {"../x": {"bytes": 1, "sha256": "a"}}}))
    with pytest.raises(CheckpointError, match="not a file inside the step folder"):
        read_manifest(step_dir)


def test_module_does_not_import_torch() -> None:
    code = "import sys, lerobot_kit.core.layout.manifest; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
