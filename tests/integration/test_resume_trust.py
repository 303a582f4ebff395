"""What a resume or ``--policy.path`` loads is what was saved, and nothing in it runs.

One tiny one-process run is saved once; each case copies its checkpoint, damages or
crafts it as a disk fault, a copy gone wrong or an attacker would, and runs ``lerobot`` on
it: one ``error:`` line naming the file, exit 1, no traceback, the checkpoint folder byte
for byte as it was, and the crafted pickle's command never run. One-process resumes go
through the CLI's entry point in the one-rank pool (``pool_cli``), ``--policy.path`` through
the installed console script, the FSDP resumes through ``torchrun``.
A DCP checkpoint is made from the run's own weights with ``dcp.save`` (what a sharded
save writes, here for one process).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import struct
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file

from checkpoint_state import full_weights
from conftest import TINY_ACT, built_once, launch_env, pool_cli, pool_train, run_cli, torchrun_train
from lerobot_kit.core.layout.manifest import MANIFEST, write_manifest

SMALL_DATA = ["--dataset.num_episodes=2", "--dataset.episode_length=20"]
STEP = "checkpoints/000002"
SHARD = "pretrained_model/pytorch_model_fsdp_0/__0_0.distcp"


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def saved(tmp_path_factory, rank_pools) -> Path:
    """A one-process run of 2 steps, saved (synchronously) at step 2 (in a rank pool, ``tests/rank_pool.py``)."""

    def build(root: Path) -> None:
        pool_train(rank_pools, 1, f"--output_dir={root / 'run'}", *TINY_ACT, *SMALL_DATA, "--batch_size=8",
                   "--steps=2", "--save_freq=2", workdir=root)

    return built_once(tmp_path_factory, "resume_trust_saved", build) / "run"


def copy_run(saved: Path, dest: Path) -> Path:
    shutil.copytree(saved, dest, symlinks=True)
    return dest / STEP


def as_dcp(step: Path, *, keep_gathered: bool = False) -> None:
    """The checkpoint as the ``dcp`` (or ``safetensors_dcp``) format saves it, with its manifest."""
    pretrained = step / "pretrained_model"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(load_file(pretrained / "model.safetensors"), checkpoint_id=str(pretrained / "pytorch_model_fsdp_0"))
    if not keep_gathered:
        (pretrained / "model.safetensors").unlink()
    info_file = step / "training_state/training_step.json"
    info = json.loads(info_file.read_text())
    fmt, weights = ("safetensors_dcp", "gathered+dcp") if keep_gathered else ("dcp", "dcp")
    info_file.write_text(json.dumps({**info, "checkpoint_format": fmt, "weights": weights}))
    write_manifest(step)


def craft_metadata(step: Path, marker: Path) -> None:
    (step / "pretrained_model/pytorch_model_fsdp_0/.metadata").write_bytes(pickle.dumps(_Payload(marker)))


def snapshot(run: Path) -> dict[str, str]:
    return {p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file() and "logs" not in p.parts}


def resume(pools, step: Path, *extra: str):
    return pool_cli(pools, "train", "--resume=true", f"--config_path={step / 'pretrained_model/train_config.json'}",
                    "--steps=3", *extra, workdir=step.parents[2])


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def flip_tensor_byte(step: Path, marker: Path) -> None:
    weights = step / "pretrained_model/model.safetensors"
    header = struct.unpack("<Q", weights.read_bytes()[:8])[0]
    flip_byte(weights, 8 + header + 100)  # inside the first tensor's data


def flip_shard_byte(step: Path, marker: Path) -> None:
    as_dcp(step)
    flip_byte(step / SHARD, (step / SHARD).stat().st_size // 2)


def crafted_metadata(step: Path, marker: Path) -> None:
    as_dcp(step)
    craft_metadata(step, marker)
    write_manifest(step)  # an attacker records the manifest too


def payload_in_a_shard_entry(step: Path, marker: Path) -> None:
    """A weight of the DCP shards replaced by an object whose unpickling calls ``os.system``:
    torch's DCP stores it as a bytes entry (``torch.save`` data) that its reader unpickles."""
    as_dcp(step)
    folder = step / "pretrained_model/pytorch_model_fsdp_0"
    state: dict[str, object] = dict(full_weights(folder.parent, marker.parent))
    state[next(iter(state))] = _Payload(marker)
    shutil.rmtree(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(folder))
    write_manifest(step)  # an attacker records the manifest too


def missing_shard(step: Path, marker: Path) -> None:
    as_dcp(step)
    (step / SHARD).unlink()
    (step / MANIFEST).unlink()  # as an older checkpoint: the shard check, not the manifest, finds it


def truncated_shard(step: Path, marker: Path) -> None:
    as_dcp(step)
    shard = step / SHARD
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    (step / MANIFEST).unlink()


