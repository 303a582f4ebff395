"""Shared pieces of the bridge's tests: a LeRobot v3.0 video dataset written by LeRobot
itself, and runs of the installed ``lerobot`` console script (alone or under torchrun).

Everything runs offline: the dataset is generated, backbones start from random weights
(``--policy.pretrained_backbone_weights=null``), and the hub is switched off.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
# The main suite's helpers, after this suite's own modules (its conftest must win).
sys.path.append(str(Path(__file__).resolve().parents[3] / "tests"))
from toy_dataset import ACTION_DIM, make_dataset  # noqa: E402 - tools/ is not a package
from vla_assets import PI_SIZES, REDUCED_PI, REDUCED_SMOLVLA, write_smolvlm, write_tokenizer  # noqa: E402
from pytest_temp_dir import temp_files_in_pytest_folder  # noqa: E402, F401 - a session fixture, used by its name

BIN = Path(sys.executable).parent
REPO_ID = "bridge/reach"
DATA = ["--dataset.repo_id=" + REPO_ID, "--num_workers=0"]
# ACT at a size two CPU processes train in seconds; no dropout so that it learns fast.
TINY_ACT = [
    "--policy.type=lerobot_act", "--policy.pretrained_backbone_weights=null", "--policy.dim_model=32",
    "--policy.n_heads=2", "--policy.dim_feedforward=64", "--policy.n_encoder_layers=2",
    "--policy.n_decoder_layers=1", "--policy.n_vae_encoder_layers=1", "--policy.latent_dim=8",
    "--policy.chunk_size=5", "--policy.n_action_steps=5", "--policy.dropout=0.0",
]
TINY_DIFFUSION = [
    "--policy.type=lerobot_diffusion", "--policy.pretrained_backbone_weights=null", "--policy.horizon=8",
    "--policy.n_action_steps=4", "--policy.down_dims=[16,32]", "--policy.kernel_size=3", "--policy.n_groups=4",
    "--policy.diffusion_step_embed_dim=16", "--policy.spatial_softmax_num_keypoints=8",
    "--policy.use_group_norm=true", "--policy.crop_shape=[40,56]", "--policy.num_inference_steps=4",
    "--policy.drop_n_last_frames=0",
]


def tiny_pi(assets: Path, lerobot_type: str = "pi05") -> list[str]:
    return [f"--policy.type=lerobot_{lerobot_type}", f"--policy.tokenizer_name={assets / 'tokenizer'}", *REDUCED_PI,
            f"--policy.sizes={PI_SIZES}"]


def tiny_smolvla(assets: Path) -> list[str]:
    return ["--policy.type=lerobot_smolvla", f"--policy.vlm_model_name={assets / 'smolvlm'}", *REDUCED_SMOLVLA]


def env(tmp: Path) -> dict[str, str]:
    """Offline, one thread per process (two ranks share two cores), caches inside ``tmp``."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_LEROBOT_HOME": str(tmp / "hf_lerobot"),
        "HF_HOME": str(tmp / "hf_home"),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


def run(args: list[str], tmp: Path, *, nproc: int = 1, check: bool = True, timeout: int = 420) -> subprocess.CompletedProcess:
    """``lerobot <args>``; with ``nproc`` > 1 under ``torchrun --standalone``."""
    command = [str(BIN / "lerobot"), *args]
    if nproc > 1:
        command = [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={nproc}", *command]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp, env=env(tmp), timeout=timeout)
    if check:
        assert result.returncode == 0, f"{' '.join(args)}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def train(tmp: Path, *flags: str, nproc: int = 1, root: Path) -> subprocess.CompletedProcess:
    return run(["train", *DATA, f"--dataset.root={root}", *flags], tmp, nproc=nproc)


def inspected(path: Path, tmp: Path) -> dict:
    """``lerobot inspect-checkpoint PATH --json`` of a checkpoint it finds valid (exit 0)."""
    result = run(["inspect-checkpoint", str(path), "--json"], tmp)
    return json.loads(result.stdout)


def losses(output_dir: Path) -> list[float]:
    lines = (output_dir / "logs" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


@pytest.fixture(scope="session")
def dataset_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data") / "reach"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return make_dataset(root, REPO_ID, episodes=4, length=24, image_hw=(48, 64))


@pytest.fixture(scope="session")
def vla_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local tokenizer (for π0/π0.5) and a tiny SmolVLM config and processor (for SmolVLA),
    written by transformers' save_pretrained: what the hub would otherwise provide."""
    assets = tmp_path_factory.mktemp("vla_assets")
    write_tokenizer(assets / "tokenizer")
    write_smolvlm(assets / "smolvlm")
    return assets


@pytest.fixture(scope="session")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


def banner_parameters(banner: str) -> tuple[float, float, float]:
    """(total, trainable, on this rank) from the banner's ``parameters`` line, in units
    rounded as printed (two decimals of K, M or B)."""
    line = next(line for line in banner.splitlines() if "parameters " in line and "on this rank" in line)
    words = line.split("parameters ", 1)[1].split()
    return _count(words[0]), _count(words[2]), _count(words[4])


def _count(text: str) -> float:
    scale = {"K": 1e3, "M": 1e6, "B": 1e9}
    return float(text[:-1]) * scale[text[-1]] if text[-1] in scale else float(text)


def copy_crashed(run_dir: Path, step: int, target: Path) -> Path:
    """A copy of ``run_dir`` as if it had died right after saving ``step``."""
    shutil.copytree(run_dir, target, symlinks=True)
    checkpoints = target / "checkpoints"
    for child in checkpoints.iterdir():
        if child.name.isdigit() and int(child.name) > step:
            shutil.rmtree(child)
    (checkpoints / "last").unlink()
    (checkpoints / "last").symlink_to(f"{step:06d}")
    metrics = target / "logs" / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines() if json.loads(line)["step"] <= step]
    metrics.write_text("\n".join(kept) + "\n")
    return target
