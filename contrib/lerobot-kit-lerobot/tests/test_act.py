"""LeRobot's ACT trained by ``lerobot train`` under FSDP(2) on a LeRobot v3 video dataset,
its checkpoint then used by LeRobot alone."""

from __future__ import annotations

from pathlib import Path

from conftest import ACTION_DIM, TINY_ACT, losses, train
from lerobot_side import act_on, assert_same_weights, load_with_lerobot, observation, sharded_weights


def test_fsdp2_act_learns_and_lerobot_loads_and_runs_the_checkpoint(work: Path, dataset_root: Path) -> None:
    out = work / "act_fsdp2"
    result = train(
        work, *TINY_ACT, f"--output_dir={out}", "--parallelism.dp_shard=2", "--batch_size=8", "--steps=16",
        "--save_freq=16", "--log_freq=1", "--optimizer.lr=1e-3", "--checkpoint_format=safetensors_dcp",
        nproc=2, root=dataset_root,
    )
    assert "layout fsdp" in result.stderr
    # 2 encoder layers, 1 decoder layer, and the VAE encoder's 1 (an ACTEncoderLayer too)
    assert "wrap units: 4 from policy (ACTDecoderLayer, ACTEncoderLayer)" in result.stderr
    logged = losses(out)
    assert len(logged) == 16 and sum(logged[-4:]) < 0.6 * sum(logged[:4]), logged

    pretrained = out / "checkpoints" / "000016" / "pretrained_model"
    policy, preprocessor, postprocessor = load_with_lerobot(pretrained, "act")
    assert type(policy).__name__ == "ACTPolicy" and policy.config.dim_model == 32
    assert_same_weights(policy, sharded_weights(pretrained, work))
    action = act_on(policy, preprocessor, postprocessor, observation(dataset_root, 5))
    assert action.shape == (1, ACTION_DIM) and action.isfinite().all()
