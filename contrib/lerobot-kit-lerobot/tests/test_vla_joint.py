"""The bridge's joint layers compute what LeRobot's own forward computes, its unit groups
cover every layer once, its LoRA targets are LeRobot's, and its per-sample noise does not
depend on how a batch is split. In one process, on LeRobot's classes at reduced sizes."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.factory import get_policy_class, make_policy_config

from conftest import PI_SIZES
from joint_compile import assert_pairs_compile_to
from lerobot_kit_lerobot import joint
from lerobot_kit_lerobot.bridge_fields import PiSizes
from lerobot_kit_lerobot.flow_noise import PerSampleDraws
from lerobot_kit_lerobot.modeling import LerobotPI0, LerobotPI05, LerobotSmolVLA, freeze_unreached
from lerobot_kit_lerobot.pi_overrides import modeling_module, pi_sizes
from lerobot_kit_lerobot.vla_loss import flow_matching_loss

BRIDGE = {"pi0": LerobotPI0, "pi05": LerobotPI05, "smolvla": LerobotSmolVLA}
BATCH = 3
TOP = "observation.images.top"


def lerobot_policy(kind: str, assets: Path, cameras: tuple[str, ...] = (TOP,)) -> torch.nn.Module:
    """LeRobot's policy, built by its own constructor at the tests' reduced size."""
    sizes = {"vlm_model_name": str(assets / "smolvlm"), "num_vlm_layers": 4, "resize_imgs_with_padding": (64, 64),
             "expert_width_multiplier": 0.5} if kind == "smolvla" else {"image_resolution": (64, 64)}
    config = make_policy_config(kind, chunk_size=4, n_action_steps=4, max_state_dim=8, max_action_dim=8,
                                tokenizer_max_length=12, device="cpu", **sizes)
    config.input_features = {**{camera: PolicyFeature(FeatureType.VISUAL, (3, 48, 64)) for camera in cameras},
                             "observation.state": PolicyFeature(FeatureType.STATE, (3,))}
    config.output_features = {"action": PolicyFeature(FeatureType.ACTION, (3,))}
    torch.manual_seed(0)
    with pi_sizes(kind, PiSizes.model_validate_json(PI_SIZES)) if kind != "smolvla" else contextlib.nullcontext():
        return get_policy_class(kind)(config=config)


def batch(cameras: tuple[str, ...] = (TOP,)) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {
        **{camera: torch.rand(BATCH, 3, 48, 64, generator=gen) for camera in cameras},
        "observation.state": torch.randn(BATCH, 3, generator=gen),
        "action": torch.randn(BATCH, 4, 3, generator=gen),
        "action_is_pad": torch.tensor([[False] * 4, [False, False, True, True], [False] * 4]),
        "observation.language.tokens": torch.randint(0, 300, (BATCH, 12), generator=gen),
        "observation.language.attention_mask": torch.arange(12).expand(BATCH, 12) < torch.tensor([[12], [7], [9]]),
        "index": torch.tensor([4, 17, 30]),
        "epoch": torch.tensor([2, 2, 2]),
    }


def install(kind: str, policy: torch.nn.Module, attention: str = "eager") -> None:
    """The bridge's joint layers on LeRobot's policy; by default with LeRobot's own attention
    code (``test_fused_attention`` compares the fused one with it)."""
    if kind == "smolvla":
        joint.install_smolvla(policy.model.vlm_with_expert, attention=attention)
    else:
        joint.install_pi(policy.model.paligemma_with_expert, modeling_module(kind), attention=attention)


@pytest.mark.parametrize("kind", ["pi0", "pi05", "smolvla"])
def test_joint_layers_compute_lerobots_forward(kind: str, vla_assets: Path) -> None:
    """Loss and every gradient equal LeRobot's own forward on the same weights and draws."""
    results = []
    for bridged in (False, True):
        policy = lerobot_policy(kind, vla_assets)
        if bridged:
            install(kind, policy)
        torch.manual_seed(7)  # the same noise and time for both
        loss, _ = policy.forward(batch())
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}))
    (loss, grads), (bridged_loss, bridged_grads) = results
    assert torch.equal(bridged_loss, loss)
    assert bridged_grads.keys() == grads.keys() and len(grads) > 20
    for name, grad in grads.items():
        torch.testing.assert_close(bridged_grads[name], grad, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize("kind", ["pi0", "pi05", "smolvla"])
def test_the_bridges_loss_is_lerobots(kind: str, vla_assets: Path) -> None:
    """The loss composed from LeRobot's own calls, without its host-side metrics, equals
    its policy's forward, and so do the gradients."""
    results = []
    for ours in (False, True):
        policy = lerobot_policy(kind, vla_assets)
        torch.manual_seed(7)
        loss = flow_matching_loss(policy, batch())[0] if ours else policy.forward(batch())[0]
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}))
    (theirs, their_grads), (loss, grads) = results
    assert torch.equal(loss, theirs)
    assert grads.keys() == their_grads.keys()
    assert all(torch.equal(grads[name], grad) for name, grad in their_grads.items())


