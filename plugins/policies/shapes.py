"""Torch-free parameter shapes of the layers the built-in policies are made of.

``inspect-checkpoint`` checks stored weights against what ``config.json`` and
``dataset_meta.json`` describe without importing torch or building the model, so each
built-in config computes its model's ``state_dict`` shapes from these, the way its
``modeling`` module stacks the layers (a unit test holds the two equal).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lerobot_kit.api import DatasetMeta

Shapes = dict[str, tuple[int, ...]]

STATE_KEY = "observation.state"  # core.data.dataset's, repeated: that module pulls numpy into --help
ACTION_KEY = "action"


def linear(name: str, n_in: int, n_out: int, bias: bool = True) -> Shapes:
    return {f"{name}.weight": (n_out, n_in), **({f"{name}.bias": (n_out,)} if bias else {})}


def conv2d(name: str, c_in: int, c_out: int, kernel: int, bias: bool = True) -> Shapes:
    return {f"{name}.weight": (c_out, c_in, kernel, kernel), **({f"{name}.bias": (c_out,)} if bias else {})}


def norm(name: str, dim: int) -> Shapes:
    """LayerNorm or GroupNorm: a weight and a bias per channel."""
    return {f"{name}.weight": (dim,), f"{name}.bias": (dim,)}


def batch_norm(name: str, dim: int) -> Shapes:
    """BatchNorm2d, with its running-statistics buffers (part of the state_dict)."""
    return {**norm(name, dim), f"{name}.running_mean": (dim,), f"{name}.running_var": (dim,),
            f"{name}.num_batches_tracked": ()}


def embedding(name: str, count: int, dim: int) -> Shapes:
    return {f"{name}.weight": (count, dim)}


def attention(name: str, dim: int) -> Shapes:
    """``plugins.policies.attention.MultiHeadAttention``: separate q/k/v/out projections."""
    projections = ("q_proj", "k_proj", "v_proj", "out_proj")
    return {k: v for proj in projections for k, v in linear(f"{name}.{proj}", dim, dim).items()}


def feature_sizes(meta: DatasetMeta, policy: str) -> tuple[list[str], int, int]:
    """(camera keys, state size or 0, action size), as ``core.model.policy.feature_dims``
    reads them; a ``ValueError`` naming ``policy`` where that would refuse the dataset."""
    if ACTION_KEY not in meta.features:
        raise ValueError(f"{policy} needs an {ACTION_KEY!r} feature; the dataset has {sorted(meta.features)}")
    cameras = meta.image_keys()
    state = meta.features[STATE_KEY].shape[0] if STATE_KEY in meta.features else 0
    if not state and not cameras:
        raise ValueError(f"{policy} needs {STATE_KEY!r} or an image feature; the dataset has {sorted(meta.features)}")
    return cameras, state, meta.features[ACTION_KEY].shape[0]
