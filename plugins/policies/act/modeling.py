"""ACT: the action-chunking transformer of Zhao et al. 2023 ("Learning Fine-Grained
Bimanual Manipulation with Low-Cost Hardware"), as LeRobot ships it, written here from
the paper's description.

Training: a CVAE encoder reads [CLS, state, action chunk] and yields a latent "style"
variable; the main encoder reads [latent, state, image feature-map tokens]; a decoder of
``chunk_size`` learned queries cross-attends to it and a linear head emits the chunk.
Loss = masked L1 + kl_weight * KL. Inference: latent = 0 (the prior's mean), and the
chunk is executed ``n_action_steps`` at a time from a queue.

FSDP2: the wrap units are ``ACTEncoderLayer`` and ``ACTDecoderLayer``. No parameter is
shared between them, every layer is entered through ``__call__`` (so FSDP's hooks
gather its shard), and positional tables are computed in ``forward`` rather than held
as buffers, so a meta-device build needs only ``to_empty`` + ``init_weights``.
Attention (``plugins.policies.attention``) uses separate q/k/v/out ``nn.Linear``
projections so LoRA can target them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import torch
from torch import Tensor, nn

from lerobot_kit.api import (
    ACTION_KEY,
    PER_SAMPLE_LOSS,
    STATE_KEY,
    ConfigError,
    DatasetMeta,
    Policy,
    feature_dims,
    pad_key,
)
from lerobot_kit.plugins.policies.act.configuration import ACTConfig
from lerobot_kit.plugins.policies.attention import MultiHeadAttention

ACTION_PAD_KEY = pad_key(ACTION_KEY)


def _sincos(positions: Tensor, dim: int) -> Tensor:
    """[n] -> [n, dim]: interleaved sin/cos of the positions at geometric frequencies (Vaswani et al.)."""
    freq = torch.exp(
        torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) * (-math.log(10000.0) / dim)
    )
    angles = positions.float()[:, None] * freq
    return torch.stack([angles.sin(), angles.cos()], dim=2).flatten(1)[:, :dim]


def sinusoid_1d(length: int, dim: int, device: torch.device) -> Tensor:
    """Fixed table [length, dim] for the CVAE encoder's token positions."""
    return _sincos(torch.arange(length, device=device), dim)


def sinusoid_2d(height: int, width: int, dim: int, device: torch.device) -> Tensor:
    """Table [height*width, dim] of a feature map (row-major): half the channels encode y, half x.

    Uses raw cell indices (DETR's un-normalised variant), which keeps the cells of the
    small feature maps of low-resolution cameras clearly apart.
    """
    half = dim // 2
    y = _sincos(torch.arange(height, device=device), half)
    x = _sincos(torch.arange(width, device=device), dim - half)
    grid = torch.cat([y[:, None].expand(height, width, half), x[None, :].expand(height, width, dim - half)], dim=2)
    return grid.reshape(height * width, dim)


class _FeedForward(nn.Module):
    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.linear1 = nn.Linear(config.dim_model, config.dim_feedforward)
        self.linear2 = nn.Linear(config.dim_feedforward, config.dim_model)
        self.dropout = nn.Dropout(config.dropout)
        self.activation = nn.ReLU() if config.feedforward_activation == "relu" else nn.GELU()

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


def _residual(
    x: Tensor, sublayer: Callable[[Tensor], Tensor], norm: nn.Module, dropout: nn.Module, pre_norm: bool
) -> Tensor:
    """One residual sub-block: ``x + dropout(sublayer(norm(x)))`` (pre-norm), or
    ``norm(x + dropout(sublayer(x)))`` (post-norm, the original transformer's)."""
    if pre_norm:
        return x + dropout(sublayer(norm(x)))
    return norm(x + dropout(sublayer(x)))


