"""``--policy.attention=sdpa`` (the default): the joint layers of π0, π0.5 and SmolVLA attend
through torch's fused ``scaled_dot_product_attention`` and compute what LeRobot's own
eager attention computes: the loss, every gradient and a predicted action chunk, in fp32
(to float rounding) and under bf16 autocast (to bf16 rounding), on LeRobot's classes at
the tests' reduced sizes; no score matrix is materialised. ``eager`` is LeRobot's code
itself (``test_vla_joint``). The run-based checks (a fused run LeRobot loads and acts
with; a resume that switches to eager) are in ``test_vla.py``."""

from __future__ import annotations

import contextlib
import types
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from lerobot.policies.smolvla.smolvlm_with_expert import SmolVLMWithExpertModel
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.models.gemma import modeling_gemma

from conftest import PI_SIZES
from joint_compile import assert_pairs_compile_to, joint_layers
from lerobot_kit_lerobot import fused_attention, joint
from lerobot_kit_lerobot.bridge_fields import PiSizes
from lerobot_kit_lerobot.configuration import CONFIG_CLASSES
from lerobot_kit_lerobot.fused_attention import additive_mask, gemma_attention, smolvla_attention
from lerobot_kit_lerobot.modeling import LerobotPI05, LerobotSmolVLA
from lerobot_kit_lerobot.pi_overrides import modeling_module
from test_mixture import meta
from test_vla_joint import batch, install, lerobot_policy

KINDS = ["pi0", "pi05", "smolvla"]
TINY = {"chunk_size": 4, "n_action_steps": 4, "max_state_dim": 8, "max_action_dim": 8, "tokenizer_max_length": 12}


def attention_inputs(heads: int = 6, kv_heads: int = 2, tokens: int = 9, dim: int = 8) -> tuple[torch.Tensor, ...]:
    """Queries [2, heads, tokens, dim], grouped keys and values, and a prefix-LM mask with
    padding: sample 1's last two tokens are padding, so their rows attend to nothing."""
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, heads, tokens, dim, generator=gen)
    key, value = (torch.randn(2, kv_heads, tokens, dim, generator=gen) for _ in range(2))
    valid = torch.ones(2, tokens, dtype=torch.bool)
    valid[1, -2:] = False
    blocks = torch.tensor([0] * 5 + [1] + [0] * (tokens - 6)).expand(2, tokens)  # a prefix, then one causal block
    cumulative = blocks.cumsum(1)
    mask = (cumulative[:, None, :] <= cumulative[:, :, None]) & valid[:, None, :] & valid[:, :, None]
    return query, key, value, mask


def test_fused_attention_is_lerobots_eager_attention() -> None:
    """Against LeRobot's own attention functions, rows that attend to nothing included (LeRobot
    averages every key there, and so does the fused path): transformers' Gemma eager attention
    (π0/π0.5) with LeRobot's additive mask, SmolVLA's with its boolean one."""
    query, key, value, mask = attention_inputs()
    assert not mask[1, -1].any()
    openpi = torch.where(mask[:, None], 0.0, -2.3819763e38)  # LeRobot's prepare_attention_masks_4d
    gemma = types.SimpleNamespace(num_key_value_groups=3, training=True)
    expected, _ = modeling_gemma.eager_attention_forward(gemma, query, key, value, openpi, 0.3)
    fused, weights = gemma_attention(gemma, query, key, value, additive_mask(openpi, torch.float32), 0.3)
    assert weights is None
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-6)

    smolvla = types.SimpleNamespace(num_attention_heads=6, num_key_value_heads=2)
    states = [t.transpose(1, 2) for t in (query, key, value)]  # SmolVLA's [batch, tokens, heads, dim]
    expected = SmolVLMWithExpertModel.eager_attention_forward(smolvla, mask, 2, 8, *states)
    for given in (mask, additive_mask(mask, torch.float32)):  # LeRobot's mask, and the one the forward makes
        torch.testing.assert_close(smolvla_attention(given, 2, 8, *states), expected, rtol=1e-5, atol=1e-6)
    # Heads repeated before the kernel (what a GPU runs), as grouped (the CPU's): the same.
    repeated = fused_attention.sdpa(query, key, value, additive_mask(openpi, torch.float32), 0.3, grouped=False)
    torch.testing.assert_close(repeated.transpose(1, 2), fused, rtol=1e-5, atol=1e-6)
    # π0's mask value overflows fp16; the converted mask keeps finite values and LeRobot's average.
    half = additive_mask(openpi, torch.float16)
    assert half.dtype == torch.float16 and half.isfinite().all() and half.min() == torch.finfo(torch.float16).min


class OpCounts(TorchDispatchMode):
    """How often each aten op runs (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, tensor_types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    def count(self, *names: str) -> int:
        return sum(self.counts.get(name, 0) for name in names)


def joint_attention_calls(kind: str, policy: torch.nn.Module) -> int:
    """Attention calls of one training forward's joint layers (SmolVLA's cross-attention
    layers attend twice: the VLM over its prefix, the expert over the prefix's keys)."""
    if kind != "smolvla":
        return len(joint_layers(kind, policy))
    return sum(1 if getattr(layer, joint.JOINT_METHOD).self_attention else 2 for layer in joint_layers(kind, policy))


def step(policy: torch.nn.Module, bf16: bool = False, ops: OpCounts | None = None) -> tuple[torch.Tensor, dict]:
    """LeRobot's forward and backward on the tests' batch (the same noise and time each call)."""
    policy.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16), ops or contextlib.nullcontext():
        loss, _ = policy.forward(batch())
        loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in policy.named_parameters() if p.grad is not None}


