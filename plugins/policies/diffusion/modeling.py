"""Diffusion Policy with a transformer denoiser (Chi et al. 2023, "Diffusion Policy:
Visuomotor Policy Learning via Action Diffusion"), written here from the paper.

Training: a clean action chunk is noised to a random DDPM level ``t`` (squaredcos_cap_v2
betas) and the denoiser predicts the noise (``prediction_type=epsilon``, the paper's
choice) or the clean chunk (``sample``); loss = MSE, masked by ``action_is_pad`` unless
``mask_padded_actions`` is off. The denoiser reads one token per noisy action and cross-attends to
conditioning tokens [timestep, state per history frame, one keypoint vector per camera
and history frame]. Inference: start from Gaussian noise and take ``num_inference_steps``
DDIM (or DDPM) steps; the chunk is executed ``n_action_steps`` at a time from a queue,
while an observation queue keeps the last ``n_obs_steps`` states and camera frames.

FSDP2: the wrap unit is ``DiffusionTransformerBlock``; the observation encoders, the
timestep MLP and the embeddings stay in the root unit. No parameter is shared between
blocks, each block is entered through ``__call__``, the noise schedule is a table of
Python floats (no buffer: nothing that ``to_empty`` leaves uninitialised or that could
differ per rank), and coordinate grids are computed in ``forward``. Noise and timesteps
come from the global torch RNG, which checkpoints save and restore per rank.
"""

from __future__ import annotations

import math
from collections import deque

import torch
import torch.nn.functional as F
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
from lerobot_kit.plugins.policies.attention import MultiHeadAttention
from lerobot_kit.plugins.policies.diffusion.configuration import DiffusionConfig

ACTION_PAD_KEY = pad_key(ACTION_KEY)
INIT_STD = 0.02  # GPT-style init of linears and embeddings, as the paper's transformer uses


class NoiseSchedule:
    """DDPM's cumulative signal levels ``alpha_bar[t]`` (squaredcos_cap_v2), with the
    forward noising and the DDIM / DDPM reverse updates.

    Held as Python floats: a plain table is identical on every rank and device, and a
    meta-device build has nothing to materialise.
    """

    MAX_BETA = 0.999  # the cap of "cap_v2": keeps the last levels from dividing by zero

    def __init__(self, num_train_timesteps: int) -> None:
        def signal(fraction: float) -> float:
            return math.cos((fraction + 0.008) / 1.008 * math.pi / 2) ** 2

        self.num_train_timesteps = num_train_timesteps
        alpha_bar, level = [], 1.0
        for i in range(num_train_timesteps):
            beta = min(1.0 - signal((i + 1) / num_train_timesteps) / signal(i / num_train_timesteps), self.MAX_BETA)
            level *= 1.0 - beta
            alpha_bar.append(level)
        self.alpha_bar = tuple(alpha_bar)

    def add_noise(self, clean: Tensor, noise: Tensor, timesteps: Tensor) -> Tensor:
        """x_t = sqrt(alpha_bar_t) x_0 + sqrt(1 - alpha_bar_t) eps, per batch element."""
        level = torch.tensor(self.alpha_bar, dtype=torch.float64, device=clean.device)[timesteps]
        level = level.to(clean.dtype).view(-1, *([1] * (clean.dim() - 1)))
        return level.sqrt() * clean + (1.0 - level).sqrt() * noise

    def inference_timesteps(self, num_steps: int) -> list[tuple[int, int]]:
        """(t, previous t) pairs, evenly strided from the noisiest level ("leading" spacing);
        the last previous level is -1, the clean sample."""
        stride = self.num_train_timesteps // num_steps
        levels = [i * stride for i in reversed(range(num_steps))]
        return [(t, t - stride if i + 1 < num_steps else -1) for i, t in enumerate(levels)]

    def clean_from_noise(self, sample: Tensor, eps: Tensor, t: int) -> Tensor:
        """x_0 implied by a noise prediction at level ``t``."""
        level = self.alpha_bar[t]
        return (sample - math.sqrt(1.0 - level) * eps) / math.sqrt(level)

    def step(self, sample: Tensor, clean: Tensor, t: int, prev: int, *, stochastic: bool) -> Tensor:
        """One reverse update from level ``t`` to ``prev`` given the (clipped) clean estimate."""
        level = self.alpha_bar[t]
        level_prev = self.alpha_bar[prev] if prev >= 0 else 1.0
        if not stochastic:
            # DDIM (eta = 0): keep the noise implied by the clean estimate, at the lower level.
            eps = (sample - math.sqrt(level) * clean) / math.sqrt(1.0 - level)
            return math.sqrt(level_prev) * clean + math.sqrt(1.0 - level_prev) * eps
        # DDPM posterior q(x_prev | x_t, x_0) over a stride of levels.
        alpha = level / level_prev
        beta = 1.0 - alpha
        mean = (math.sqrt(level_prev) * beta / (1.0 - level)) * clean + (
            math.sqrt(alpha) * (1.0 - level_prev) / (1.0 - level)
        ) * sample
        if prev < 0:
            return mean
        variance = max((1.0 - level_prev) / (1.0 - level) * beta, 1e-20)
        return mean + math.sqrt(variance) * torch.randn_like(sample)


