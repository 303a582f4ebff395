"""The check that the joint layers' methods compile to a few graphs shared by all pairs, for
LeRobot's eager attention (``test_vla_joint``) and the fused one (``test_fused_attention``)
alike: compiling once per layer would pass torch's recompile limit at LeRobot's depths."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._dynamo.utils import counters

from lerobot_kit_lerobot import joint
from lerobot_kit_lerobot.vla_loss import flow_matching_loss


def joint_layers(kind: str, policy: torch.nn.Module) -> list[torch.nn.Module]:
    """The VLM's decoder layers, each of which carries a pair's joint method."""
    if kind == "smolvla":
        return list(policy.model.vlm_with_expert.get_vlm_model().text_model.layers)
    return list(policy.model.paligemma_with_expert.paligemma.model.language_model.layers)


def assert_pairs_compile_to(graphs: int, kind: str, policy: torch.nn.Module,
                            batch: Callable[[], dict[str, torch.Tensor]]) -> None:
    """Every pair's method compiled (dynamo's own tracing, backend "eager": inductor's kernels
    are the real runs' concern) gives the uncompiled loss on ``batch()`` through ``graphs``
    graphs in all, without a graph break. ``policy`` has the joint layers installed."""
    torch.manual_seed(5)  # the same noise and time draws for both losses
    eager, _ = flow_matching_loss(policy, batch())
    torch._dynamo.reset()
    counters.clear()
    for layer in joint_layers(kind, policy):
        setattr(layer, joint.JOINT_METHOD, torch.compile(getattr(layer, joint.JOINT_METHOD), backend="eager"))
    torch.manual_seed(5)
    torch.testing.assert_close(flow_matching_loss(policy, batch())[0], eager, rtol=0, atol=0)
    assert counters["stats"]["unique_graphs"] == graphs, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
