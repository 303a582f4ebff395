"""``--policy.attention=sdpa``: the joint attention of π0, π0.5 and SmolVLA through
``torch.nn.functional.scaled_dot_product_attention`` instead of LeRobot's eager code.

LeRobot's eager attention (transformers' ``eager_attention_forward`` for π0/π0.5, its own
``SmolVLMWithExpertModel.eager_attention_forward`` for SmolVLA) repeats the key/value heads
to every query head, writes the whole score matrix, adds the mask to it and takes an fp32
softmax: per layer several tensors of batch × heads × tokens² floats, kept for the
backward. At LeRobot's sequence lengths (π0.5: three 224×224 cameras, 768 image tokens,
a 200-token prompt and 50 actions) those dominate a step's memory and much of its time.
A fused kernel (flash attention on CPU and on a GPU without a mask, memory-efficient
attention with one) computes the same softmax block by block and keeps only its output
and the log-sum-exp per row.

What it computes is LeRobot's attention, on the same weights: the same scale, the key/value
heads grouped as LeRobot repeats them (query head *h* reads key/value head
*h* // groups, ``enable_gqa``), and LeRobot's mask as an additive mask in the compute dtype:
0 where a token may attend, the dtype's lowest finite value where not. A finite value
keeps LeRobot's result on rows that attend to nothing (a padding token's: an even
average over every key, where a boolean mask would give zeros or NaN), so the hidden
states of padded positions are LeRobot's too. The mask is converted once per forward,
not per layer (``additive_mask``).

π0/π0.5 run LeRobot's own ``compute_layer_complete`` rebound to this attention
(``pi_layer_function``); SmolVLA's model is given this attention as its attention
interface (``smolvla_attention``), which its training layers and its cached inference
both call. π0/π0.5's inference stays LeRobot's: its prefix fill and denoising run
transformers' Gemma layers, which LeRobot sets to eager attention itself.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lerobot_kit.api import PluginError

SDPA = "sdpa"


def compute_dtype(hidden: Tensor) -> torch.dtype:
    """The dtype the attention will compute in: autocast's when it is on for the tensor's
    device, else the hidden states' own."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """LeRobot's mask (SmolVLA's boolean, True where a token may attend; π0's additive, 0 or
    a large negative) as an additive mask in ``dtype``: 0 or ``dtype``'s lowest finite value
    (π0's -2.38e38 would be -inf in fp16, and a row of -inf has no softmax)."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
    if mask.dtype == dtype:
        return mask
    return mask.clamp(min=torch.finfo(dtype).min).to(dtype)


def attend(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scale: float) -> Tensor:
    """Softmax attention of ``query`` [batch, heads, tokens, dim] over ``key``/``value``
    [batch, kv_heads, keys, dim] with ``mask`` (broadcast to [batch, heads, tokens, keys]).

    Grouped heads go to the kernel as they are on the CPU (its flash kernel reads them
    grouped, mask and all); elsewhere the keys and values are repeated to every head first:
    a GPU's kernels that take a mask (memory-efficient attention, cuDNN) do not group heads,
    and torch, given ``enable_gqa`` and a mask, falls back to its unfused math kernel, the
    score matrix this path avoids. The repeat costs keys × dim per head, not tokens × keys
    as the scores would."""
    return sdpa(query, key, value, mask, scale, grouped=query.device.type == "cpu")


def sdpa(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scale: float, *, grouped: bool) -> Tensor:
    """``attend`` with the grouped heads handed to the kernel (``grouped``) or repeated first."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and not grouped:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    mask = mask if mask.dtype == query.dtype else additive_mask(mask, query.dtype)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale,
                                          enable_gqa=key.shape[1] != query.shape[1])


# --- π0 / π0.5 -----------------------------------------------------------------------------


def gemma_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor,
                    scaling: float, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' ``eager_attention_forward`` of Gemma, fused: what LeRobot's
    ``compute_layer_complete`` calls it with and gets back ([batch, tokens, heads, dim]; no
    attention weights). LeRobot's joint layers call it without dropout."""
    if dropout:
        raise PluginError("--policy.attention=sdpa: LeRobot's joint attention asked for dropout, which the fused "
                          "path does not apply; use --policy.attention=eager")
    return attend(query, key, value, attention_mask, scaling).transpose(1, 2).contiguous(), None


def pi_layer_function(modeling: types.ModuleType) -> Callable[..., Any]:
    """LeRobot's own ``compute_layer_complete`` of ``modeling`` (π0's or π0.5's module), its
    attention call bound to ``gemma_attention``: the same function (norms, projections,
    rotary embedding, gated residuals, MLP), whose global ``modeling_gemma`` is, for it
    alone, a copy of transformers' module with this attention in the place of its eager one."""
    layer = modeling.compute_layer_complete
    gemma = layer.__globals__.get("modeling_gemma")
    if not {"modeling_gemma", "eager_attention_forward"} <= set(layer.__code__.co_names) or gemma is None:
        raise PluginError(
            f"--policy.attention=sdpa: the installed LeRobot's {modeling.__name__}.compute_layer_complete no longer "
            "calls transformers' Gemma eager attention, which the fused path replaces; use --policy.attention=eager"
        )
    fused_gemma = types.ModuleType(gemma.__name__)
    fused_gemma.__dict__.update(gemma.__dict__)
    fused_gemma.eager_attention_forward = gemma_attention
    bound = types.FunctionType(layer.__code__, {**layer.__globals__, "modeling_gemma": fused_gemma}, layer.__name__,
                               layer.__defaults__, layer.__closure__)
    bound.__kwdefaults__ = layer.__kwdefaults__
    bound.__qualname__ = f"{layer.__qualname__} (fused attention)"
    return bound


# --- SmolVLA -------------------------------------------------------------------------------


def smolvla_attention(attention_mask: Tensor, batch_size: int, head_dim: int, query_states: Tensor,
                      key_states: Tensor, value_states: Tensor) -> Tensor:
    """``SmolVLMWithExpertModel.eager_attention_forward``, fused: the same arguments (states
    [batch, tokens, heads, dim], LeRobot's boolean mask [batch, tokens, keys] or the additive
    one the bridge's forward made of it) and result ([batch, tokens, heads × dim])."""
    query, key, value = (states.transpose(1, 2) for states in (query_states, key_states, value_states))
    output = attend(query, key, value, attention_mask[:, None], head_dim**-0.5)
    return output.transpose(1, 2).reshape(batch_size, -1, output.shape[1] * head_dim)


def smolvla_attention_interface() -> Callable[..., Tensor]:
    """What ``SmolVLMWithExpertModel.get_attention_interface`` returns under the fused path."""
    return smolvla_attention
