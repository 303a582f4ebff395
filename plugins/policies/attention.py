"""Multi-head attention shared by the built-in transformer policies (ACT, diffusion).

Separate q/k/v/out ``nn.Linear`` projections, not ``nn.MultiheadAttention``'s fused
``in_proj_weight``: LoRA and the other PEFT methods target ``nn.Linear`` modules by name,
and the names ``q_proj``/``k_proj``/``v_proj``/``out_proj`` are the checkpoint keys and
default PEFT targets of both policies, so they must not change.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_kit.api import ConfigError


class MultiHeadAttention(nn.Module):
    """Batch-first multi-head scaled-dot-product attention."""

    def __init__(self, dim: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if dim % n_heads:
            raise ConfigError(f"policy.dim_model={dim} must be divisible by policy.n_heads={n_heads}")
        self.n_heads = n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """``key_padding_mask`` [B, key_len] is True where a key must not be attended to."""
        batch, q_len, dim = query.shape

        def heads(x: Tensor) -> Tensor:
            return x.view(batch, -1, self.n_heads, dim // self.n_heads).transpose(1, 2)

        q, k, v = heads(self.q_proj(query)), heads(self.k_proj(key)), heads(self.v_proj(value))
        attend = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        # SDPA needs one dtype; under autocast the projections agree, a float32 input would not.
        k, v = k.to(q.dtype), v.to(q.dtype)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attend, dropout_p=self.dropout if self.training else 0.0
        )
        return self.out_proj(out.transpose(1, 2).reshape(batch, q_len, dim))
