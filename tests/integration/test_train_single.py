"""One-process training through the installed console script, as a user runs it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import launch_env, pool_train, run_cli

TINY = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_encoder_layers=2",
        "--policy.n_vae_encoder_layers=1", "--policy.chunk_size=5", "--policy.n_action_steps=5",
        "--policy.dropout=0.1"]
SMALL_DATA = ["--dataset.num_episodes=2", "--dataset.episode_length=20"]  # 40 samples: 5 steps per epoch at batch 8


def metrics(output_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (output_dir / "logs" / "metrics.jsonl").read_text().splitlines()]


def train(output_dir: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # One thread: on 2 shared cores, two threads per process make each step many times slower.
    result = run_cli("train", f"--output_dir={output_dir}", *args, timeout=timeout, env=launch_env(output_dir.parent))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_default_task_learns_and_writes_the_documented_layout(tmp_path):
    out = tmp_path / "run"
    result = train(out, "--steps=300", "--log_freq=25", "--save_freq=150", "--batch_size=8")
    logged = metrics(out)
    first, last = logged[0]["loss"], logged[-1]["loss"]
    print(f"first logged loss {first:.4f}, last logged loss {last:.4f}")
    assert last <= 0.5 * first
    assert "first logged loss" in result.stderr + result.stdout
    assert "effective batch 8 = batch_size 8 × dp_world_size 1 × gradient_accumulation 1" in result.stderr
    assert "checkpoints every 150 steps and at the end | weights safetensors (not sharded) | synchronous" in result.stderr
    # The README's command runs on a CPU: model TFLOP/s in every row, MFU left out, said why once.
    assert all(row["model_tflops"] > 0 and "mfu" not in row for row in logged)
    assert result.stderr.count("| MFU: no peak known for CPU; give --accelerator.peak_tflops") == 1
    root = out / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["000150", "000300", "last"]
    assert (root / "last").is_symlink() and (root / "last").resolve().name == "000300"
    step = root / "000300"
    pretrained = {p.name for p in (step / "pretrained_model").iterdir()}
    assert {"config.json", "train_config.json", "model.safetensors", "policy_preprocessor.json",
            "policy_postprocessor.json"} <= pretrained
    assert any(n.startswith("policy_preprocessor_step_") and n.endswith(".safetensors") for n in pretrained)
    assert "pytorch_model_fsdp_0" not in pretrained
    state = {p.name for p in (step / "training_state").iterdir()}
    assert state == {"optimizer_param_groups.json", "optimizer_state.safetensors", "rng_state.safetensors",
                     "scheduler_state.json", "training_step.json"}
    info = json.loads((step / "training_state" / "training_step.json").read_text())
    assert info["step"] == 300 and info["dp_world_size"] == 1 and info["topology"]["layout"] == "single"
    inspected = run_cli("inspect-checkpoint", str(step))
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    weights = step / "pretrained_model" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    broken = run_cli("inspect-checkpoint", str(step))
    assert broken.returncode == 1 and "model.safetensors" in broken.stdout + broken.stderr


def test_resume_is_exact_across_an_epoch_boundary(tmp_path, rank_pools):
    """In a rank pool (``tests/rank_pool.py``): three runs, one process started."""
    common = [*TINY, *SMALL_DATA, "--log_freq=1", "--batch_size=8", "--seed=3"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    pool_train(rank_pools, 1, f"--output_dir={straight}", *common, "--steps=12", "--save_freq=12", workdir=tmp_path)
    # Stops mid epoch 2 (5 steps per epoch).
    pool_train(rank_pools, 1, f"--output_dir={split}", *common, "--steps=6", "--save_freq=6", workdir=tmp_path)
    config = split / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
    pool_train(rank_pools, 1, "--resume=true", f"--config_path={config}", "--steps=12", "--save_freq=12",
               workdir=tmp_path)
    assert [m["loss"] for m in metrics(straight)] == [m["loss"] for m in metrics(split)]
    for name in ("pretrained_model/model.safetensors", "training_state/optimizer_state.safetensors"):
        a = load_file(straight / "checkpoints" / "000012" / name)
        b = load_file(split / "checkpoints" / "000012" / name)
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].equal(b[key]), f"{name}:{key} differs after resume"
    info = json.loads((split / "checkpoints/000012/training_state/training_step.json").read_text())
    assert info["sampler"]["epoch"] == 2  # 12 steps of 5 per epoch: the resume crossed epoch boundaries


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy.dim_modl=3"], "did you mean --policy.dim_model?"),
        (["--steps=many"], "--steps: Input should be a valid integer"),
        (["--policy.type=nope"], "unknown policy 'nope'"),
        (["--config_path=/does/not/exist.json"], ": missing; "),
        (["--accelerator.gradient_accumulation.steps=2", "--save_freq=3"],
         "--save_freq=3 must be a multiple of --accelerator.gradient_accumulation.steps=2"),
    ],
)
def test_bad_flags_fail_with_one_clear_line(tmp_path, args, message):
    result = run_cli("train", f"--output_dir={tmp_path / 'out'}", *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_existing_output_dir_is_refused_and_left_untouched(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    result = run_cli("train", f"--output_dir={out}", *TINY, "--steps=2")
    assert result.returncode == 2
    assert "already exists" in result.stderr and "--resume=true" in result.stderr
    assert "Traceback" not in result.stderr
    assert [p.name for p in out.iterdir()] == ["precious.txt"]


def test_resume_without_a_checkpoint_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli("train", f"--output_dir={out}", "--resume=true", *TINY, "--steps=2")
    assert result.returncode == 1, result.stderr
    assert "no checkpoint to resume" in result.stderr and "Traceback" not in result.stderr
    assert list(out.iterdir()) == []  # the lock taken before the folder was read is gone again


def test_corrupt_checkpoint_on_resume_is_one_clear_line(tmp_path):
    out = tmp_path / "out"
    train(out, *TINY, *SMALL_DATA, "--steps=2", "--save_freq=2")
    optimizer = out / "checkpoints" / "last" / "training_state" / "optimizer_state.safetensors"
    optimizer.write_bytes(optimizer.read_bytes()[:50])
    config = out / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
    result = run_cli("train", "--resume=true", f"--config_path={config}", "--steps=4")
    assert result.returncode == 1, result.stderr
    assert "optimizer_state.safetensors" in result.stderr and "Traceback" not in result.stderr
