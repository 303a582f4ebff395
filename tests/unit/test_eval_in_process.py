"""Evaluation in one process: batches, the policy path, eval_info.json, videos, the plot, the RNG."""

from __future__ import annotations

import io
import json
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from PIL import Image
from torch import Tensor

from lerobot_kit.core.config.schema import EvalConfig, PolicyConfig
from lerobot_kit.core.data.dataset import ACTION_KEY, STATE_KEY, DatasetMeta
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.eval.evaluate import Evaluator
from lerobot_kit.core.eval.plot import FAILURE_RGB, SUCCESS_RGB, encode_png, write_rollout_plot
from lerobot_kit.core.eval.reduce import episode_batches, rank_share
from lerobot_kit.core.eval.rollout import Episode
from lerobot_kit.core.model.policy import Policy
from lerobot_kit.core.model.processor import PolicyProcessor, make_processors
from lerobot_kit.plugins.datasets.reach.data import expert_action, make_reach_dataset
from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig
from lerobot_kit.plugins.envs.reach.env import ReachEnv
from lerobot_kit.plugins.envs.reach.plugin import ReachEnvConfig
from lerobot_kit.plugins.policies.diffusion.configuration import DiffusionConfig
from lerobot_kit.plugins.policies.diffusion.modeling import DiffusionPolicy

ONE_PROCESS = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), launcher="single", backend=None)
ROW_KEYS = {"episode_ix", "sum_reward", "max_reward", "success", "seed"}
AGGREGATED_KEYS = {"avg_sum_reward", "avg_max_reward", "pc_success", "n_episodes", "eval_s", "eval_ep_s"}


def reach_meta(**options: object) -> DatasetMeta:
    return make_reach_dataset(ReachDatasetConfig(num_episodes=2, episode_length=10, **options), {}).meta


class CopycatPolicy(Policy):
    """Computes the scripted expert's command from what it observes; ``wander`` rotates it by
    90 degrees on odd episodes of a batch, so those never arrive."""

    config_class = PolicyConfig

    def __init__(self, meta: DatasetMeta, wander: bool = False) -> None:
        super().__init__(PolicyConfig(type="copycat"), meta)
        self.wander = wander

    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        state = batch[STATE_KEY].double().numpy()
        action = torch.from_numpy(expert_action(state[:, 0:2], state[:, 2:4], state[:, 4:6]))
        if self.wander:
            action[1::2] = torch.stack([-action[1::2, 1], action[1::2, 0]], dim=1)
        return action.float()


def identity() -> PolicyProcessor:
    return PolicyProcessor([])


def test_batches_are_the_same_for_every_world_size_and_dealt_round_robin() -> None:
    batches = episode_batches(10, 4)
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for world in (1, 2, 3, 5):
        shares = [rank_share(batches, rank, world) for rank in range(world)]
        assert sorted(b for share in shares for b in share) == batches
    assert rank_share(batches, 1, 2) == [[4, 5, 6, 7]]


def test_a_policy_that_copies_the_expert_scores_what_the_expert_scores(tmp_path: Path) -> None:
    """The observation → select_action → action path loses nothing: same successes, same rewards."""
    options = EvalConfig(n_episodes=5, batch_size=2, max_episodes_rendered=0)
    evaluator = Evaluator(ReachEnvConfig(), options, 7, ONE_PROCESS, reach_meta())
    info = evaluator.run(CopycatPolicy(reach_meta()), identity(), identity(), tmp_path, {})
    assert info is not None and info["expert"] is not None
    assert info["aggregated"]["pc_success"] == info["expert"]["aggregated"]["pc_success"] == 100.0
    for mine, expert in zip(info["per_episode"], info["expert"]["per_episode"]):
        assert mine["seed"] == expert["seed"] and mine["success"] == expert["success"]
        assert mine["sum_reward"] == pytest.approx(expert["sum_reward"], rel=1e-5)


