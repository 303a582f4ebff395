"""The reach environment: the dataset's simulator under gymnasium's vector conventions."""

from __future__ import annotations

import numpy as np
import pytest

from lerobot_kit.api import EnvConfig, VectorEnv
from lerobot_kit.core.errors import PluginError
from lerobot_kit.core.registry.entries import EnvEntry, PluginInfo
from lerobot_kit.core.registry.registry import get_registry
from lerobot_kit.plugins.datasets.reach.data import IMAGE_KEY, make_reach_dataset
from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig
from lerobot_kit.plugins.envs.reach.env import ReachEnv
from lerobot_kit.plugins.envs.reach.plugin import ReachEnvConfig

STATE = "observation.state"


def make(n: int, **options: object) -> VectorEnv:
    return get_registry().env("reach").build(ReachEnvConfig(**options), n)


def test_registered_through_the_hook_and_built_by_its_factory() -> None:
    entry = get_registry().env("reach")
    assert entry.config_class is ReachEnvConfig and issubclass(ReachEnvConfig, EnvConfig)
    env = make(3)
    assert isinstance(env, ReachEnv) and env.num_envs == 3 and env.max_episode_steps == 100


def test_the_expert_in_the_env_replays_the_generated_episode_frame_for_frame() -> None:
    """Episode seed s starts where --dataset.generation_seed=s starts, and the same expert,
    dynamics and camera then give the dataset's states, actions and images."""
    for seed in (3, 17):
        data = make_reach_dataset(ReachDatasetConfig(num_episodes=1, episode_length=60, generation_seed=seed,
                                                     image=True, image_size=16), {})
        env = make(1, image=True, image_size=16, episode_length=60)
        observation, _ = env.reset(seed=[seed])
        for t in range(60):
            np.testing.assert_array_equal(observation[STATE][0], data.frames[STATE][t])
            assert np.abs(observation[IMAGE_KEY][0].astype(int) - data.frames[IMAGE_KEY][t]).max() <= 1
            action = env.expert_action()
            np.testing.assert_array_equal(action[0].astype(np.float32), data.frames["action"][t])
            observation, *_ = env.step(action)


def test_reset_is_a_pure_function_of_each_seed() -> None:
    env = make(3)
    first, _ = env.reset(seed=[5, 6, 7])
    again, _ = make(1).reset(seed=[6])
    np.testing.assert_array_equal(first[STATE][1], again[STATE][0])
    assert len({tuple(row) for row in first[STATE][:, :4]}) == 3
    with pytest.raises(ValueError, match="one seed per environment"):
        env.reset(seed=[1])


def test_step_follows_gymnasium_and_ends_on_success_or_time() -> None:
    env = make(2, episode_length=5)
    observation, info = env.reset(seed=[0, 1])
    assert observation[STATE].dtype == np.float32 and observation[STATE].shape == (2, 6)
    assert set(info) >= {"is_success", "position", "goal"}
    target = observation[STATE][:, 2:4].astype(np.float64)
    # Environment 0 jumps onto its target (a command of distance x fps), environment 1 stays put.
    jump = np.stack([(target[0] - info["position"][0]) * env.fps, np.zeros(2)])
    observation, reward, terminated, truncated, info = env.step(jump)
    assert terminated.tolist() == [True, False] and info["is_success"].tolist() == [True, False]
    assert reward[0] == pytest.approx(0.0, abs=1e-6)
    assert reward[1] == pytest.approx(-np.linalg.norm(target[1] - info["position"][1]))
    np.testing.assert_array_equal(observation[STATE][:, 4:6], jump.astype(np.float32))  # the last command
    for step in range(2, 6):
        *_, truncated, _ = env.step(np.zeros((2, 2)))
        assert truncated.tolist() == [step == 5] * 2
    frames = env.render()
    assert frames.shape == (2, 128, 128, 3) and frames.dtype == np.uint8


def test_a_factory_that_returns_something_else_is_named() -> None:
    info = PluginInfo("oddenv", "odd-package", "1.0", builtin=False)
    entry = EnvEntry("odd", info, lambda config, n: make(n + 1), ReachEnvConfig)
    with pytest.raises(PluginError, match=r"plugin 'oddenv' \(odd-package\).*not a lerobot_kit.api.VectorEnv of num_envs=2"):
        entry.build(ReachEnvConfig(), 2)
