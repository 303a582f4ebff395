"""Activation checkpointing per wrap unit, in one process: what it saves, that it changes no
number and no state-dict key, on the toy model and on ACT (dropout, VAE noise, image
backbone) with and without PEFT adapters. Multi-process layouts: test_parallelize_ranks.py."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lerobot_kit.core.config.schema import AcceleratorConfig, ParallelismConfig, PeftConfig
from lerobot_kit.core.model.policy import make_policy
from lerobot_kit.core.model.processor import make_processors
from lerobot_kit.core.parallel.activation_checkpointing import apply_activation_checkpointing, is_checkpointed
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.parallel.wrap_units import resolve_wrap_units
from lerobot_kit.plugins.datasets.reach.data import make_reach_dataset
from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig
from lerobot_kit.plugins.policies.act.configuration import ACTConfig
from toy_model import batch_for, make_model

BLOCKS = ["blocks.0", "blocks.1"]


def saved_tensor_bytes(model: nn.Module, *args: object) -> int:
    """Bytes autograd keeps from one forward for the backward."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*args)
    return total


def test_units_keep_less_and_compute_the_same() -> None:
    plain = make_model()
    checkpointed = copy.deepcopy(plain)
    keys = list(plain.state_dict())
    apply_activation_checkpointing(checkpointed, BLOCKS)
    assert [is_checkpointed(checkpointed.get_submodule(u)) for u in BLOCKS] == [True, True]
    assert list(checkpointed.state_dict()) == keys  # checkpoints load either way
    assert [n for n, _ in checkpointed.named_modules()] == [n for n, _ in plain.named_modules()]
    x, y = batch_for(0, 64)
    assert saved_tensor_bytes(checkpointed, x) < 0.6 * saved_tensor_bytes(plain, x)
    for model in (plain, checkpointed):
        F.mse_loss(model(x), y).backward()
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        assert torch.equal(a.grad, b.grad), name
    with torch.no_grad():  # evaluation runs through the checkpointed forward too
        assert torch.equal(plain(x), checkpointed(x))


def test_nested_units_are_checkpointed_once_and_twice_is_refused() -> None:
    model = make_model()
    apply_activation_checkpointing(model, ["blocks.0.fc1", "blocks.0"])
    assert is_checkpointed(model.blocks[0]) and not is_checkpointed(model.blocks[0].fc1)
    with pytest.raises(ValueError, match="'blocks.0' is already activation-checkpointed"):
        apply_activation_checkpointing(model, ["blocks.0"])


def _act_run(peft: bool, checkpoint: bool, tmp_path: Path) -> tuple[float, dict[str, torch.Tensor], list[str]]:
    """One forward/backward of ACT with dropout, VAE sampling and the image backbone on."""
    config = ACTConfig(dim_model=32, n_heads=4, dim_feedforward=64, n_encoder_layers=2, n_vae_encoder_layers=1,
                       latent_dim=8, chunk_size=6, n_action_steps=3, dropout=0.3)
    dataset = make_reach_dataset(ReachDatasetConfig(num_episodes=3, episode_length=20, image=True, image_size=16),
                                 config.delta_indices())
    pre, _ = make_processors(config, dataset.meta)
    batch = pre(torch.utils.data.default_collate([dataset[i] for i in (0, 9, 17, 19, 35)]))
    torch.manual_seed(0)
    model: nn.Module = make_policy(config, dataset.meta)
    if peft:
        from lerobot_kit.core.model.peft import wrap_policy

        model = wrap_policy(model, PeftConfig(method_type="LORA", r=2), tmp_path)  # type: ignore[arg-type]
    dims = ParallelDims.resolve(ParallelismConfig(), 1)
    accel = AcceleratorConfig(activation_checkpointing=checkpoint)
    wrap = resolve_wrap_units(model, dims, accel, ["ACTEncoderLayer", "ACTDecoderLayer"])
    if checkpoint:
        apply_activation_checkpointing(model, list(wrap.paths))
    torch.manual_seed(1)  # dropout and the VAE draw: the recomputation must replay the same draws
    loss, _ = model(batch)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    return loss.item(), grads, list(model.state_dict())


@pytest.mark.parametrize("peft", [False, True])
def test_act_numbers_and_keys_unchanged(peft: bool, tmp_path: Path) -> None:
    loss, grads, keys = _act_run(peft, False, tmp_path)
    loss_ac, grads_ac, keys_ac = _act_run(peft, True, tmp_path)
    assert keys_ac == keys
    assert loss_ac == loss
    assert grads_ac.keys() == grads.keys() and (any("lora_" in n for n in grads) == peft)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ac[name], grad, rtol=1e-6, atol=1e-7, msg=name)
