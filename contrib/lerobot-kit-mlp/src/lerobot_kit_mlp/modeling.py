"""A residual-MLP policy: normalised state in, a chunk of normalised actions out.

    state -> in_proj -> ResidualBlock x n_blocks -> LayerNorm -> head -> [chunk_size, action_dim]

Small and plain on purpose: it shows what the ``Policy`` contract asks of a model.

* FSDP2 shards each ``ResidualBlock`` on its own (``_fsdp_wrap_modules``): a block is
  the repeated unit that holds most parameters, and it is entered through ``__call__``
  so FSDP's hooks gather its shard just before use. The remaining modules (in_proj,
  out_norm, head) belong to the root unit.
* Every parameter is (re)created by ``init_weights`` and nothing is computed from
  parameter values in ``__init__``, so a meta-device build followed by ``to_empty`` +
  ``init_weights`` equals an ordinary build from the same seed.
* No buffers: a buffer filled in ``__init__`` would be lost on the meta device.
"""

from __future__ import annotations

from collections import deque

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_kit.api import ACTION_KEY, STATE_KEY, ConfigError, DatasetMeta, Policy, pad_key
from lerobot_kit_mlp.configuration import ResidualMLPConfig

ACTION_PAD_KEY = pad_key(ACTION_KEY)


class ResidualBlock(nn.Module):
    """Pre-norm MLP with a skip connection: ``x + fc2(dropout(gelu(fc1(norm(x)))))``."""

    def __init__(self, width: int, expansion: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, width * expansion)
        self.fc2 = nn.Linear(width * expansion, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.fc2(self.dropout(F.gelu(self.fc1(self.norm(x)))))


class ResidualMLPPolicy(Policy):
    config_class = ResidualMLPConfig
    _fsdp_wrap_modules = ["ResidualBlock"]
    default_peft_targets = ["fc1", "fc2"]
    config: ResidualMLPConfig

    def __init__(self, config: ResidualMLPConfig, meta: DatasetMeta) -> None:
        # The RNG state on entry: init_weights replays it at the end (see Policy).
        entry_rng = torch.get_rng_state()
        super().__init__(config, meta)
        for key in (STATE_KEY, ACTION_KEY):
            spec = meta.features.get(key)
            if spec is None or len(spec.shape) != 1:
                raise ConfigError(
                    f"policy.type=residual_mlp needs a 1-D {key!r} feature; the dataset has "
                    f"{ {k: list(f.shape) for k, f in meta.features.items()} }"
                )
        if meta.image_keys():
            raise ConfigError(
                f"policy.type=residual_mlp reads {STATE_KEY!r} only, but the dataset has images "
                f"{meta.image_keys()}; use a policy with a vision backbone (e.g. --policy.type=act)"
            )
        self.state_dim = meta.features[STATE_KEY].shape[0]
        self.action_dim = meta.features[ACTION_KEY].shape[0]
        self.in_proj = nn.Linear(self.state_dim, config.width)
        self.blocks = nn.ModuleList(
            ResidualBlock(config.width, config.expansion, config.dropout) for _ in range(config.n_blocks)
        )
        self.out_norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.chunk_size * self.action_dim)
        self._action_queue: deque[Tensor] = deque(maxlen=config.n_action_steps)
        self._init_from_entry_rng(entry_rng)

    def init_weights(self) -> None:
        """PyTorch's default init, then zero each block's output layer so every block
        starts as the identity: a deep stack then trains as stably as a shallow one."""
        super().init_weights()
        for block in self.blocks:
            nn.init.zeros_(block.fc2.weight)
            nn.init.zeros_(block.fc2.bias)

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        predicted = self._predict(batch[STATE_KEY]).float()
        error = (predicted - batch[ACTION_KEY].float()).abs()
        if ACTION_PAD_KEY in batch:
            # Padded offsets (past the episode's end) count as zero error, and the mean is
            # over every entry: a per-sample quantity, so workers averaging their losses
            # equal one process on the whole batch, whatever the padding on each worker.
            error = error * (~batch[ACTION_PAD_KEY]).unsqueeze(-1).to(error.dtype)
        loss = error.mean()
        return loss, {"l1_loss": loss.detach(), "next_action_loss": error[:, 0].mean().detach()}

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """The whole normalised chunk [B, chunk_size, action_dim]."""
        self.eval()
        return self._predict(batch[STATE_KEY])

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        """Pop the next action; predict a new chunk only when n_action_steps are used up."""
        return self._next_from_queue(batch)

    def reset(self) -> None:
        self._action_queue.clear()

    def _predict(self, state: Tensor) -> Tensor:
        x = self.in_proj(state)
        for block in self.blocks:
            x = block(x)
        out = self.head(self.out_norm(x))
        return out.view(state.shape[0], self.config.chunk_size, self.action_dim)
