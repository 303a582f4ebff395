"""Diffusion Policy: schedule, shapes, gradients, precision, meta-device init, FSDP-safety,
queues, learning, save/load, in one process (FSDP2 through torchrun: integration/test_diffusion_fsdp.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from conftest import assert_meta_build_equals_cpu_build
from lerobot_kit.core.config.schema import PolicyConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.model.policy import PER_SAMPLE_LOSS, make_policy
from lerobot_kit.core.checkpoint.pretrained import load_pretrained, save_pretrained
from lerobot_kit.core.model.processor import make_processors
from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig
from lerobot_kit.plugins.datasets.reach.data import make_reach_dataset
from lerobot_kit.plugins.policies.diffusion.configuration import DiffusionConfig
from lerobot_kit.plugins.policies.diffusion.modeling import (
    DiffusionPolicy,
    DiffusionTransformerBlock,
    NoiseSchedule,
)

TINY = dict(dim_model=32, n_heads=4, dim_feedforward=64, n_layers=2, horizon=6, n_action_steps=3, n_obs_steps=2,
            image_keypoints=8, num_train_timesteps=20, num_inference_steps=4)
STATE, IMAGE = "observation.state", "observation.images.top"


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a busy 2-core runner, two spinning OpenMP threads run ~10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _setup(image: bool, **overrides: object):
    config = DiffusionConfig(**{**TINY, **overrides})
    dataset = make_reach_dataset(ReachDatasetConfig(num_episodes=3, episode_length=20, image=image, image_size=16),
                                 config.delta_indices())
    pre, post = make_processors(config, dataset.meta)
    batch = pre(torch.utils.data.default_collate([dataset[i] for i in (0, 9, 17, 19, 35)]))
    return config, dataset, batch, pre, post


def _observation(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k in (STATE, IMAGE)}


def test_schedule_levels_and_a_perfect_denoiser_recovers_the_chunk() -> None:
    schedule = NoiseSchedule(100)
    levels = schedule.alpha_bar
    assert all(1 > a > b > 0 for a, b in zip(levels, levels[1:]))
    assert levels[0] > 0.999 and levels[-1] < 1e-6  # squaredcos_cap_v2: from almost clean to almost pure noise
    assert schedule.inference_timesteps(4) == [(75, 50), (50, 25), (25, 0), (0, -1)]
    clean = torch.rand(3, 6, 2) * 2 - 1
    for stochastic in (False, True):
        torch.manual_seed(0)
        sample = torch.randn_like(clean)
        for t, prev in schedule.inference_timesteps(10):
            eps = (sample - levels[t] ** 0.5 * clean) / (1 - levels[t]) ** 0.5  # the true noise of `sample`
            estimate = schedule.clean_from_noise(sample, eps, t)
            sample = schedule.step(sample, estimate, t, prev, stochastic=stochastic)
        torch.testing.assert_close(sample, clean, atol=1e-5, rtol=0)
    noise, timesteps = torch.randn_like(clean), torch.tensor([0, 50, 99])
    noisy = schedule.add_noise(clean, noise, timesteps)
    for i, t in enumerate(timesteps.tolist()):
        expected = levels[t] ** 0.5 * clean[i] + (1 - levels[t]) ** 0.5 * noise[i]
        torch.testing.assert_close(noisy[i], expected)


def test_delta_indices_stack_state_and_camera_history_and_the_action_horizon() -> None:
    config, dataset, batch, _, _ = _setup(True)
    assert config.delta_indices() == {"action": list(range(6)), STATE: [-1, 0], "observation.images.*": [-1, 0]}
    assert batch[STATE].shape == (5, 2, 6) and batch["action"].shape == (5, 6, 2)
    assert batch[IMAGE].shape == (5, 2, 3, 16, 16)
    first = dataset[0]  # an episode's first frame: the history repeats it and says so
    for key in (STATE, IMAGE):
        assert first[f"{key}_is_pad"].tolist() == [True, False]
        assert torch.equal(first[key][0], first[key][1])
    assert torch.equal(dataset[5][IMAGE][0], dataset[4][IMAGE][1])  # the previous frame's camera image
    assert DiffusionConfig(n_obs_steps=1).delta_indices() == {"action": list(range(16))}


@pytest.mark.parametrize("image", [False, True])
@pytest.mark.parametrize("prediction_type", ["epsilon", "sample"])
def test_forward_backward_reaches_every_parameter(image: bool, prediction_type: str) -> None:
    config, dataset, batch, _, _ = _setup(image, prediction_type=prediction_type)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    assert isinstance(policy, DiffusionPolicy) and (policy.image_encoder is not None) == image
    loss, metrics = policy(batch)
    assert loss.shape == () and torch.isfinite(loss) and set(metrics) == {PER_SAMPLE_LOSS}
    loss.backward()
    missing = [n for n, p in policy.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"no finite gradient for {missing}"
    chunk = policy.predict_action_chunk(_observation(batch))
    assert chunk.shape == (5, config.horizon, 2) and not policy.training
    assert chunk.abs().max() <= config.clip_sample_range


def test_image_only_dataset_with_one_observation_step() -> None:
    config, dataset, batch, _, _ = _setup(True, n_obs_steps=1)
    meta = dataset.meta
    meta.features = {k: v for k, v in meta.features.items() if k != STATE}
    torch.manual_seed(0)
    policy = make_policy(config, meta)
    assert policy.state_proj is None and policy.cond_pos.shape[0] == 2  # timestep + one camera
    loss, _ = policy({k: v for k, v in batch.items() if k != STATE})
    assert torch.isfinite(loss)
    assert policy.select_action({IMAGE: batch[IMAGE]}).shape == (5, 2)


def test_padded_actions_count_only_when_asked() -> None:
    config, dataset, batch, _, _ = _setup(False)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    pad = batch["action_is_pad"]
    assert pad.any() and not pad.all()
    outputs: list[torch.Tensor] = []
    policy.action_head.register_forward_hook(lambda module, args, out: outputs.append(out))

    def output_grad() -> torch.Tensor:
        """d loss / d prediction, per action frame."""
        outputs.clear()
        loss, _ = policy(batch)
        return torch.autograd.grad(loss, outputs[0])[0].abs().sum(-1)

    masked = output_grad()
    assert torch.all(masked[pad] == 0) and torch.all(masked[~pad] > 0)
    policy.config = config.model_copy(update={"mask_padded_actions": False})
    assert torch.all(output_grad() > 0)


def test_forward_draws_noise_and_timesteps_from_the_global_rng() -> None:
    config, dataset, batch, _, _ = _setup(False)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    torch.manual_seed(5)
    first = policy(batch)[0]
    torch.manual_seed(5)
    assert torch.equal(policy(batch)[0], first)
    assert not torch.equal(policy(batch)[0], first)  # the RNG moved on: new noise, new levels


def test_bf16_autocast_runs_and_is_close_to_fp32() -> None:
    config, dataset, batch, _, _ = _setup(True, dropout=0.0)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    torch.manual_seed(1)
    full, _ = policy(batch)
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half, _ = policy(batch)
    half.backward()
    assert half.dtype == torch.float32 and torch.isfinite(half)
    assert abs(half.item() - full.item()) < 0.05 * full.item()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in policy.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunk = policy.predict_action_chunk(_observation(batch))
    assert chunk.dtype == torch.float32 and torch.isfinite(chunk).all()


def test_bf16_weights_without_autocast_as_fsdp_param_dtype_runs_them() -> None:
    """FSDP2's MixedPrecisionPolicy(param_dtype=bf16) runs bf16 weights on bf16-cast inputs, no autocast."""
    config, dataset, batch, _, _ = _setup(True)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta).to(torch.bfloat16)
    cast = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()}
    loss, _ = policy(cast)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in policy.parameters())
    assert torch.isfinite(policy.predict_action_chunk(_observation(cast))).all()