def predicted_chunk(policy: torch.nn.Module) -> torch.Tensor:
    policy.eval()
    torch.manual_seed(3)  # the same initial noise
    chunk = policy.predict_action_chunk(batch())
    policy.train()
    return chunk


@pytest.mark.parametrize(("kind", "whole"), [("pi0", False), ("pi05", True), ("smolvla", True)])
def test_the_fused_path_computes_lerobots_loss_gradients_and_actions(kind: str, whole: bool, vla_assets: Path) -> None:
    """LeRobot's policy as LeRobot runs it, then with the bridge's fused joint layers, on the
    same weights, batch and draws. fp32: the loss and every gradient to float rounding (a
    gradient that is zero in exact arithmetic, such as a key bias's, is rounding noise of
    ~1e-9 either way: hence an absolute tolerance scaled by the largest gradient); bf16
    autocast: the loss to bf16 rounding and the gradients' direction. The predicted chunk is
    the same (SmolVLA's cached inference attends through the fused path too; π0/π0.5's is
    LeRobot's). In the fused step each joint attention is one fused kernel call, forward and
    backward, where LeRobot's is a softmax over a score matrix: the fused step has none. π0
    runs π0.5's joint-layer code (LeRobot's ``compute_layer_complete`` is the same function
    in both), so its bf16 and inference checks are π0.5's (``whole``)."""
    policy = lerobot_policy(kind, vla_assets)
    lerobot_ops, fused_ops = OpCounts(), OpCounts()

    def run_all(ops: OpCounts) -> dict:
        fp32 = step(policy, ops=ops)
        return {"fp32": fp32, **({"bf16": step(policy, bf16=True), "chunk": predicted_chunk(policy)} if whole else {})}

    lerobot = run_all(lerobot_ops)
    install(kind, policy, attention="sdpa")
    fused = run_all(fused_ops)

    (loss, grads), (fused_loss, fused_grads) = lerobot["fp32"], fused["fp32"]
    torch.testing.assert_close(fused_loss, loss, rtol=1e-6, atol=0)
    assert fused_grads.keys() == grads.keys() and len(grads) > 40
    scale = max(float(g.abs().max()) for g in grads.values())
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-6 * scale, msg=name)

    if whole:
        (loss, grads), (fused_loss, fused_grads) = lerobot["bf16"], fused["bf16"]
        torch.testing.assert_close(fused_loss, loss, rtol=1e-2, atol=0)
        flat, fused_flat = (torch.cat([g[name].flatten() for name in grads]) for g in (grads, fused_grads))
        assert torch.nn.functional.cosine_similarity(flat, fused_flat, dim=0) > 0.999
        torch.testing.assert_close(fused["chunk"], lerobot["chunk"], rtol=1e-5, atol=1e-6)

    # LeRobot's eager joint attention is the step's only softmax (the vision tower's attention
    # is transformers' SDPA already); the fused step has none, a fused kernel call instead.
    assert lerobot_ops.count("_softmax") == joint_attention_calls(kind, policy)
    assert fused_ops.count("_softmax", "_softmax_backward_data") == 0
    kernel = "_scaled_dot_product_flash_attention_for_cpu"
    assert fused_ops.count(kernel) == lerobot_ops.count(kernel) + lerobot_ops.count("_softmax")
    assert fused_ops.count(f"{kernel}_backward") == (lerobot_ops.count(f"{kernel}_backward")
                                                     + lerobot_ops.count("_softmax_backward_data"))


@pytest.mark.parametrize(("kind", "graphs"), [("pi05", 1), ("smolvla", 2)])
def test_fused_joint_layers_compile_to_one_graph_for_all_pairs(kind: str, graphs: int, vla_assets: Path) -> None:
    """``--accelerator.compile=true`` on the fused path: still one graph for all pairs (SmolVLA:
    one per attention kind), no graph break, the uncompiled loss (dynamo's own tracing)."""
    policy = lerobot_policy(kind, vla_assets)
    install(kind, policy, attention="sdpa")
    assert_pairs_compile_to(graphs, kind, policy, batch)


def test_the_flag_picks_the_attention_and_may_change_on_resume(vla_assets: Path) -> None:
    """``--policy.attention``: sdpa by default, eager LeRobot's own functions; anything else is
    refused; a resume may change it (it changes no weight)."""
    for lerobot_type in KINDS:
        config_class = CONFIG_CLASSES[lerobot_type]
        assert config_class().attention == "sdpa" and "attention" in config_class.resume_may_change
        with pytest.raises(ValidationError, match="attention"):
            config_class(attention="flash")
    smolvla_flags = {**TINY, "vlm_model_name": str(vla_assets / "smolvlm"), "num_vlm_layers": 4,
                     "resize_imgs_with_padding": (64, 64), "expert_width_multiplier": 0.5}
    pi05_flags = {**TINY, "image_resolution": (64, 64), "sizes": PiSizes.model_validate_json(PI_SIZES)}
    for attention in ("sdpa", "eager"):
        smolvla = LerobotSmolVLA(CONFIG_CLASSES["smolvla"](**smolvla_flags, attention=attention), meta())
        interface = smolvla.model.vlm_with_expert.get_attention_interface()
        assert (interface is fused_attention.smolvla_attention) == (attention == "sdpa")
        pi = LerobotPI05(CONFIG_CLASSES["pi05"](**pi05_flags, attention=attention), meta())
        compute = getattr(joint_layers("pi05", pi)[0], joint.JOINT_METHOD).compute
        assert (compute is modeling_module("pi05").compute_layer_complete) == (attention == "eager")
