"""Under umask 022 every file of a real checkpoint is world-readable (0644), whichever library
wrote it: safetensors (which writes a private 0600 temporary file and renames it), DCP's
shard writer and ``.metadata``, the JSON files, ``convert-dcp``'s merged file — so
colleagues on a shared cluster can load each other's weights."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import TINY_ACT, launch_env, run_cli, torchrun_train

RUN = [*TINY_ACT, "--dataset.num_episodes=2", "--dataset.episode_length=20", "--batch_size=2", "--steps=2",
       "--save_freq=2", "--log_freq=1"]


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The launched processes inherit the test's umask."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def modes(step_dir: Path) -> dict[str, int]:
    return {path.relative_to(step_dir).as_posix(): stat.S_IMODE(path.stat().st_mode)
            for path in sorted(step_dir.rglob("*")) if path.is_file()}


def assert_world_readable(step_dir: Path, expected_files: set[str]) -> None:
    found = modes(step_dir)
    assert expected_files <= set(found), sorted(found)
    assert {name: oct(mode) for name, mode in found.items() if mode != 0o644} == {}


def test_a_gathered_checkpoint_is_world_readable(tmp_path, umask_022):
    run = tmp_path / "run"
    result = run_cli("train", *RUN, f"--output_dir={run}", cwd=tmp_path, env=launch_env(tmp_path), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_world_readable(run / "checkpoints" / "000002", {
        "pretrained_model/model.safetensors", "pretrained_model/policy_preprocessor_step_0_normalize.safetensors",
        "training_state/optimizer_state.safetensors", "training_state/rng_state.safetensors",
        "pretrained_model/config.json", "checksums.json",
    })


def test_dcp_shards_and_the_merged_file_are_world_readable(tmp_path, umask_022):
    run = tmp_path / "run"
    torchrun_train(2, *RUN, "--parallelism.dp_shard=2", "--checkpoint_format=dcp", f"--output_dir={run}",
                   workdir=tmp_path, timeout=300)
    step_dir = run / "checkpoints" / "000002"
    assert_world_readable(step_dir, {
        "pretrained_model/pytorch_model_fsdp_0/.metadata", "pretrained_model/pytorch_model_fsdp_0/__0_0.distcp",
        "pretrained_model/pytorch_model_fsdp_0/__1_0.distcp", "training_state/optimizer_0/.metadata",
        "training_state/rng_state.safetensors",
    })
    converted = run_cli("convert-dcp", f"--checkpoint_dir={step_dir}", env=launch_env(tmp_path), timeout=300)
    assert converted.returncode == 0, converted.stdout + converted.stderr
    assert_world_readable(step_dir, {"pretrained_model/model.safetensors", "training_state/training_step.json"})