def test_meta_device_build_then_init_weights_equals_a_cpu_build() -> None:
    config, dataset, _, _, _ = _setup(True)
    reference = assert_meta_build_equals_cpu_build(lambda: make_policy(config, dataset.meta))
    torch.manual_seed(8)
    assert not torch.equal(make_policy(config, dataset.meta).cond_pos, reference.cond_pos)


def test_wrap_units_are_disjoint_blocks_and_peft_targets_exist() -> None:
    config, dataset, _, _, _ = _setup(True)
    policy = make_policy(config, dataset.meta)
    assert DiffusionPolicy._fsdp_wrap_modules == ["DiffusionTransformerBlock"]
    units = [m for m in policy.modules() if isinstance(m, DiffusionTransformerBlock)]
    assert len(units) == config.n_layers
    seen: set[int] = set()
    for unit in units:
        ids = {id(p) for p in unit.parameters()}
        assert not ids & seen, "a parameter is shared between two wrap units"
        seen |= ids
    linear_names = {name.rsplit(".", 1)[-1] for name, m in policy.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(DiffusionPolicy.default_peft_targets) <= linear_names
    in_blocks = {name.rsplit(".", 1)[-1] for unit in units for name, m in unit.named_modules()
                 if isinstance(m, torch.nn.Linear)}
    assert set(DiffusionPolicy.default_peft_targets) == in_blocks


def test_select_action_keeps_history_and_pops_a_queue_of_n_action_steps() -> None:
    config, dataset, batch, _, _ = _setup(False)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    states = [batch[STATE][:, 1]] + [torch.randn_like(batch[STATE][:, 1]) for _ in range(config.n_action_steps)]

    def chunk_for(history: list[torch.Tensor], seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        return policy.predict_action_chunk({STATE: torch.stack(history, dim=1)})

    expected = chunk_for([states[0], states[0]], seed=1)  # after reset the history repeats the first frame
    torch.manual_seed(1)
    first = policy.select_action({STATE: states[0]})
    assert first.shape == (5, 2) and not policy.training
    torch.testing.assert_close(first, expected[:, 0])
    for k in range(1, config.n_action_steps):  # queued actions, whatever the new observation says
        torch.testing.assert_close(policy.select_action({STATE: states[k]}), expected[:, k])
    # The next chunk sees the last n_obs_steps observations.
    following = chunk_for(states[-2:], seed=2)
    torch.manual_seed(2)
    torch.testing.assert_close(policy.select_action({STATE: states[-1]}), following[:, 0])
    policy.reset()
    torch.manual_seed(1)
    torch.testing.assert_close(policy.select_action({STATE: states[0]}), expected[:, 0])


def test_select_action_keeps_camera_history() -> None:
    config, dataset, batch, _, _ = _setup(True)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    frames = [{STATE: batch[STATE][:, 1], IMAGE: batch[IMAGE][:, 1]},
              {STATE: batch[STATE][:, 0], IMAGE: batch[IMAGE][:, 0]}]
    torch.manual_seed(1)
    expected = policy.predict_action_chunk({k: torch.stack([frames[0][k]] * 2, dim=1) for k in (STATE, IMAGE)})
    torch.manual_seed(1)
    torch.testing.assert_close(policy.select_action(frames[0]), expected[:, 0])
    for _ in range(1, config.n_action_steps):
        policy.select_action(frames[0])
    torch.manual_seed(2)
    following = policy.predict_action_chunk({k: torch.stack([frames[0][k], frames[1][k]], dim=1)
                                             for k in (STATE, IMAGE)})
    torch.manual_seed(2)
    torch.testing.assert_close(policy.select_action(frames[1]), following[:, 0])


def test_ddpm_sampler_gives_chunks_in_range() -> None:
    config, dataset, batch, _, _ = _setup(False, sampler="ddpm")
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    chunks = [policy.predict_action_chunk(_observation(batch)) for _ in range(2)]
    assert chunks[0].shape == (5, config.horizon, 2) and chunks[0].abs().max() <= 1.0
    assert not torch.equal(*chunks)  # stochastic


def test_wrongly_shaped_observations_are_named() -> None:
    config, dataset, batch, _, _ = _setup(True)
    policy = make_policy(config, dataset.meta)
    with pytest.raises(ValueError, match=r"n_obs_steps=2 expects 'observation.state' as \[B, 2, 6\]"):
        policy.predict_action_chunk(dict(_observation(batch), **{STATE: batch[STATE][:, 0]}))
    with pytest.raises(ValueError, match=r"n_obs_steps=2 expects 'observation.images.top' as \[B,2,3,H,W\]"):
        policy.predict_action_chunk(dict(_observation(batch), **{IMAGE: batch[IMAGE][:, 0]}))


def test_config_rejects_inconsistent_shapes() -> None:
    with pytest.raises(ValidationError, match="n_action_steps=17 exceeds horizon=16"):
        DiffusionConfig(n_action_steps=17)
    with pytest.raises(ValidationError, match="not divisible by n_heads=3"):
        DiffusionConfig(n_heads=3)
    with pytest.raises(ValidationError, match="num_inference_steps=101 exceeds num_train_timesteps=100"):
        DiffusionConfig(num_inference_steps=101)
    with pytest.raises(ValidationError, match="sampler"):
        DiffusionConfig(sampler="euler")
    assert all(field.description for field in DiffusionConfig.model_fields.values())


def test_config_problems_are_config_errors() -> None:
    config, dataset, _, _, _ = _setup(False)
    with pytest.raises(ConfigError, match="n_action_steps=7 exceeds policy.horizon=6"):
        DiffusionPolicy(config.model_copy(update={"n_action_steps": 7}), dataset.meta)
    with pytest.raises(ConfigError, match="num_inference_steps=30 exceeds policy.num_train_timesteps=20"):
        DiffusionPolicy(config.model_copy(update={"num_inference_steps": 30}), dataset.meta)
    with pytest.raises(ConfigError, match="divisible"):
        DiffusionPolicy(config.model_copy(update={"n_heads": 5}), dataset.meta)
    with pytest.raises(ConfigError, match="DiffusionPolicy needs a DiffusionConfig"):
        DiffusionPolicy(PolicyConfig(type="other"), dataset.meta)  # type: ignore[arg-type]


@pytest.mark.parametrize("prediction_type", ["epsilon", "sample"])
def test_tiny_diffusion_learns_the_reach_task(prediction_type: str) -> None:
    """300 AdamW steps at batch 8: the denoising loss falls. Predicting the clean chunk also
    makes sampled actions track the expert within that budget (epsilon needs far longer)."""
    config = DiffusionConfig(**{**TINY, "dropout": 0.0, "prediction_type": prediction_type})
    dataset = make_reach_dataset(ReachDatasetConfig(num_episodes=20, episode_length=50), config.delta_indices())
    pre, _ = make_processors(config, dataset.meta)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3, weight_decay=1e-4)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    losses: list[float] = []
    steps = 300
    while len(losses) < steps:
        for batch in loader:
            loss, _ = policy(pre(batch))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
    print(f"first-25 mean {sum(losses[:25]) / 25:.4f}, last-25 mean {sum(losses[-25:]) / 25:.4f}")
    assert sum(losses[-25:]) / 25 < 0.6 * sum(losses[:25]) / 25
    if prediction_type == "sample":
        held = pre(torch.utils.data.default_collate([dataset[i] for i in range(0, len(dataset), 5)]))
        first_action = policy.predict_action_chunk({STATE: held[STATE]})[:, 0]
        target = held["action"][:, 0]
        error, spread = (first_action - target).abs().mean(), (target - target.mean(0)).abs().mean()
        print(f"sampled first-action error {error:.3f}, error of the mean action {spread:.3f}")
        assert error < 0.5 * spread


def test_save_load_round_trip_is_bitwise_and_acts_the_same(tmp_path: Path) -> None:
    config, dataset, batch, pre, post = _setup(True)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    for _ in range(3):  # move away from the init, so a fresh build would not match by accident
        loss, _ = policy(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_pretrained(policy, dataset.meta, pre, post, policy.state_dict(), tmp_path / "pretrained_model")
    saved = json.loads((tmp_path / "pretrained_model" / "config.json").read_text())
    assert saved["type"] == "diffusion" and DiffusionConfig.model_validate(saved) == config

    loaded, loaded_pre, loaded_post = load_pretrained(tmp_path / "pretrained_model")
    assert isinstance(loaded, DiffusionPolicy) and loaded.config == config
    assert policy.state_dict().keys() == loaded.state_dict().keys()
    for key, tensor in policy.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[key]), key

    raw = [{STATE: dataset[i][STATE][-1][None], IMAGE: dataset[i][IMAGE][-1][None]} for i in range(5)]

    def rollout(p, pr, po) -> list[torch.Tensor]:
        p.reset()
        torch.manual_seed(11)
        return [po({"action": p.select_action(pr(obs))})["action"] for obs in raw]

    expected, got = rollout(policy, pre, post), rollout(loaded, loaded_pre, loaded_post)
    assert expected[0].shape == (1, 2) and all(torch.equal(a, b) for a, b in zip(expected, got))