class ACTEncoderLayer(nn.Module):
    """Self-attention + feed-forward; positions are added to queries and keys (DETR style)."""

    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.pre_norm = config.pre_norm
        self.self_attn = MultiHeadAttention(config.dim_model, config.n_heads, config.dropout)
        self.ffn = _FeedForward(config)
        self.norm1 = nn.LayerNorm(config.dim_model)
        self.norm2 = nn.LayerNorm(config.dim_model)
        self.dropout1 = nn.Dropout(config.dropout)
        self.dropout2 = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, pos: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        def attend(h: Tensor) -> Tensor:
            return self.self_attn(h + pos, h + pos, h, key_padding_mask)

        x = _residual(x, attend, self.norm1, self.dropout1, self.pre_norm)
        return _residual(x, self.ffn, self.norm2, self.dropout2, self.pre_norm)


class ACTDecoderLayer(nn.Module):
    """Self-attention over the queries, cross-attention to the encoder memory, feed-forward."""

    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.pre_norm = config.pre_norm
        self.self_attn = MultiHeadAttention(config.dim_model, config.n_heads, config.dropout)
        self.cross_attn = MultiHeadAttention(config.dim_model, config.n_heads, config.dropout)
        self.ffn = _FeedForward(config)
        self.norm1 = nn.LayerNorm(config.dim_model)
        self.norm2 = nn.LayerNorm(config.dim_model)
        self.norm3 = nn.LayerNorm(config.dim_model)
        self.dropout1 = nn.Dropout(config.dropout)
        self.dropout2 = nn.Dropout(config.dropout)
        self.dropout3 = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, memory: Tensor, query_pos: Tensor, memory_pos: Tensor) -> Tensor:
        def attend_self(h: Tensor) -> Tensor:
            return self.self_attn(h + query_pos, h + query_pos, h)

        def attend_memory(h: Tensor) -> Tensor:
            return self.cross_attn(h + query_pos, memory + memory_pos, memory)

        x = _residual(x, attend_self, self.norm1, self.dropout1, self.pre_norm)
        x = _residual(x, attend_memory, self.norm2, self.dropout2, self.pre_norm)
        return _residual(x, self.ffn, self.norm3, self.dropout3, self.pre_norm)


class ACTEncoder(nn.Module):
    def __init__(self, config: ACTConfig, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ACTEncoderLayer(config) for _ in range(num_layers))
        self.norm = nn.LayerNorm(config.dim_model) if config.pre_norm else nn.Identity()

    def forward(self, x: Tensor, pos: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, pos, key_padding_mask)
        return self.norm(x)


class ACTDecoder(nn.Module):
    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ACTDecoderLayer(config) for _ in range(config.n_decoder_layers))
        self.norm = nn.LayerNorm(config.dim_model)

    def forward(self, x: Tensor, memory: Tensor, query_pos: Tensor, memory_pos: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, memory, query_pos, memory_pos)
        return self.norm(x)


class ConvBackbone(nn.Module):
    """A small stride-8 conv net: [B,3,H,W] -> [B,128,H/8,W/8]. GroupNorm, so no running-stat buffers."""

    out_channels = 128

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 5, stride=2, padding=2),
            nn.GroupNorm(8, 32),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1),
            nn.GroupNorm(8, 64),
            nn.ReLU(),
            nn.Conv2d(64, self.out_channels, 3, stride=2, padding=1),
            nn.GroupNorm(8, self.out_channels),
            nn.ReLU(),
        )

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)


def _make_backbone(name: str) -> tuple[nn.Module, int]:
    if name == "conv":
        return ConvBackbone(), ConvBackbone.out_channels
    try:
        import torchvision
    except ImportError as exc:
        raise ConfigError(
            "policy.vision_backbone=resnet18 needs torchvision: pip install torchvision "
            "(or the lerobot-kit[vision] extra), or use --policy.vision_backbone=conv"
        ) from exc
    # Randomly initialised (no weight download); everything up to the last residual stage.
    resnet = torchvision.models.resnet18(weights=None)
    return nn.Sequential(*list(resnet.children())[:-2]), 512


