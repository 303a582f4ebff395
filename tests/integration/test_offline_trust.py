"""``inspect-checkpoint`` and ``convert-dcp`` trust only what was saved: weight shapes
against ``config.json``, file contents against ``checksums.json``.

One real checkpoint is trained once (a tiny ACT, one step), given DCP shards of its weights
as a sharded run writes them, and its manifest; each test damages a copy of it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from conftest import pool_train, run_cli
from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout.manifest import file_digest, read_manifest, write_manifest
from lerobot_kit.core.layout.training_step import rewrite_weights_kind
from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.offline.convert import convert_dcp
from lerobot_kit.core.layout.dcp_metadata import read_dcp_metadata
from lerobot_kit.core.offline.inspect import inspect_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

TINY = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2", "--policy.n_encoder_layers=1",
        "--policy.n_vae_encoder_layers=1", "--policy.chunk_size=5", "--policy.n_action_steps=5"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, rank_pools) -> Path:
    """A one-step run (in a rank pool, ``tests/rank_pool.py``) whose step folder holds both weight kinds."""
    root = tmp_path_factory.mktemp("trust")
    pool_train(rank_pools, 1, f"--output_dir={root / 'run'}", *TINY, "--steps=1", "--save_freq=1", "--batch_size=4",
               workdir=root, timeout=300)
    step_dir = root / "run" / L.CHECKPOINTS_DIR / "000001"
    pretrained = step_dir / L.PRETRAINED_DIR
    dcp.save(load_file(pretrained / L.MODEL_WEIGHTS), checkpoint_id=pretrained / L.DCP_MODEL_DIR, no_dist=True)
    rewrite_weights_kind(pretrained, "gathered+dcp")
    write_manifest(step_dir)
    return step_dir


@pytest.fixture
def step_dir(saved: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "000001", symlinks=True))


def inspect(step_dir: Path, *flags: str) -> tuple[int, str, list[str]]:
    proc = run_cli("inspect-checkpoint", str(step_dir), *flags)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, [line for line in proc.stderr.splitlines() if line.startswith("error: ")]


def convert(step_dir: Path) -> tuple[int, list[str]]:
    """``convert-dcp --overwrite=true``; its stderr lines."""
    proc = run_cli("convert-dcp", f"--checkpoint_dir={step_dir}", "--overwrite=true")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stderr.strip().splitlines()


def refused_and_untouched(step_dir: Path, *fragments: str, cli: bool = False) -> None:
    """convert-dcp refuses with one line holding ``fragments`` and writes nothing; the
    console script when ``cli``, else the function (no torch start-up to pay)."""
    pretrained = step_dir / L.PRETRAINED_DIR
    before = (pretrained / L.MODEL_WEIGHTS).read_bytes()
    shards_before = {p.name: p.read_bytes() for p in (pretrained / L.DCP_MODEL_DIR).iterdir()}
    manifest_before = (step_dir / L.MANIFEST).read_bytes()
    if cli:
        code, lines = convert(step_dir)
        assert code == 1 and len(lines) == 1, lines
        message = lines[0]
    else:
        with pytest.raises(CheckpointError) as raised:
            convert_dcp(step_dir, overwrite=True)
        message = str(raised.value)
        assert "\n" not in message
    assert all(f in message for f in fragments), message
    assert (pretrained / L.MODEL_WEIGHTS).read_bytes() == before
    assert not list(pretrained.glob(f"*{L.TMP_SUFFIX}"))
    assert {p.name: p.read_bytes() for p in (pretrained / L.DCP_MODEL_DIR).iterdir()} == shards_before
    assert (step_dir / L.MANIFEST).read_bytes() == manifest_before


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


# --- what a sound checkpoint says -----------------------------------------------------------


def test_a_trained_checkpoint_is_loadable_with_shapes_and_checksums_checked(step_dir: Path) -> None:
    code, out, errors = inspect(step_dir)
    assert code == 0 and errors == [], errors
    loadable = "loadable with --policy.path: yes (pretrained_model/model.safetensors, its shapes as config.json builds"
    assert loadable in out
    assert "checksums: verified (" in out


def test_an_old_checkpoint_without_checksums_says_so_once(step_dir: Path) -> None:
    (step_dir / L.MANIFEST).unlink()
    code, out, errors = inspect(step_dir)
    assert code == 0 and errors == []
    assert out.count("checksums.json") == 1 and "checksums: absent (no checksums.json" in out
    assert "loadable with --policy.path: yes (" in out  # the shapes are still checked
    edit_json(step_dir / L.PRETRAINED_DIR / L.POLICY_CONFIG, type="not_installed")
    report = inspect_checkpoint(step_dir)
    assert report.ok and report.loadable.ok is None and "'not_installed' is not installed here" in report.loadable.why


# --- weights of another shape ---------------------------------------------------------------


def test_weights_of_other_shapes_than_config_json_are_refused(step_dir: Path) -> None:
    pretrained = step_dir / L.PRETRAINED_DIR
    edit_json(pretrained / L.POLICY_CONFIG, dim_model=48, n_heads=2)
    write_manifest(step_dir)  # saved so: the checksums agree, the shapes do not
    code, out, errors = inspect(step_dir)
    assert code == 1 and "loadable with --policy.path: no (" in out
    for rel in (f"{L.PRETRAINED_DIR}/{L.MODEL_WEIGHTS}", f"{L.PRETRAINED_DIR}/{L.DCP_MODEL_DIR}"):
        assert any(
            line.startswith(f"error: {rel}: tensor 'action_head.weight' has shape [2, 32], but config.json gives ")
            and "[2, 48] (and " in line and "more tensors differ" in line
            for line in errors
        ), errors
    refused_and_untouched(step_dir, "tensor 'action_head.weight' has shape [2, 32]", "not converting", cli=True)


def test_config_json_its_policy_refuses_is_a_problem_for_both_tools(step_dir: Path) -> None:
    pretrained = step_dir / L.PRETRAINED_DIR
    edit_json(pretrained / L.POLICY_CONFIG, n_heads=5)
    write_manifest(step_dir)
    report = inspect_checkpoint(step_dir)
    assert not report.loadable.ok
    assert any(p.startswith("pretrained_model/config.json: not a valid 'act' config: ") for p in report.problems)
    refused_and_untouched(step_dir, "config.json: not a valid 'act' config", "not converting")


def test_dataset_features_the_policy_cannot_use_are_a_problem(step_dir: Path) -> None:
    meta = step_dir / L.PRETRAINED_DIR / L.DATASET_META
    body = json.loads(meta.read_text())
    del body["features"]["action"]
    meta.write_text(json.dumps(body))
    write_manifest(step_dir)
    report = inspect_checkpoint(step_dir)
    assert not report.loadable.ok
    wanted = "pretrained_model/dataset_meta.json: ACT needs an 'action' feature"
    assert any(p.startswith(wanted) for p in report.problems)


# --- flipped bytes --------------------------------------------------------------------------


def test_a_flipped_byte_in_safetensors_data_is_found(step_dir: Path) -> None:
    weights = step_dir / L.PRETRAINED_DIR / L.MODEL_WEIGHTS
    flip_byte(weights, weights.stat().st_size - 100)  # inside the last tensor's data: the header still parses
    code, out, errors = inspect(step_dir)
    assert code == 1 and "loadable with --policy.path: no (" in out
    assert errors == ["error: pretrained_model/model.safetensors: sha256 differs from the one checksums.json "
                      "records (changed since it was saved)"], errors
    code, out, errors = inspect(step_dir, "--no-verify")
    assert code == 0 and "checksums: off (not verified (--no-verify))" in out
    skipped = inspect_checkpoint(step_dir, verify_max_bytes=1000)
    assert skipped.ok and skipped.checksums.state == "skipped"
    assert "pass --verify to check them" in skipped.checksums.why
    assert len(inspect_checkpoint(step_dir, verify=True, verify_max_bytes=1000).problems) == 1


def test_a_flipped_byte_in_a_dcp_shard_is_found_and_not_converted(step_dir: Path) -> None:
    pretrained = step_dir / L.PRETRAINED_DIR
    shards = pretrained / L.DCP_MODEL_DIR
    largest = max(read_dcp_metadata(shards).storage_data.values(), key=lambda info: info.length)
    flip_byte(shards / largest.relative_path, largest.offset + largest.length // 2)  # in the tensor's bytes
    rel = f"{L.PRETRAINED_DIR}/{L.DCP_MODEL_DIR}/{largest.relative_path}"
    code, out, errors = inspect(step_dir)
    assert code == 1 and any(line.startswith(f"error: {rel}: sha256 differs") for line in errors), errors
    assert "loadable with --policy.path: yes (" in out  # model.safetensors, not the shards, is what loads
    refused_and_untouched(step_dir, f"{step_dir / rel}: sha256 differs", "not converting")


def test_a_flipped_byte_late_in_a_shard_is_refused_after_the_write(step_dir: Path) -> None:
    """The shards are hashed beside the conversion, not before it: a byte near the end of a
    shard file, read last, still keeps the written file from being put in place."""
    shards = step_dir / L.PRETRAINED_DIR / L.DCP_MODEL_DIR
    records = read_dcp_metadata(shards).storage_data.values()
    last = max((info for info in records if info.length > 4096), key=lambda info: info.offset)
    flip_byte(shards / last.relative_path, last.offset + last.length // 2)  # in its tensor's bytes: it decodes
    refused_and_untouched(step_dir, f"{shards / last.relative_path}: sha256 differs", "not converting", cli=True)


def test_a_shard_the_conversion_cannot_decode_is_reported_as_differing(step_dir: Path) -> None:
    """When the damage also breaks decoding, the checksum finding (the cause) is the error."""
    shards = step_dir / L.PRETRAINED_DIR / L.DCP_MODEL_DIR
    first = min(read_dcp_metadata(shards).storage_data.values(), key=lambda info: info.offset)
    data = bytearray((shards / first.relative_path).read_bytes())
    data[first.offset : first.offset + 64] = bytes(64)  # the record's zip header
    (shards / first.relative_path).write_bytes(bytes(data))
    refused_and_untouched(step_dir, f"{shards / first.relative_path}: sha256 differs", "not converting")


def test_a_failure_while_hashing_the_shards_is_one_line(step_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lerobot_kit.core.layout import manifest

    hash_file = manifest.file_digest

    def failing(path: Path) -> manifest.FileDigest:
        if path.suffix == ".distcp":
            raise RuntimeError("simulated fault\nwith a second line")
        return hash_file(path)

    monkeypatch.setattr(manifest, "file_digest", failing)
    refused_and_untouched(step_dir, "checking the shards against checksums.json failed (RuntimeError: simulated fault)")


# --- a conversion keeps the manifest true -------------------------------------------------------


def test_a_conversion_records_its_output_in_the_manifest(step_dir: Path) -> None:
    pretrained = step_dir / L.PRETRAINED_DIR
    (pretrained / L.MODEL_WEIGHTS).unlink()
    write_manifest(step_dir)  # as a sharded run saves: shards only
    proc = run_cli("convert-dcp", f"--checkpoint_dir={step_dir}", "--delete_dcp")
    assert proc.returncode == 0, proc.stderr
    recorded = read_manifest(step_dir)
    assert recorded[f"{L.PRETRAINED_DIR}/{L.MODEL_WEIGHTS}"] == file_digest(pretrained / L.MODEL_WEIGHTS)
    assert not any(rel.startswith(f"{L.PRETRAINED_DIR}/{L.DCP_MODEL_DIR}/") for rel in recorded)
    code, out, errors = inspect(step_dir)
    assert code == 0 and errors == [] and "checksums: verified (" in out
