"""A toy policy-shaped model for ``parallelize`` tests: an input layer, residual Blocks
(the FSDP wrap units) and a head; seeded weights and batches, so every process that
builds it, in a test or a rank worker, holds the same model and data."""

from __future__ import annotations

import torch
from torch import nn

IN, D, OUT = 6, 16, 3
SEED = 1234


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D, 2 * D)
        self.fc2 = nn.Linear(2 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class Tiny(nn.Module):
    _fsdp_wrap_modules = ["Block"]

    def __init__(self, n_blocks: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(IN, D)
        self.blocks = nn.ModuleList(Block() for _ in range(n_blocks))
        self.head = nn.Linear(D, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)

    def init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.3)
                nn.init.zeros_(module.bias)


def make_model() -> Tiny:
    torch.manual_seed(SEED)
    return Tiny()


def batch_for(step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(n, IN, generator=gen), torch.randn(n, OUT, generator=gen)
