"""ACT's ``state_dict`` shapes from its config and dataset features, without torch.

Mirrors ``modeling.ACTPolicy``'s modules name for name; ``tests/unit/test_policy_shapes.py``
holds this equal to a built model's ``state_dict`` for several configs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lerobot_kit.plugins.policies.shapes import (
    Shapes,
    attention,
    batch_norm,
    conv2d,
    embedding,
    feature_sizes,
    linear,
    norm,
)

if TYPE_CHECKING:
    from lerobot_kit.api import DatasetMeta
    from lerobot_kit.plugins.policies.act.configuration import ACTConfig

CONV_CHANNELS = 128  # modeling.ConvBackbone.out_channels
RESNET18_CHANNELS = 512


def act_shapes(config: ACTConfig, meta: DatasetMeta) -> Shapes:
    cameras, state, action = feature_sizes(meta, "ACT")
    dim = config.dim_model
    shapes: Shapes = {}
    if config.use_vae:
        shapes |= embedding("vae_cls_embed", 1, dim)
        if state:
            shapes |= linear("vae_state_proj", state, dim)
        shapes |= linear("vae_action_proj", action, dim)
        shapes |= _encoder("vae_encoder", config, config.n_vae_encoder_layers)
        shapes |= linear("vae_latent_head", dim, 2 * config.latent_dim)
    shapes |= linear("latent_proj", config.latent_dim, dim)
    if state:
        shapes |= linear("state_proj", state, dim)
    if cameras:
        backbone, channels = (
            (_conv_backbone(), CONV_CHANNELS) if config.vision_backbone == "conv" else (_resnet18(), RESNET18_CHANNELS)
        )
        shapes |= {f"backbone.{k}": v for k, v in backbone.items()}
        shapes |= conv2d("image_proj", channels, dim, 1)
    shapes |= embedding("encoder_1d_pos", 1 + bool(state), dim)
    shapes |= _encoder("encoder", config, config.n_encoder_layers)
    for i in range(config.n_decoder_layers):
        layer = f"decoder.layers.{i}"
        shapes |= attention(f"{layer}.self_attn", dim) | attention(f"{layer}.cross_attn", dim)
        shapes |= _feed_forward(f"{layer}.ffn", config)
        shapes |= norm(f"{layer}.norm1", dim) | norm(f"{layer}.norm2", dim) | norm(f"{layer}.norm3", dim)
    shapes |= norm("decoder.norm", dim)
    shapes |= embedding("query_pos", config.chunk_size, dim)
    shapes |= linear("action_head", dim, action)
    return shapes


def _encoder(name: str, config: ACTConfig, layers: int) -> Shapes:
    dim = config.dim_model
    shapes: Shapes = {}
    for i in range(layers):
        layer = f"{name}.layers.{i}"
        shapes |= attention(f"{layer}.self_attn", dim) | _feed_forward(f"{layer}.ffn", config)
        shapes |= norm(f"{layer}.norm1", dim) | norm(f"{layer}.norm2", dim)
    if config.pre_norm:
        shapes |= norm(f"{name}.norm", dim)
    return shapes


def _feed_forward(name: str, config: ACTConfig) -> Shapes:
    return linear(f"{name}.linear1", config.dim_model, config.dim_feedforward) | linear(
        f"{name}.linear2", config.dim_feedforward, config.dim_model
    )


def _conv_backbone() -> Shapes:
    """``modeling.ConvBackbone``: three conv + GroupNorm stages in ``net``."""
    return (
        conv2d("net.0", 3, 32, 5) | norm("net.1", 32)
        | conv2d("net.3", 32, 64, 3) | norm("net.4", 64)
        | conv2d("net.6", 64, CONV_CHANNELS, 3) | norm("net.7", CONV_CHANNELS)
    )


def _resnet18() -> Shapes:
    """torchvision's resnet18 up to its last residual stage, as ``nn.Sequential(children[:-2])``
    numbers it: 0 conv1, 1 bn1, 4..7 layer1..layer4 of two BasicBlocks each."""
    shapes = conv2d("0", 3, 64, 7, bias=False) | batch_norm("1", 64)
    in_planes = 64
    for stage, planes in enumerate((64, 128, 256, 512)):
        for block in range(2):
            name = f"{4 + stage}.{block}"
            shapes |= conv2d(f"{name}.conv1", in_planes, planes, 3, bias=False) | batch_norm(f"{name}.bn1", planes)
            shapes |= conv2d(f"{name}.conv2", planes, planes, 3, bias=False) | batch_norm(f"{name}.bn2", planes)
            if in_planes != planes:
                shapes |= conv2d(f"{name}.downsample.0", in_planes, planes, 1, bias=False)
                shapes |= batch_norm(f"{name}.downsample.1", planes)
            in_planes = planes
    return shapes
