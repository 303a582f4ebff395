"""Diffusion under FSDP2 through the CLI: two gloo ranks (a rank pool, ``tests/rank_pool.py``),
one DiffusionTransformerBlock per unit, and a resumed run equal to a straight one."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from conftest import pool_train, read_metrics
from lerobot_kit.core.checkpoint.pretrained import load_pretrained
from lerobot_kit.plugins.policies.diffusion.modeling import DiffusionPolicy


CLI_TINY = ["--policy.type=diffusion", "--parallelism.dp_shard=2", "--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_layers=2",
            "--policy.horizon=8", "--policy.n_action_steps=4", "--policy.image_keypoints=8",
            "--dataset.num_episodes=2", "--dataset.episode_length=20", "--dataset.image=true",
            "--dataset.image_size=16", "--batch_size=4", "--log_freq=1", "--seed=3"]


def test_fsdp2_training_resumes_exactly(tmp_path: Path, rank_pools) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    result = pool_train(rank_pools, 2, *CLI_TINY, f"--output_dir={straight}", "--steps=6", "--save_freq=3",
                        workdir=tmp_path)
    assert "wrap units: 2 from policy (DiffusionTransformerBlock)" in result.stderr
    assert "layout fsdp" in result.stderr
    pool_train(rank_pools, 2, *CLI_TINY, f"--output_dir={split}", "--steps=3", "--save_freq=3", workdir=tmp_path)
    config = split / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
    pool_train(rank_pools, 2, "--resume=true", f"--config_path={config}", "--steps=6", "--save_freq=3",
               workdir=tmp_path)
    losses = [row["loss"] for row in read_metrics(straight)]
    assert len(losses) == 6 and losses == [row["loss"] for row in read_metrics(split)]
    a = load_file(straight / "checkpoints" / "000006" / "pretrained_model" / "model.safetensors")
    b = load_file(split / "checkpoints" / "000006" / "pretrained_model" / "model.safetensors")
    assert a.keys() == b.keys() and any(k.startswith("blocks.1.") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after resume"
    policy, _, _ = load_pretrained(straight / "checkpoints" / "last")
    assert isinstance(policy, DiffusionPolicy)