def wrong_shape(step: Path, marker: Path) -> None:
    """A checkpoint of a model of another shape: its weights and their optimizer state agree; the run's model
    does not."""
    weights = step / "pretrained_model/model.safetensors"
    tensors = load_file(weights)
    name = next(k for k, v in tensors.items() if v.ndim == 2)
    shape = (tensors[name].shape[0] + 1, tensors[name].shape[1])
    tensors[name] = torch.zeros(shape)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    optimizer = step / "training_state/optimizer_state.safetensors"
    state = load_file(optimizer)
    state.update({key: torch.zeros(shape) for key, value in state.items()
                  if key.startswith(f"state.{name}.") and value.ndim})
    save_file(state, str(optimizer))
    write_manifest(step)


CASES: dict[str, tuple[Callable[[Path, Path], None], list[str]]] = {
    "flipped byte in model.safetensors": (
        flip_tensor_byte, ["model.safetensors: sha256 differs", "the checkpoint is damaged", "earlier step folder"]),
    "flipped byte in a DCP shard": (
        flip_shard_byte, ["__0_0.distcp: sha256 differs", "the checkpoint is damaged", "earlier step folder"]),
    "crafted .metadata calling os.system": (
        crafted_metadata, ["pytorch_model_fsdp_0: refusing to load posix.system from .metadata"]),
    "shard entry unpickling to os.system": (
        payload_in_a_shard_entry, ["__0_0.distcp: refusing to load entry", "not plain data", "crafted to run code"]),
    "missing shard": (missing_shard, ["__0_0.distcp: missing shard", "the checkpoint is damaged"]),
    "truncated shard": (truncated_shard, ["__0_0.distcp: truncated shard", "the checkpoint is damaged"]),
    "weights of another shape": (
        wrong_shape, ["model.safetensors does not fit", "size mismatch for", "policy settings it was saved with"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_checkpoint_stops_the_resume_with_one_line(tmp_path, saved, case, rank_pools):
    damage, expected = CASES[case]
    step = copy_run(saved, tmp_path / "run")
    marker = tmp_path / "pwned"
    damage(step, marker)
    before = snapshot(tmp_path / "run")
    result = resume(rank_pools, step)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    [line] = errors(result.stderr)
    assert all(part in line for part in expected), line
    assert snapshot(tmp_path / "run") == before  # nothing written, nothing overwritten
    assert not marker.exists()


def test_manifest_covers_every_file_of_a_save(saved):
    step = saved / STEP
    recorded = json.loads((step / MANIFEST).read_text())
    files = {p.relative_to(step).as_posix() for p in step.rglob("*") if p.is_file() and p.name != MANIFEST}
    assert recorded["algorithm"] == "sha256" and set(recorded["files"]) == files
    for rel, entry in recorded["files"].items():
        assert entry == {"bytes": (step / rel).stat().st_size,
                         "sha256": hashlib.sha256((step / rel).read_bytes()).hexdigest()}


def test_a_checkpoint_without_manifest_resumes_after_one_notice(tmp_path, saved, rank_pools):
    step = copy_run(saved, tmp_path / "run")
    (step / MANIFEST).unlink()
    result = resume(rank_pools, step)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line for line in result.stderr.splitlines() if MANIFEST in line] == [
        next(line for line in result.stderr.splitlines() if "no checksums.json (saved before checksums" in line)
    ]
    assert (tmp_path / "run/checkpoints/000003" / MANIFEST).is_file()  # what it saves has one


def test_policy_path_verifies_the_pretrained_model_it_loads(tmp_path, saved):
    step = copy_run(saved, tmp_path / "run")
    as_dcp(step, keep_gathered=True)
    marker = tmp_path / "pwned"
    craft_metadata(step, marker)
    before = snapshot(tmp_path / "run")
    result = run_cli("train", f"--policy.path={step / 'pretrained_model'}", f"--output_dir={tmp_path / 'tuned'}",
                     *SMALL_DATA, "--batch_size=8", "--steps=1", env=launch_env(tmp_path))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    [line] = errors(result.stderr)
    assert re.search(r"pytorch_model_fsdp_0/\.metadata: \d+ bytes, but checksums.json records \d+", line), line
    assert "the checkpoint is damaged" in line
    assert not marker.exists() and snapshot(tmp_path / "run") == before


@pytest.mark.parametrize("case", ["crafted .metadata calling os.system", "weights of another shape"])
def test_fsdp_resume_of_a_bad_checkpoint_fails_on_every_rank(tmp_path, saved, case):
    damage, expected = CASES[case]
    step = copy_run(saved, tmp_path / "run")
    marker = tmp_path / "pwned"
    damage(step, marker)
    before = snapshot(tmp_path / "run")
    result = torchrun_train(2, "--resume=true", f"--config_path={step / 'pretrained_model/train_config.json'}",
                            "--steps=3", "--parallelism.dp_shard=2", "--parallelism.timeout_s=60",
                            workdir=tmp_path, timeout=180, check=False)
    assert result.returncode == 1, result.stderr[-3000:]  # torchrun's code for a failed rank
    lines = set(errors(result.stderr))
    assert len(lines) == 1 and all(part in next(iter(lines)) for part in expected), result.stderr[-3000:]
    assert "lerobot_kit" not in result.stderr.split("Traceback", 1)[-1]  # only torchrun's own summary, if any
    assert not marker.exists() and snapshot(tmp_path / "run") == before