def timestep_embedding(timesteps: Tensor, dim: int) -> Tensor:
    """[B] integer levels -> [B, dim] sin/cos features at geometric frequencies (Vaswani et al.)."""
    half = dim // 2
    freq = torch.exp(
        torch.arange(half, device=timesteps.device, dtype=torch.float32) * (-math.log(10000.0) / max(half - 1, 1))
    )
    angles = timesteps.float()[:, None] * freq[None]
    embedding = torch.cat([angles.sin(), angles.cos()], dim=1)
    return F.pad(embedding, (0, dim - 2 * half))


class DiffusionTransformerBlock(nn.Module):
    """Pre-LayerNorm block: self-attention over the action tokens, cross-attention to the
    conditioning tokens, feed-forward — the FSDP wrap unit."""

    def __init__(self, config: DiffusionConfig) -> None:
        super().__init__()
        dim = config.dim_model
        self.self_attn = MultiHeadAttention(dim, config.n_heads, config.dropout)
        self.cross_attn = MultiHeadAttention(dim, config.n_heads, config.dropout)
        self.linear1 = nn.Linear(dim, config.dim_feedforward)
        self.linear2 = nn.Linear(config.dim_feedforward, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, memory: Tensor) -> Tensor:
        h = self.norm1(x)
        x = x + self.dropout(self.self_attn(h, h, h))
        x = x + self.dropout(self.cross_attn(self.norm2(x), memory, memory))
        return x + self.dropout(self.linear2(self.dropout(F.gelu(self.linear1(self.norm3(x))))))


class SpatialSoftmax(nn.Module):
    """Feature map [N,C,h,w] -> [N, 2K]: the expected (x, y) in [-1, 1] of each of K learned
    keypoint maps — a position readout, which is what a reaching policy needs from a camera."""

    def __init__(self, channels: int, keypoints: int) -> None:
        super().__init__()
        self.keypoint_conv = nn.Conv2d(channels, keypoints, kernel_size=1)

    def forward(self, features: Tensor) -> Tensor:
        maps = self.keypoint_conv(features)
        n, k, height, width = maps.shape
        attention = maps.flatten(2).float().softmax(dim=-1).view(n, k, height, width)
        ys = torch.linspace(-1.0, 1.0, height, device=maps.device)
        xs = torch.linspace(-1.0, 1.0, width, device=maps.device)
        x = (attention.sum(dim=2) * xs).sum(dim=-1)
        y = (attention.sum(dim=3) * ys).sum(dim=-1)
        return torch.cat([x, y], dim=1).to(maps.dtype)


class ImageEncoder(nn.Module):
    """A small stride-4 conv net + spatial softmax: [N,3,H,W] -> [N, dim]. GroupNorm, so no
    running-stat buffers (which would differ per rank)."""

    def __init__(self, keypoints: int, dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1),
            nn.GroupNorm(8, 32),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1),
            nn.GroupNorm(8, 64),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1),
            nn.GroupNorm(8, 64),
            nn.ReLU(),
        )
        self.pool = SpatialSoftmax(64, keypoints)
        self.out = nn.Linear(2 * keypoints, dim)

    def forward(self, images: Tensor) -> Tensor:
        return self.out(self.pool(self.net(images)))


