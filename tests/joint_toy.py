"""A toy model whose layers never run their own ``forward``: two towers whose layer *i*
attend jointly, computed by a free function that calls each layer's projections directly
(the shape of LeRobot's π0/π0.5 and SmolVLA joint attention). Its policy declares each
pair (tower A layer i, tower B layer i) as a unit group run by ``joint``, which a layer
carries as an attribute; the model's own loop calls that attribute. Seeded weights and
batches, so every process that builds it holds the same model and data.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from lerobot_kit.core.parallel.wrap_units import UnitGroup

IN, DA, DB, OUT, DEPTH = 6, 16, 8, 3, 3
SEED = 4321


class Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.q, self.k, self.v = (nn.Linear(width, 8) for _ in range(3))
        self.o = nn.Linear(8, width)
        self.mlp = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # never called by Joint: as in the VLA towers
        raise AssertionError("the joint model calls its layers' submodules, never their forward")


def joint_layer(a: torch.Tensor, b: torch.Tensor, *, layers: tuple[Layer, Layer]) -> tuple[torch.Tensor, torch.Tensor]:
    """One joint step: queries of both streams attend to keys of both, then each stream's own MLP."""
    normed = [layer.norm(x) for layer, x in zip(layers, (a, b))]
    q = torch.cat([layer.q(x) for layer, x in zip(layers, normed)], dim=1)
    k = torch.cat([layer.k(x) for layer, x in zip(layers, normed)], dim=1)
    v = torch.cat([layer.v(x) for layer, x in zip(layers, normed)], dim=1)
    attended = torch.softmax(q @ k.transpose(1, 2) / 8**0.5, dim=-1) @ v
    out = []
    for layer, x, part in zip(layers, (a, b), attended.split([a.shape[1], b.shape[1]], dim=1)):
        h = x + layer.o(part)
        out.append(h + torch.tanh(layer.mlp(h)))
    return out[0], out[1]


class Joint(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp_a = nn.Linear(IN, DA)
        self.inp_b = nn.Linear(IN, DB)
        self.tower_a = nn.ModuleList(Layer(DA) for _ in range(DEPTH))
        self.tower_b = nn.ModuleList(Layer(DB) for _ in range(DEPTH))
        self.head = nn.Linear(DB, OUT)
        # In no state dict (like rotary frequencies): a meta-built rank must still get its values.
        self.register_buffer("scale", torch.linspace(0.5, 1.5, DB), persistent=False)
        for a, b in zip(self.tower_a, self.tower_b):
            a.joint = functools.partial(joint_layer, layers=(a, b))

    def fsdp_unit_groups(self) -> list[UnitGroup]:
        return [UnitGroup((f"tower_a.{i}", f"tower_b.{i}"), "joint") for i in range(DEPTH)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.inp_a(x), self.inp_b(x)
        for layer in self.tower_a:
            a, b = layer.joint(a, b)
        return self.head(b * self.scale).mean(dim=1)

    def init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.3)
                nn.init.zeros_(module.bias)


def make_joint() -> Joint:
    torch.manual_seed(SEED)
    model = Joint()
    model.init_weights()
    return model


def joint_batch(step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` samples of 5 tokens each, and their targets."""
    gen = torch.Generator().manual_seed(200 + step)
    return torch.randn(n, 5, IN, generator=gen), torch.randn(n, OUT, generator=gen)


def joint_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), y)