@pytest.mark.parametrize("kind", ["pi0", "pi05", "smolvla"])
def test_unit_groups_hold_each_layer_once(kind: str, vla_assets: Path) -> None:
    policy = lerobot_policy(kind, vla_assets)
    install(kind, policy)
    if kind == "smolvla":
        groups = joint.smolvla_unit_groups("model.vlm_with_expert", policy.model.vlm_with_expert)
        towers = ["model.vlm_with_expert.vlm.model.text_model.layers", "model.vlm_with_expert.lm_expert.layers"]
    else:
        groups = joint.pi_unit_groups("model.paligemma_with_expert", 6)
        towers = ["model.paligemma_with_expert.paligemma.model.language_model.layers",
                  "model.paligemma_with_expert.gemma_expert.model.layers"]
    layers = [f"{tower}.{i}" for tower in towers for i in range(len(policy.get_submodule(tower)))]
    members = [path for group in groups for path in group.paths]
    assert sorted(p for p in members if "layers." in p) == sorted(layers)
    assert len(members) == len(set(members))
    for group in groups:
        if group.method:
            assert len(group.paths) == 2 and callable(getattr(policy.get_submodule(group.paths[0]), group.method))


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_every_trainable_parameter_gets_a_gradient(kind: str, vla_assets: Path) -> None:
    """What the loss never reaches is frozen (so a resume finds optimizer state for every
    trainable parameter); LeRobot's own model leaves those parameters trainable."""
    policy = lerobot_policy(kind, vla_assets)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    freeze_unreached(policy.model.paligemma_with_expert)
    loss, _ = policy.forward(batch())
    loss.backward()
    unreached = {n for n, p in policy.named_parameters() if p.requires_grad and p.grad is None}
    frozen = trainable - {n for n, p in policy.named_parameters() if p.requires_grad}
    assert unreached == set()
    assert {n.split("paligemma_with_expert.")[1] for n in frozen} == {
        "paligemma.lm_head.weight", "gemma_expert.lm_head.weight", "paligemma.model.language_model.norm.weight",
        *(f"paligemma.model.language_model.layers.5.{p}.weight" for p in (
            "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")),
    }


@pytest.mark.parametrize("kind", ["pi0", "pi05", "smolvla"])
def test_lora_targets_are_lerobots(kind: str, vla_assets: Path) -> None:
    policy = lerobot_policy(kind, vla_assets)
    assert BRIDGE[kind].default_peft_targets == policy._get_default_peft_targets()["target_modules"]


def test_per_sample_draws_do_not_depend_on_the_split(vla_assets: Path) -> None:
    """Noise and time of a sample are the same drawn in a batch of three or of one, again
    in the same epoch (a resumed run), and differ between samples and between epochs."""
    model = lerobot_policy("pi05", vla_assets).model
    draws = PerSampleDraws(model, seed=3)
    whole = batch()
    with draws.for_batch(whole):
        noise, time = model.sample_noise((BATCH, 4, 8), "cpu"), model.sample_time(BATCH, "cpu")
    other = lerobot_policy("pi05", vla_assets).model  # another rank, holding one of the three samples
    with PerSampleDraws(other, seed=3).for_batch({"index": whole["index"][1:2], "epoch": whole["epoch"][1:2]}):
        one_noise, one_time = other.sample_noise((1, 4, 8), "cpu"), other.sample_time(1, "cpu")
    assert torch.equal(one_noise[0], noise[1]) and torch.equal(one_time[0], time[1])
    assert not torch.equal(noise[0], noise[1])
    with draws.for_batch(whole):
        assert torch.equal(model.sample_noise((BATCH, 4, 8), "cpu"), noise)  # no state: the same epoch, the same draw
    with draws.for_batch({**whole, "epoch": whole["epoch"] + 1}):
        assert not torch.equal(model.sample_noise((BATCH, 4, 8), "cpu"), noise)  # a frame's next epoch draws anew
    assert 0 < float(time.min()) and float(time.max()) < 1  # LeRobot's Beta-distributed time
    for outside_a_run in ({}, {"index": whole["index"]}):  # no batch, or one no training loader made
        with draws.for_batch(outside_a_run):
            torch.manual_seed(5)
            outside = model.sample_noise((2, 4, 8), "cpu")  # LeRobot's own draw from the global RNG
        torch.manual_seed(5)
        assert torch.equal(outside, torch.normal(0.0, 1.0, (2, 4, 8)))


