"""LeRobot's ACT trained by ``lerobot train`` under FSDP(2) on a LeRobot v3 video dataset,
its checkpoint then used by LeRobot alone, and resumed exactly on one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import ACTION_DIM, TINY_ACT, copy_crashed, inspected, losses, run, train
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
    report = inspected(pretrained.parent, work)  # LeRobot's config.json is read as lerobot_act's, not core ACT's
    assert report["resumable"]["ok"] and report["loadable"]["ok"], report["problems"]
    # lerobot eval runs lerobot-kit's own policies: one line naming LeRobot's tools, not "install the bridge".
    evaluated = run(["eval", f"--policy.path={pretrained}", "--eval.n_episodes=1", f"--output_dir={work / 'ev'}"],
                    work, check=False)
    assert evaluated.returncode == 1 and evaluated.stderr.strip().splitlines()[-1].endswith(
        "LeRobot wrote it, and lerobot-kit reads it as lerobot_act only to train from it (--policy.path): load it "
        "with LeRobot's from_pretrained, or evaluate it with LeRobot's lerobot-eval"), evaluated.stderr
    assert not (work / "ev").exists()
    policy, preprocessor, postprocessor = load_with_lerobot(pretrained, "act")
    assert type(policy).__name__ == "ACTPolicy" and policy.config.dim_model == 32
    assert_same_weights(policy, sharded_weights(pretrained, work))
    action = act_on(policy, preprocessor, postprocessor, observation(dataset_root, 5))
    assert action.shape == (1, ACTION_DIM) and action.isfinite().all()


def test_fsdp2_resumed_on_one_process_continues_the_run_exactly(work: Path, dataset_root: Path) -> None:
    """With a deterministic forward (no dropout, no VAE latent drawn), a resume onto another
    number of ranks with the same global batch continues the uninterrupted run up to the
    order of float summation. LeRobot's ACT divides its loss by the valid (not padded)
    action entries of the batch it sees; the bridge weights ranks by theirs, so two ranks'
    losses are the one-process loss of the global batch (batches near episode ends differ
    in padding between the ranks' halves: the dataset's episodes are 24 frames, chunks 5)."""
    # A larger Adam eps keeps float-rounding noise in near-zero gradients (attention biases)
    # from being blown up to full-size updates, so the final weights compare, not just losses.
    flags = [*TINY_ACT, "--policy.use_vae=false", "--log_freq=1", "--optimizer.lr=1e-3", "--optimizer.eps=1e-3",
             "--checkpoint_format=safetensors_dcp"]
    straight = work / "act_exact_fsdp2"
    train(work, *flags, f"--output_dir={straight}", "--parallelism.dp_shard=2", "--batch_size=4", "--steps=10",
          "--save_freq=5", nproc=2, root=dataset_root)

    resumed = copy_crashed(straight, 5, work / "act_exact_resumed")
    config = resumed / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
    result = train(work, "--resume=true", f"--config_path={config}", "--parallelism.dp_shard=null",
                   "--batch_size=8", root=dataset_root)
    assert "layout single" in result.stderr and "steps 5→10" in result.stderr

    expected, got = losses(straight), losses(resumed)
    assert len(expected) == len(got) == 10
    assert got[5:] == pytest.approx(expected[5:], rel=1e-5)
    assert got[5:] != expected[:5]  # the resumed steps trained on: not a replay of the start

    final = sharded_weights(straight / "checkpoints" / "000010" / "pretrained_model", work)
    policy, _, _ = load_with_lerobot(resumed / "checkpoints" / "000010" / "pretrained_model", "act")
    state = policy.state_dict()
    assert state.keys() == final.keys()
    for key, tensor in final.items():
        torch.testing.assert_close(state[key], tensor, rtol=1e-4, atol=1e-6, msg=key)


def test_a_dataset_without_the_robots_state_is_refused_before_building() -> None:
    """LeRobot 0.6.1's ACT reads the state even where its docs call it optional: a KeyError
    in the first step (the VLAs' refusals: test_vla_joint.py; the line reaching the console
    is the path every ConfigError takes, tested in test_install.py)."""
    from lerobot_kit.api import ConfigError, DatasetMeta, FeatureSpec
    from lerobot_kit_lerobot.configuration import CONFIG_CLASSES
    from lerobot_kit_lerobot.modeling import LerobotACT

    features = {"observation.images.top": FeatureSpec("image", (3, 48, 64)), "action": FeatureSpec("float32", (3,))}
    meta = DatasetMeta(features=features, stats={}, fps=10, num_episodes=1, num_frames=10)
    with pytest.raises(ConfigError, match=r"^policy.type=lerobot_act cannot use this dataset \(features \['action', "
                                          r"'observation.images.top'\]\): LeRobot's act reads the robot's state "
                                          r"\('observation.state'\) in every step, and the dataset has none; train it "
                                          r"on a dataset that records the state$"):
        LerobotACT.check_dataset(CONFIG_CLASSES["act"](), meta)
