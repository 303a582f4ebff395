"""LeRobot's joint attention, run one FSDP unit at a time.

π0, π0.5 and SmolVLA run a vision-language model and an action expert side by side:
layer *i* of both attends jointly, and LeRobot computes it from outside the layers —
``compute_layer_complete`` (π0/π0.5) and the loop body of
``SmolVLMWithExpertModel.forward`` (SmolVLA) call each layer's norms and projections
directly, never ``layer.forward``. FSDP's hooks on a layer therefore never fire: sharded
by layer, the parameters would stay sharded while used; not sharded by layer, the whole
model is one unit, gathered at once.

So each pair (VLM layer *i*, expert layer *i*) becomes one unit group run by a method:
``install_*`` gives the VLM layer a ``joint_layer`` attribute that runs the pair (LeRobot's
own ``compute_layer_complete``; for SmolVLA LeRobot's own attention methods and the
rest of its loop body, restated below), and replaces the forward of LeRobot's
``*WithExpertModel`` for the training path (both streams, no cache) by a loop over those
methods; the other paths (inference's prefix fill and cached denoising) are LeRobot's
forward unchanged. ``fsdp_unit_groups`` then names each pair and ``joint_layer``:
lerobot-kit shards the pair as one unit and registers ``joint_layer`` as an FSDP forward
method, so calling it gathers both layers, frees them after, and reduces their
gradients once. The numbers are LeRobot's (tested equal to its forward).

``attention`` (``--policy.attention``) picks how a pair attends: ``eager``, LeRobot's own
attention code; ``sdpa``, the same attention through a fused kernel (``fused_attention``),
for which the forward converts LeRobot's mask once, into the additive mask every pair
reads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from lerobot_kit.api import UnitGroup
from lerobot_kit_lerobot.fused_attention import (
    SDPA, additive_mask, compute_dtype, pi_layer_function, smolvla_attention_interface,
)

JOINT_METHOD = "joint_layer"


# --- π0 / π0.5 -----------------------------------------------------------------------------


class PiJointLayer:
    """Pair *i* of a ``PaliGemmaWithExpertModel``, run by LeRobot's ``compute_layer_complete``."""

    def __init__(self, compute: Callable[..., Any], vlm: nn.Module, expert: nn.Module, rotary: nn.Module) -> None:
        self.compute, self.layers, self.rotary = compute, (vlm, expert), rotary

    def __call__(self, inputs_embeds: list[Tensor], attention_mask: Tensor, position_ids: Tensor,
                 adarms_cond: list[Tensor | None]) -> list[Tensor]:
        return self.compute(inputs_embeds, attention_mask, position_ids, adarms_cond, layers=self.layers,
                            rotary_emb=self.rotary)


def install_pi(with_expert: nn.Module, modeling: Any, *, attention: str) -> None:
    """Give each VLM layer of LeRobot's ``PaliGemmaWithExpertModel`` its pair's method, and
    the model a forward that calls them (``modeling``: LeRobot's modeling module)."""
    fused = attention == SDPA
    compute = pi_layer_function(modeling) if fused else modeling.compute_layer_complete
    language = with_expert.paligemma.model.language_model
    for vlm, expert in zip(language.layers, with_expert.gemma_expert.model.layers, strict=True):
        setattr(vlm, JOINT_METHOD, PiJointLayer(compute, vlm, expert, language.rotary_emb))
    with_expert.forward = functools.partial(_pi_forward, with_expert, with_expert.forward, modeling.layernorm_forward,
                                            fused)


def _pi_forward(model: nn.Module, lerobot_forward: Callable[..., Any], layernorm_forward: Callable[..., Any],
                fused: bool, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                past_key_values: Any = None, inputs_embeds: list[Tensor | None] | None = None,
                use_cache: bool | None = None, adarms_cond: list[Tensor | None] | None = None) -> Any:
    if inputs_embeds is None or inputs_embeds[0] is None or inputs_embeds[1] is None:
        return lerobot_forward(attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                               adarms_cond=adarms_cond)
    conditions = adarms_cond if adarms_cond is not None else [None, None]
    hidden = list(inputs_embeds)
    if fused:
        attention_mask = additive_mask(attention_mask, compute_dtype(hidden[0]))
    for layer in model.paligemma.model.language_model.layers:
        hidden = getattr(layer, JOINT_METHOD)(hidden, attention_mask, position_ids, conditions)
    norms = (model.paligemma.model.language_model.norm, model.gemma_expert.model.norm)
    outputs = [layernorm_forward(norm, h, cond)[0] for norm, h, cond in zip(norms, hidden, conditions)]
    return outputs, None


def pi_unit_groups(prefix: str, depth: int) -> list[UnitGroup]:
    """The pairs of a π0/π0.5 whose ``PaliGemmaWithExpertModel`` is at ``prefix``, and the
    modules that are units of their own by path: the token embedding (a fifth of π0.5's
    parameters after the VLM layers) and both language-model heads, which training never
    calls (so they are never gathered)."""
    language = f"{prefix}.paligemma.model.language_model"
    pairs = [UnitGroup((f"{language}.layers.{i}", f"{prefix}.gemma_expert.model.layers.{i}"), JOINT_METHOD)
             for i in range(depth)]
    singles = [f"{language}.embed_tokens", f"{prefix}.paligemma.lm_head", f"{prefix}.gemma_expert.lm_head"]
    return [*pairs, *(UnitGroup((path,)) for path in singles)]


