"""Diffusion Policy's ``state_dict`` shapes from its config and dataset features, without torch.

Mirrors ``modeling.DiffusionPolicy``'s modules name for name; ``tests/unit/test_policy_shapes.py``
holds this equal to a built model's ``state_dict`` for several configs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lerobot_kit.plugins.policies.shapes import Shapes, attention, conv2d, feature_sizes, linear, norm

if TYPE_CHECKING:
    from lerobot_kit.api import DatasetMeta
    from lerobot_kit.plugins.policies.diffusion.configuration import DiffusionConfig


def diffusion_shapes(config: DiffusionConfig, meta: DatasetMeta) -> Shapes:
    cameras, state, action = feature_sizes(meta, "diffusion")
    dim, ff = config.dim_model, config.dim_feedforward
    shapes: Shapes = {}
    if state:
        shapes |= linear("state_proj", state, dim)
    if cameras:
        keypoints = config.image_keypoints
        shapes |= (
            conv2d("image_encoder.net.0", 3, 32, 3) | norm("image_encoder.net.1", 32)
            | conv2d("image_encoder.net.3", 32, 64, 3) | norm("image_encoder.net.4", 64)
            | conv2d("image_encoder.net.6", 64, 64, 3) | norm("image_encoder.net.7", 64)
            | conv2d("image_encoder.pool.keypoint_conv", 64, keypoints, 1)
            | linear("image_encoder.out", 2 * keypoints, dim)
        )
    shapes |= linear("time_mlp.0", dim, 4 * dim) | linear("time_mlp.2", 4 * dim, dim)
    shapes["cond_pos"] = (1 + config.n_obs_steps * ((1 if state else 0) + len(cameras)), dim)
    shapes |= linear("cond_encoder.0", dim, 4 * dim) | linear("cond_encoder.2", 4 * dim, dim)
    shapes |= norm("cond_norm", dim)
    shapes |= linear("action_in", action, dim)
    shapes["action_pos"] = (config.horizon, dim)
    for i in range(config.n_layers):
        block = f"blocks.{i}"
        shapes |= attention(f"{block}.self_attn", dim) | attention(f"{block}.cross_attn", dim)
        shapes |= linear(f"{block}.linear1", dim, ff) | linear(f"{block}.linear2", ff, dim)
        shapes |= norm(f"{block}.norm1", dim) | norm(f"{block}.norm2", dim) | norm(f"{block}.norm3", dim)
    shapes |= norm("final_norm", dim)
    shapes |= linear("action_head", dim, action)
    return shapes
