"""LeRobot's Diffusion Policy under FSDP(2), loaded by LeRobot, and resumed on one process."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import ACTION_DIM, REPO_ID, TINY_DIFFUSION, copy_crashed, losses, make_dataset, train
from lerobot_side import act_on, assert_same_weights, load_with_lerobot, observation, sharded_weights

# Predicting the clean action trajectory (LeRobot's prediction_type=sample) makes the loss
# fall within a few steps, where predicting the noise takes hundreds.
FLAGS = [*TINY_DIFFUSION, "--policy.prediction_type=sample", "--log_freq=1", "--optimizer.lr=3e-3",
         "--checkpoint_format=safetensors_dcp"]


def test_fsdp2_diffusion_learns_lerobot_loads_it_and_it_resumes_on_one_process(work: Path, dataset_root: Path) -> None:
    out = work / "diffusion_fsdp2"
    result = train(work, *FLAGS, f"--output_dir={out}", "--parallelism.dp_shard=2", "--batch_size=8", "--steps=12",
                   "--save_freq=6", nproc=2, root=dataset_root)
    assert "layout fsdp" in result.stderr and "from policy (DiffusionConditionalResidualBlock1d)" in result.stderr
    logged = losses(out)
    assert len(logged) == 12 and sum(logged[-3:]) < 0.6 * sum(logged[:3]), logged

    pretrained = out / "checkpoints" / "000012" / "pretrained_model"
    policy, preprocessor, postprocessor = load_with_lerobot(pretrained, "diffusion")
    assert type(policy).__name__ == "DiffusionPolicy"
    assert_same_weights(policy, sharded_weights(pretrained, work))
    action = act_on(policy, preprocessor, postprocessor, observation(dataset_root, 7))
    assert action.shape == (1, ACTION_DIM) and action.isfinite().all()

    # Resume the step-6 checkpoint on one process, with the same global batch.
    resumed = copy_crashed(out, 6, work / "diffusion_resumed")
    config = resumed / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
    result = train(work, "--resume=true", f"--config_path={config}", "--parallelism.dp_shard=null",
                   "--batch_size=16", root=dataset_root)
    assert "steps 6→12" in result.stderr
    record = json.loads((resumed / "checkpoints" / "000012" / "training_state" / "training_step.json").read_text())
    assert record["topology"]["world_size"] == 1 and record["sampler"]["samples_seen"] == 12 * 16
    load_with_lerobot(resumed / "checkpoints" / "000012" / "pretrained_model", "diffusion")


def test_diffusion_on_pusht_layout_stacks_the_environment_state_as_lerobot_does(work: Path) -> None:
    """LeRobot gives its observation offsets to every ``observation.*`` feature, so Diffusion
    concatenates an environment state of ``n_obs_steps`` frames with the state's (PushT's
    keypoints); given one frame, LeRobot's code failed on the concatenation."""
    root = make_dataset(work / "pusht_layout", REPO_ID, episodes=2, length=12, image_hw=(48, 64), env_state_dim=6)
    out = work / "diffusion_pusht"
    train(work, *FLAGS, f"--output_dir={out}", "--batch_size=4", "--steps=2", root=root)
    assert len(losses(out)) == 2
    pretrained = out / "checkpoints" / "000002" / "pretrained_model"
    policy, preprocessor, postprocessor = load_with_lerobot(pretrained, "diffusion")
    assert policy.config.env_state_feature.shape == (6,)
    action = act_on(policy, preprocessor, postprocessor, observation(root, 5))
    assert action.shape == (1, ACTION_DIM) and action.isfinite().all()