# --- SmolVLA -------------------------------------------------------------------------------


class SmolJointLayer:
    """Layer *i* of a ``SmolVLMWithExpertModel``: the VLM layer and, when the expert has a
    layer at *i*, that one; attention by LeRobot's own ``forward_attn_layer`` /
    ``forward_cross_attn_layer``, then each stream's output projection, residual, norm and
    MLP as LeRobot's loop body computes them.

    LeRobot's attention methods take every layer and an index; they get this pair alone
    at index 0, and whether the layer attends to itself is settled here once: the method
    reads nothing that differs from layer to layer, so ``torch.compile`` makes one graph
    for all pairs (one per attention kind) instead of one per layer."""

    def __init__(self, model: nn.Module, vlm: nn.Module, expert: nn.Module | None, self_attention: bool) -> None:
        self.model, self.self_attention = model, self_attention
        self.model_layers = [[vlm], [expert]]

    def __call__(self, inputs_embeds: list[Tensor], attention_mask: Tensor, position_ids: Tensor,
                 batch_size: int, head_dim: int) -> list[Tensor]:
        model = self.model
        attend = model.forward_attn_layer if self.self_attention else model.forward_cross_attn_layer
        attended, _ = attend(self.model_layers, inputs_embeds, 0, position_ids, attention_mask, batch_size, head_dim,
                             use_cache=False, past_key_values=None)
        outputs, start = [], 0
        for stream, ((layer,), hidden) in enumerate(zip(self.model_layers, inputs_embeds)):
            if layer is None:  # the expert has no layer here: its stream passes through
                outputs.append(hidden)
                continue
            # One attention output for both streams (self-attention), sliced by position; one each (cross).
            joint = len(attended) == 1
            output = attended[0] if joint else attended[stream]
            end = start + hidden.shape[1]
            output = output[:, start:end] if joint else output[:, : hidden.shape[1]]
            weight = layer.self_attn.o_proj.weight
            residual = layer.self_attn.o_proj(output.to(weight.dtype)) + hidden
            outputs.append(layer.mlp(layer.post_attention_layernorm(residual)) + residual)
            start = end if joint else 0
        return outputs


def install_smolvla(with_expert: nn.Module, *, attention: str) -> None:
    """Give each VLM layer of LeRobot's ``SmolVLMWithExpertModel`` its method (the layers
    paired, and the kinds of attention, as LeRobot's forward has them), and the model a
    forward that calls them. The fused attention is the model's attention interface, so
    its cached inference (LeRobot's forward) attends through it too."""
    vlm_layers, expert_layers = with_expert.get_model_layers([with_expert.get_vlm_model().text_model,
                                                             with_expert.lm_expert])
    every = with_expert.self_attn_every_n_layers
    for index, (vlm, expert) in enumerate(zip(vlm_layers, expert_layers, strict=True)):
        self_attention = "cross" not in with_expert.attention_mode or (every > 0 and index % every == 0)
        setattr(vlm, JOINT_METHOD, SmolJointLayer(with_expert, vlm, expert, self_attention))
    fused = attention == SDPA
    if fused:
        with_expert.get_attention_interface = smolvla_attention_interface
    with_expert.forward = functools.partial(_smolvla_forward, with_expert, with_expert.forward, fused)


def _smolvla_forward(model: nn.Module, lerobot_forward: Callable[..., Any], fused: bool,
                     attention_mask: Tensor | None = None,
                     position_ids: Tensor | None = None, past_key_values: Any = None,
                     inputs_embeds: list[Tensor | None] | None = None, use_cache: bool | None = None) -> Any:
    if use_cache or past_key_values is not None or inputs_embeds is None or any(h is None for h in inputs_embeds):
        return lerobot_forward(attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache)
    towers = [model.get_vlm_model().text_model, model.lm_expert]
    head_dim = model.vlm.config.text_config.head_dim
    hidden = list(inputs_embeds)
    if fused:
        attention_mask = additive_mask(attention_mask, compute_dtype(hidden[0]))
    for layer in towers[0].layers:
        hidden = getattr(layer, JOINT_METHOD)(hidden, attention_mask, position_ids, batch_size=hidden[0].shape[0],
                                              head_dim=head_dim)
    return [tower.norm(h) for tower, h in zip(towers, hidden)], None


def smolvla_unit_groups(prefix: str, model: nn.Module) -> list[UnitGroup]:
    """Each VLM layer with the expert layer that attends with it (the expert may have fewer
    layers: then some VLM layers run alone), by LeRobot's own pairing; the token embedding
    and the language-model head as units by path."""
    towers = [model.get_vlm_model().text_model, model.lm_expert]
    vlm_layers, expert_layers = model.get_model_layers(towers)
    path_of = {id(m): f"{prefix}.{path}" for path, m in model.named_modules()}
    groups = [
        UnitGroup((path_of[id(vlm)], *((path_of[id(expert)],) if expert is not None else ())), JOINT_METHOD)
        for vlm, expert in zip(vlm_layers, expert_layers)
    ]
    embed = towers[0].get_input_embeddings()
    return [*groups, UnitGroup((path_of[id(embed)],)), UnitGroup((path_of[id(model.vlm.lm_head)],))]