class DiffusionPolicy(Policy):
    config_class = DiffusionConfig
    _fsdp_wrap_modules = ["DiffusionTransformerBlock"]
    default_peft_targets = ["q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2"]
    config: DiffusionConfig

    def __init__(self, config: DiffusionConfig, meta: DatasetMeta) -> None:
        entry_rng = torch.get_rng_state()
        super().__init__(config, meta)
        self.image_keys, self.state_dim, self.action_dim = feature_dims(meta, "diffusion")
        if config.n_action_steps > config.horizon:
            raise ConfigError(
                f"policy.n_action_steps={config.n_action_steps} exceeds policy.horizon={config.horizon}"
            )
        if config.num_inference_steps > config.num_train_timesteps:
            raise ConfigError(
                f"policy.num_inference_steps={config.num_inference_steps} exceeds "
                f"policy.num_train_timesteps={config.num_train_timesteps}"
            )
        self.schedule = NoiseSchedule(config.num_train_timesteps)
        dim = config.dim_model
        self.state_proj = nn.Linear(self.state_dim, dim) if self.state_dim else None
        self.image_encoder = ImageEncoder(config.image_keypoints, dim) if self.image_keys else None
        self.time_mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.Mish(), nn.Linear(4 * dim, dim))
        # Conditioning tokens: [timestep, state x n_obs_steps?, (camera x n_obs_steps) x n_cameras].
        n_cond = 1 + config.n_obs_steps * ((1 if self.state_dim else 0) + len(self.image_keys))
        self.cond_pos = nn.Parameter(torch.empty(n_cond, dim))
        self.cond_encoder = nn.Sequential(nn.Linear(dim, 4 * dim), nn.Mish(), nn.Linear(4 * dim, dim))
        # Unit-scale memory for the blocks' key/value projections: with the small init, an
        # unnormalised memory starts near zero and the denoiser learns to ignore it.
        self.cond_norm = nn.LayerNorm(dim)
        self.action_in = nn.Linear(self.action_dim, dim)
        self.action_pos = nn.Parameter(torch.empty(config.horizon, dim))
        self.embed_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(DiffusionTransformerBlock(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(dim)
        self.action_head = nn.Linear(dim, self.action_dim)
        self._obs_queue: deque[dict[str, Tensor]] = deque(maxlen=config.n_obs_steps)
        self._action_queue: deque[Tensor] = deque(maxlen=config.n_action_steps)
        self._init_from_entry_rng(entry_rng)

    def init_weights(self) -> None:
        """Linears and position tables ~ N(0, 0.02) with zero biases (the paper's transformer
        init); convolutions and norms by their own ``reset_parameters``. Module order."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=INIT_STD)
                nn.init.zeros_(module.bias)
            elif module is not self and callable(getattr(module, "reset_parameters", None)):
                module.reset_parameters()
        nn.init.normal_(self.cond_pos, std=INIT_STD)
        nn.init.normal_(self.action_pos, std=INIT_STD)

    def loss_weight(self, batch: dict[str, Tensor]) -> Tensor | None:
        """With ``mask_padded_actions`` the loss divides by the batch's valid action entries,
        so data-parallel workers are weighted by theirs (see ``Policy.loss_weight``)."""
        if self.config.mask_padded_actions and ACTION_PAD_KEY in batch:
            return (~batch[ACTION_PAD_KEY]).sum()
        return None

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        if ACTION_KEY not in batch:
            raise ValueError("diffusion training needs 'action' in the batch (use select_action to infer)")
        clean = batch[ACTION_KEY].float()
        observations = self._encode_observations(batch)
        # Global RNG, in a fixed order: a resumed run (RNG restored) draws the same numbers.
        noise = torch.randn(clean.shape, device=clean.device, dtype=clean.dtype)
        timesteps = torch.randint(0, self.config.num_train_timesteps, (clean.shape[0],), device=clean.device)
        noisy = self.schedule.add_noise(clean, noise, timesteps)
        target = noise if self.config.prediction_type == "epsilon" else clean
        error = (self._denoise(noisy, timesteps, observations).float() - target).pow(2)
        # Each sample's loss is the mean over its own (valid) entries; with padding masked, the
        # loss weighs the samples by their valid entries instead of equally.
        if self.config.mask_padded_actions and ACTION_PAD_KEY in batch:
            valid = (~batch[ACTION_PAD_KEY]).unsqueeze(-1).to(error.dtype)
            masked = error * valid
            loss = masked.sum() / (valid.sum() * self.action_dim).clamp_min(1.0)
            per_sample = masked.flatten(1).sum(1) / (valid.flatten(1).sum(1) * self.action_dim).clamp_min(1.0)
        else:
            loss = error.mean()
            per_sample = error.flatten(1).mean(1)
        return loss, {PER_SAMPLE_LOSS: per_sample.detach()}

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """Sample a normalised chunk [B, horizon, action_dim] for an observation batch shaped
        like a training batch (state [B, n_obs_steps, D]); eval mode, noise from the torch RNG."""
        self.eval()
        observations = self._encode_observations(batch)
        batch_size, device = observations.shape[0], observations.device
        sample = torch.randn(batch_size, self.config.horizon, self.action_dim, device=device)
        clip = self.config.clip_sample_range if self.config.clip_sample else None
        stochastic = self.config.sampler == "ddpm"
        for t, prev in self.schedule.inference_timesteps(self.config.num_inference_steps):
            levels = torch.full((batch_size,), t, dtype=torch.long, device=device)
            prediction = self._denoise(sample, levels, observations).float()
            if self.config.prediction_type == "epsilon":
                prediction = self.schedule.clean_from_noise(sample, prediction, t)
            if clip is not None:
                prediction = prediction.clamp(-clip, clip)
            sample = self.schedule.step(sample, prediction, t, prev, stochastic=stochastic)
        return sample

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        """Next action for a single-frame observation batch (state [B, D], images [B,3,H,W]).

        Every call enters the state and camera history; a chunk is sampled only when the
        queue of ``n_action_steps`` actions is empty. After ``reset`` the history starts as
        copies of the first observation, as training pads frames before an episode's start.
        """
        observation = dict(batch)
        keys = ([STATE_KEY] if self.state_dim else []) + (self.image_keys if self.config.n_obs_steps > 1 else [])
        if keys:
            frame = {key: batch[key] for key in keys}
            if not self._obs_queue:
                self._obs_queue.extend([frame] * (self.config.n_obs_steps - 1))
            self._obs_queue.append(frame)
            for key in keys:
                observation[key] = torch.stack([f[key] for f in self._obs_queue], dim=1)
        return self._next_from_queue(observation)

    def reset(self) -> None:
        self._obs_queue.clear()
        self._action_queue.clear()

    def _encode_observations(self, batch: dict[str, Tensor]) -> Tensor:
        """[B, n_obs_tokens, dim]: one token per state frame, one per camera and frame."""
        tokens = []
        if self.state_proj is not None:
            tokens.append(self.state_proj(self._state_history(batch[STATE_KEY])))
        if self.image_encoder is not None:
            for key in self.image_keys:
                images = self._image_history(key, batch[key])
                encoded = self.image_encoder(images.flatten(0, 1))
                tokens.append(encoded.unflatten(0, images.shape[:2]))
        return torch.cat([t.to(tokens[0].dtype) for t in tokens], dim=1)

    def _image_history(self, key: str, images: Tensor) -> Tensor:
        """[B, n_obs_steps, 3, H, W] (with one step, [B, 3, H, W] is accepted too)."""
        steps = self.config.n_obs_steps
        if images.dim() == 4 and steps == 1:
            return images[:, None]
        if images.dim() != 5 or images.shape[1] != steps:
            shape = "[B,3,H,W] or [B,1,3,H,W]" if steps == 1 else f"[B,{steps},3,H,W]"
            raise ValueError(
                f"diffusion with n_obs_steps={steps} expects {key!r} as {shape} (the dataset stacks it from "
                f"delta_indices), got {tuple(images.shape)}"
            )
        return images

    def _state_history(self, state: Tensor) -> Tensor:
        steps = self.config.n_obs_steps
        if state.dim() == 2 and steps == 1:
            return state[:, None]
        if state.dim() != 3 or state.shape[1] != steps:
            raise ValueError(
                f"diffusion with n_obs_steps={steps} expects {STATE_KEY!r} as [B, {steps}, {self.state_dim}] "
                f"(the dataset stacks it from delta_indices), got {tuple(state.shape)}"
            )
        return state

    def _denoise(self, noisy: Tensor, timesteps: Tensor, observations: Tensor) -> Tensor:
        """The denoiser's prediction [B, horizon, action_dim] for a noisy chunk at the given levels."""
        # Inputs made here are float32; FSDP's param_dtype (bf16 weights, no autocast) needs them cast.
        dtype = self.action_in.weight.dtype
        time_token = self.time_mlp(timestep_embedding(timesteps, self.config.dim_model).to(dtype))[:, None]
        cond = torch.cat([time_token, observations.to(time_token.dtype)], dim=1)
        memory = self.cond_norm(self.cond_encoder(self.embed_dropout(cond + self.cond_pos.to(cond.dtype))))
        x = self.action_in(noisy.to(dtype))
        x = self.embed_dropout(x + self.action_pos.to(x.dtype))
        for block in self.blocks:
            x = block(x, memory)
        return self.action_head(self.final_norm(x))
