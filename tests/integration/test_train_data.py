"""Training on a LeRobot video dataset through the console script: workers, augmentations,
camera history, exact resume, and a run that meets bad data."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from safetensors.torch import load_file

from conftest import launch_env, pool_train, read_metrics, run_cli
from lerobot_dataset_factory import VIDEO_KEY, write_lerobot_dataset

TINY_DIFFUSION = ["--policy.type=diffusion", "--policy.dim_model=32", "--policy.n_heads=4",
                  "--policy.dim_feedforward=64", "--policy.n_layers=1", "--policy.horizon=4",
                  "--policy.n_action_steps=2", "--policy.n_obs_steps=2", "--policy.image_keypoints=4",
                  "--policy.num_train_timesteps=10", "--policy.num_inference_steps=2"]
LENGTHS = [12, 10, 14]  # 36 frames: 9 steps per epoch at batch 4


def train(output_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = run_cli("train", f"--output_dir={output_dir}", *args, timeout=300, env=launch_env(output_dir.parent))
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_camera_history_with_workers_and_augmentations_resumes_exactly(tmp_path: Path, rank_pools) -> None:
    """In a rank pool (``tests/rank_pool.py``): three runs, one process started."""
    root = tmp_path / "data"
    write_lerobot_dataset(root, LENGTHS, image=True, video=True)
    common = ["--dataset.repo_id=user/x", f"--dataset.root={root}", *TINY_DIFFUSION, "--num_workers=2",
              "--dataset.image_transforms.enable=true", "--batch_size=4", "--log_freq=1", "--seed=3"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    result = pool_train(rank_pools, 1, f"--output_dir={straight}", *common, "--steps=12", "--save_freq=12",
                        workdir=tmp_path)
    assert "data_s " in result.stderr
    # Stops mid-epoch; the resume crosses into epoch 1.
    pool_train(rank_pools, 1, f"--output_dir={split}", *common, "--steps=5", "--save_freq=5", workdir=tmp_path)
    config = split / "checkpoints/last/pretrained_model/train_config.json"
    pool_train(rank_pools, 1, "--resume=true", f"--config_path={config}", "--steps=12", "--save_freq=12",
               workdir=tmp_path)
    assert [m["loss"] for m in read_metrics(straight)] == [m["loss"] for m in read_metrics(split)]
    assert all(m["data_s"] >= 0 for m in read_metrics(split))
    for name in ("pretrained_model/model.safetensors", "training_state/optimizer_state.safetensors"):
        a, b = load_file(straight / "checkpoints/000012" / name), load_file(split / "checkpoints/000012" / name)
        assert a.keys() == b.keys()
        assert all(a[key].equal(b[key]) for key in a), name


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_corrupt_video_stops_the_run_with_one_line_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_lerobot_dataset(root, LENGTHS, video=True, episodes_per_file=1)
    out = tmp_path / "run"
    common = ["--dataset.repo_id=user/x", f"--dataset.root={root}", *TINY_DIFFUSION, "--num_workers=2",
              "--batch_size=4", "--log_freq=1"]
    train(out, *common, "--steps=3", "--save_freq=3")
    before = _tree(out / "checkpoints")
    video = root / f"videos/{VIDEO_KEY}/chunk-000/file-001.mp4"  # episode 1
    video.write_bytes(b"\x00" * 64 + video.read_bytes()[64:200])
    config = out / "checkpoints/last/pretrained_model/train_config.json"
    result = train(out, "--resume=true", f"--config_path={config}", "--steps=9", "--save_freq=3", check=False)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(f"error: {video}: cannot decode video '{VIDEO_KEY}' at ")
    assert "(episode 1)" in errors[0]
    assert _tree(out / "checkpoints") == before
    assert (out / "checkpoints/last").resolve().name == "000003"