def test_eval_info_follows_lerobots_shape_and_videos_decode(tmp_path: Path) -> None:
    options = EvalConfig(n_episodes=3, batch_size=2, max_episodes_rendered=2)
    evaluator = Evaluator(ReachEnvConfig(), options, 1000, ONE_PROCESS, reach_meta())
    info = evaluator.run(CopycatPolicy(reach_meta(), wander=True), identity(), identity(), tmp_path, {"step": 5})
    assert info == json.loads((tmp_path / "eval_info.json").read_text())
    assert set(info) == {"per_episode", "aggregated", "video_paths", "expert", "setup"}
    rows = info["per_episode"]
    assert [set(r) for r in rows] == [ROW_KEYS] * 3
    assert [(r["episode_ix"], r["seed"]) for r in rows] == [(0, 1000), (1, 1001), (2, 1002)]
    assert [r["success"] for r in rows] == [True, False, True]  # episode 1 is the odd one of its batch
    aggregated = info["aggregated"]
    assert set(aggregated) == AGGREGATED_KEYS and set(info["expert"]["aggregated"]) == AGGREGATED_KEYS
    assert aggregated["pc_success"] == pytest.approx(200 / 3)
    assert aggregated["avg_sum_reward"] == pytest.approx(np.mean([r["sum_reward"] for r in rows]))
    assert aggregated["avg_max_reward"] == pytest.approx(np.mean([r["max_reward"] for r in rows]))
    assert aggregated["n_episodes"] == 3 and aggregated["eval_ep_s"] == pytest.approx(aggregated["eval_s"] / 3)
    assert all(r["max_reward"] > -0.05 for r in info["expert"]["per_episode"])  # within the success radius
    assert info["setup"] == {"step": 5, "env": ReachEnvConfig().model_dump(mode="json"),
                             "seed": 1000, "n_episodes": 3, "batch_size": 2}

    assert info["video_paths"] == ["videos/eval_episode_0.mp4", "videos/eval_episode_1.mp4"]
    reference = ReachEnv(ReachEnvConfig(), 1)
    reference.reset(seed=[1001])
    with av.open(str(tmp_path / info["video_paths"][1])) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(frames) == 101  # reset + 100 steps: the wandering episode runs until it is truncated
    assert frames[0].shape == (128, 128, 3)
    assert np.abs(frames[0].astype(int) - reference.render()[0]).mean() < 3  # H.264 at crf 18 is near-lossless


def test_the_plot_colours_paths_by_success(tmp_path: Path) -> None:
    reached = Episode(0, 0, -1.0, 0.0, True, path=[[-1, -1], [-0.5, -0.5], [0, 0]], goal=[0, 0])
    missed = Episode(1, 1, -9.0, -1.0, False, path=[[1, -1], [1, 0], [1, 1]], goal=[-1, 1])
    assert write_rollout_plot(tmp_path / "rollouts.png", [reached, missed])
    pixels = np.asarray(Image.open(tmp_path / "rollouts.png").convert("RGB"))
    green = np.all(pixels == SUCCESS_RGB, axis=2)
    red = np.all(pixels == FAILURE_RGB, axis=2)
    assert green.any() and red.any()
    # +y up: the missed path runs up the right edge, the reached one in the lower left.
    assert np.nonzero(red)[1].mean() > pixels.shape[1] * 0.6
    assert np.nonzero(green)[0].mean() > pixels.shape[0] * 0.5
    assert not write_rollout_plot(tmp_path / "none.png", [Episode(0, 0, 0.0, 0.0, False)])


def test_png_encoder_round_trips() -> None:
    rgb = np.random.default_rng(0).integers(0, 256, size=(7, 5, 3), dtype=np.uint8)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(encode_png(rgb)))), rgb)


def test_a_policy_whose_features_the_env_lacks_is_one_line() -> None:
    options = EvalConfig(n_episodes=2, max_episodes_rendered=0)
    with pytest.raises(ConfigError) as missing:
        Evaluator(ReachEnvConfig(), options, 0, ONE_PROCESS, reach_meta(image=True, image_size=16))
    message = str(missing.value)
    assert "\n" not in message
    assert "observation.images.top (image 3x16x16) is missing" in message and "--env." in message
    with pytest.raises(ConfigError, match=r"observation.images.top is image 3x32x32, the policy's is image 3x16x16"):
        Evaluator(ReachEnvConfig(image=True), options, 0, ONE_PROCESS, reach_meta(image=True, image_size=16))


def test_a_stochastic_policy_evaluates_reproducibly_and_leaves_the_rng_alone(tmp_path: Path) -> None:
    """Diffusion samples noise from the global RNG: the evaluation seeds it per batch inside a
    fork, so the numbers repeat and the caller's RNG state comes out as it went in."""
    meta = reach_meta()
    config = DiffusionConfig(dim_model=32, n_heads=4, dim_feedforward=64, n_layers=1, horizon=6, n_action_steps=3,
                             num_inference_steps=2)
    torch.manual_seed(0)
    policy = DiffusionPolicy(config, meta)
    pre, post = make_processors(config, meta)
    evaluator = Evaluator(ReachEnvConfig(episode_length=12), EvalConfig(n_episodes=3, batch_size=2,
                          max_episodes_rendered=0), 3, ONE_PROCESS, meta)
    before = torch.get_rng_state()
    first = evaluator.run(policy, pre, post, tmp_path / "a", {})
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(123)  # another caller state: results do not depend on it
    second = evaluator.run(policy, pre, post, tmp_path / "b", {})
    assert first is not None and second is not None
    assert first["per_episode"] == second["per_episode"]
    assert len({r["sum_reward"] for r in first["per_episode"]}) == 3