def test_quantile_normalisation_without_quantile_stats_is_one_clear_error() -> None:
    """π0.5 normalises state and action by quantiles by default; a dataset whose stats lack
    them is refused before anything is built, naming the flag that avoids them."""
    import numpy as np

    from lerobot_kit.api import ConfigError, DatasetMeta, FeatureSpec
    from lerobot_kit_lerobot.configuration import CONFIG_CLASSES
    from lerobot_kit_lerobot.modeling import check_quantile_stats

    features = {"observation.state": FeatureSpec("float32", (3,)), "action": FeatureSpec("float32", (3,))}
    plain = {name: np.zeros(3, np.float32) for name in ("mean", "std", "min", "max")}
    meta = DatasetMeta(features=features, stats={"observation.state": plain, "action": plain}, fps=10,
                       num_episodes=1, num_frames=10)
    config = CONFIG_CLASSES["pi05"]()
    with pytest.raises(ConfigError, match="normalises 'observation.state' by QUANTILES, which needs the dataset's "
                                          "q01/q99 stats, but its meta/stats.json has no q01/q99 for it"):
        check_quantile_stats(config, meta)
    quantiles = {**plain, "q01": np.zeros(3, np.float32), "q99": np.ones(3, np.float32)}
    check_quantile_stats(config, DatasetMeta(features=features, stats={"observation.state": quantiles,
                                                                        "action": quantiles}, fps=10,
                                             num_episodes=1, num_frames=10))


@pytest.mark.parametrize("kind", ["pi0", "pi05", "smolvla"])
def test_a_dataset_the_vla_would_fail_on_in_its_first_step_is_refused(kind: str) -> None:
    """Before LeRobot's constructor runs: no state; an action wider than LeRobot zero-pads it
    to; a state wider, for π0 and SmolVLA, which project it (π0.5 writes it into its prompt:
    any width goes)."""
    from lerobot_kit.api import ConfigError, DatasetMeta, FeatureSpec
    from lerobot_kit_lerobot.configuration import CONFIG_CLASSES
    from lerobot_kit_lerobot.modeling import LerobotPI0, LerobotPI05, LerobotSmolVLA

    def meta(state: int | None, action: int) -> DatasetMeta:
        features = {"observation.images.top": FeatureSpec("image", (3, 48, 64)),
                    "action": FeatureSpec("float32", (action,))}
        if state is not None:
            features["observation.state"] = FeatureSpec("float32", (state,))
        return DatasetMeta(features=features, stats={}, fps=10, num_episodes=1, num_frames=10)

    policy_class = {"pi0": LerobotPI0, "pi05": LerobotPI05, "smolvla": LerobotSmolVLA}[kind]
    config = CONFIG_CLASSES[kind](max_state_dim=4, max_action_dim=6)
    policy_class.check_dataset(config, meta(4, 6))
    with pytest.raises(ConfigError, match=rf"^policy.type=lerobot_{kind} cannot use this dataset .*: LeRobot's "
                                          rf"{kind} reads the robot's state \('observation.state'\) in every step"):
        policy_class.check_dataset(config, meta(None, 6))
    wide_action = (rf"^--policy.max_action_dim=6 is narrower than the dataset's 'action' \(7 values\): LeRobot's "
                   rf"{kind} zero-pads .*; set --policy.max_action_dim=7 or more$")
    with pytest.raises(ConfigError, match=wide_action):
        policy_class.check_dataset(config, meta(4, 7))
    if kind == "pi05":
        policy_class.check_dataset(config, meta(50, 6))
    else:
        with pytest.raises(ConfigError, match=r"^--policy.max_state_dim=4 is narrower .* set --policy.max_state_dim=5"):
            policy_class.check_dataset(config, meta(5, 6))


@pytest.mark.parametrize(("kind", "graphs"), [("pi0", 1), ("pi05", 1), ("smolvla", 2)])
def test_joint_layers_compile_to_one_graph_for_all_pairs(kind: str, graphs: int, vla_assets: Path) -> None:
    """What ``--accelerator.compile=true`` compiles of these policies is each pair's method; it
    reads nothing that differs from pair to pair, so all pairs share a graph (SmolVLA: one
    for its self-attention layers, one for its cross-attention layers)."""
    policy = lerobot_policy(kind, vla_assets)
    install(kind, policy)
    assert_pairs_compile_to(graphs, kind, policy, batch)