class ACTPolicy(Policy):
    config_class = ACTConfig
    _fsdp_wrap_modules = ["ACTEncoderLayer", "ACTDecoderLayer"]
    # Every attention and feed-forward projection except the first decoder layer's
    # self-attention value projection: the decoder starts from all-zero queries, so that
    # projection only ever sees zeros and an adapter there could never learn.
    default_peft_targets = r"(?!decoder\.layers\.0\.self_attn\.v_proj$).*\.(q_proj|k_proj|v_proj|out_proj|linear1|linear2)"
    config: ACTConfig

    def __init__(self, config: ACTConfig, meta: DatasetMeta) -> None:
        entry_rng = torch.get_rng_state()
        super().__init__(config, meta)
        self.image_keys, self.state_dim, self.action_dim = feature_dims(meta, "ACT")
        if config.n_action_steps > config.chunk_size:
            raise ConfigError(
                f"policy.n_action_steps={config.n_action_steps} exceeds policy.chunk_size={config.chunk_size}"
            )
        dim = config.dim_model
        if config.use_vae:
            self.vae_cls_embed = nn.Embedding(1, dim)
            self.vae_state_proj = nn.Linear(self.state_dim, dim) if self.state_dim else None
            self.vae_action_proj = nn.Linear(self.action_dim, dim)
            self.vae_encoder = ACTEncoder(config, config.n_vae_encoder_layers)
            self.vae_latent_head = nn.Linear(dim, 2 * config.latent_dim)
        self.latent_proj = nn.Linear(config.latent_dim, dim)
        self.state_proj = nn.Linear(self.state_dim, dim) if self.state_dim else None
        if self.image_keys:
            self.backbone, channels = _make_backbone(config.vision_backbone)
            self.image_proj = nn.Conv2d(channels, dim, kernel_size=1)
        # Learned positions of the non-image encoder tokens: [latent, state?].
        self.encoder_1d_pos = nn.Embedding(1 + bool(self.state_dim), dim)
        self.encoder = ACTEncoder(config, config.n_encoder_layers)
        self.decoder = ACTDecoder(config)
        self.query_pos = nn.Embedding(config.chunk_size, dim)
        self.action_head = nn.Linear(dim, self.action_dim)
        self._action_queue: deque[Tensor] = deque(maxlen=config.n_action_steps)
        self._init_from_entry_rng(entry_rng)

    def init_weights(self) -> None:
        """Default init, then Xavier-uniform on the transformer matrices (as in ACT/DETR)."""
        super().init_weights()
        for stack in (self.encoder, self.decoder, getattr(self, "vae_encoder", None)):
            if stack is None:
                continue
            for param in stack.parameters():
                if param.dim() > 1:
                    nn.init.xavier_uniform_(param)

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        actions_hat, (mu, log_sigma_x2) = self._predict(batch)
        target = batch[ACTION_KEY].float()
        error = (actions_hat.float() - target).abs()
        if ACTION_PAD_KEY in batch:
            # Padded entries count as zero error and the mean is over every entry (as LeRobot's
            # ACT long did; LeRobot 0.6 divides by the valid entries instead): a per-sample
            # mean, so data-parallel workers averaging their losses equal one process on the
            # whole batch, whatever the padding on each worker, with no loss_weight needed.
            error = error * (~batch[ACTION_PAD_KEY]).unsqueeze(-1).to(error.dtype)
        l1 = error.mean()
        # Each sample's loss, the same terms over its own entries: their mean is the loss.
        per_sample = error.flatten(1).mean(1)
        if mu is None:
            kld = torch.zeros((), device=l1.device)
            loss = l1
        else:
            mu, log_sigma_x2 = mu.float(), log_sigma_x2.float()
            kld_per_sample = (-0.5 * (1 + log_sigma_x2 - mu.pow(2) - log_sigma_x2.exp())).sum(-1)
            kld = kld_per_sample.mean()
            loss = l1 + self.config.kl_weight * kld
            per_sample = per_sample + self.config.kl_weight * kld_per_sample
        return loss, {"l1_loss": l1.detach(), "kld_loss": kld.detach(), PER_SAMPLE_LOSS: per_sample.detach()}

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """The full normalised chunk [B, chunk_size, action_dim] (eval mode, latent = 0)."""
        self.eval()
        return self._predict(batch)[0]

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        """Pop the next action; predict a new chunk only when the queue of n_action_steps is empty."""
        return self._next_from_queue(batch)

    def reset(self) -> None:
        self._action_queue.clear()

    def _predict(self, batch: dict[str, Tensor]) -> tuple[Tensor, tuple[Tensor | None, Tensor | None]]:
        state = batch[STATE_KEY] if self.state_dim else None
        reference = state if state is not None else batch[self.image_keys[0]]
        batch_size, device = reference.shape[0], reference.device
        dim = self.config.dim_model

        mu = log_sigma_x2 = None
        if self.config.use_vae and self.training:
            if ACTION_KEY not in batch:
                raise ValueError("ACT in training mode with use_vae needs 'action' in the batch (call .eval() to infer)")
            mu, log_sigma_x2 = self._encode_style(batch, state)
            latent = mu + (0.5 * log_sigma_x2).exp() * torch.randn_like(mu)
        else:
            latent = torch.zeros(batch_size, self.config.latent_dim, device=device, dtype=reference.dtype)

        tokens = [self.latent_proj(latent)[:, None]]
        if self.state_proj is not None:
            tokens.append(self.state_proj(state)[:, None])
        positions = [self.encoder_1d_pos.weight[None].expand(batch_size, -1, -1)]
        for key in self.image_keys:
            features = self.image_proj(self.backbone(batch[key]))  # [B, dim, h, w]
            height, width = features.shape[-2:]
            tokens.append(features.flatten(2).transpose(1, 2))
            positions.append(sinusoid_2d(height, width, dim, device)[None].expand(batch_size, -1, -1))
        encoder_in = torch.cat([t.to(tokens[0].dtype) for t in tokens], dim=1)
        memory_pos = torch.cat([p.to(encoder_in.dtype) for p in positions], dim=1)
        memory = self.encoder(encoder_in, memory_pos)

        queries = torch.zeros(batch_size, self.config.chunk_size, dim, device=device, dtype=memory.dtype)
        query_pos = self.query_pos.weight[None].expand(batch_size, -1, -1).to(memory.dtype)
        decoded = self.decoder(queries, memory, query_pos, memory_pos.to(memory.dtype))
        return self.action_head(decoded), (mu, log_sigma_x2)

    def _encode_style(self, batch: dict[str, Tensor], state: Tensor | None) -> tuple[Tensor, Tensor]:
        """CVAE posterior q(z | state, action chunk): the [CLS] output -> (mu, log sigma^2)."""
        actions = batch[ACTION_KEY]
        batch_size = actions.shape[0]
        tokens = [self.vae_cls_embed.weight[None].expand(batch_size, -1, -1)]
        if self.vae_state_proj is not None:
            tokens.append(self.vae_state_proj(state)[:, None])
        tokens.append(self.vae_action_proj(actions))
        x = torch.cat([t.to(tokens[-1].dtype) for t in tokens], dim=1)
        prefix = x.shape[1] - actions.shape[1]
        pad = batch.get(ACTION_PAD_KEY)
        if pad is None:
            pad = torch.zeros(actions.shape[:2], dtype=torch.bool, device=actions.device)
        key_padding_mask = torch.cat([torch.zeros(batch_size, prefix, dtype=torch.bool, device=pad.device), pad], 1)
        pos = sinusoid_1d(x.shape[1], self.config.dim_model, x.device).to(x.dtype)[None]
        cls_out = self.vae_encoder(x, pos.expand(batch_size, -1, -1), key_padding_mask)[:, 0]
        stats = self.vae_latent_head(cls_out)
        return stats[:, : self.config.latent_dim], stats[:, self.config.latent_dim :]
