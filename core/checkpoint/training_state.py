"""The files of the non-model state pieces, and the pieces no library provides: RNG, data position.

Optimizer state is keyed by parameter name (FQN), not index, in every format, so a
checkpoint written by one layout loads into another: ``optimizer_state.safetensors``
holds ``state.<fqn>.<key>`` tensors and ``optimizer_param_groups.json`` the groups with
their parameter names. Every rank's random state is one file, ``rank<r>.<name>``
tensors (``RandomState``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from lerobot_kit.core.data.sampler import DataPosition
from lerobot_kit.core.errors import CheckpointError, first_line
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.json_file import read_json, write_json
from lerobot_kit.core.layout.file_modes import save_safetensors


def save_full_optimizer(state: dict[str, Any], directory: Path) -> None:
    tensors: dict[str, torch.Tensor] = {}
    for fqn, entry in state["state"].items():
        for key, value in entry.items():
            tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            tensors[f"state.{fqn}.{key}"] = tensor.detach().to("cpu").contiguous()
    save_safetensors(tensors, directory / paths.OPTIMIZER_STATE)
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()} for group in state["param_groups"]]
    write_json(directory / paths.OPTIMIZER_PARAM_GROUPS, groups)


def read_safetensors(path: Path, missing: str = "the checkpoint is incomplete") -> dict[str, torch.Tensor]:
    """A checkpoint's safetensors file, or one CheckpointError line saying what is wrong with it."""
    try:
        return load_file(str(path))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: missing; {missing}") from exc
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise CheckpointError(f"{path}: unreadable ({first_line(exc)}); the file is corrupt or truncated") from exc


def load_full_optimizer(directory: Path) -> dict[str, Any]:
    tensors = read_safetensors(directory / paths.OPTIMIZER_STATE, missing="the checkpoint holds no optimizer state")
    state: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        fqn, _, key = name.removeprefix("state.").rpartition(".")
        state.setdefault(fqn, {})[key] = tensor
    groups = read_json(directory / paths.OPTIMIZER_PARAM_GROUPS)
    for group in groups:
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    return {"state": state, "param_groups": groups}


class RandomState:
    """This process's random state as a ``Stateful``: torch (CPU and CUDA), numpy and Python."""

    def state_dict(self) -> dict[str, Any]:
        return capture_rng()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _restore_rng(state_dict)


class DataCursor:
    """Where the data order stands, as a ``Stateful``: the trainer moves it on every step and a
    checkpoint records it in ``training_step.json`` (``sampler``)."""

    def __init__(self, position: DataPosition | None = None) -> None:
        self.position = position or DataPosition()

    def state_dict(self) -> dict[str, Any]:
        return self.position.to_json()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.position = DataPosition(**state_dict)


def capture_rng() -> dict[str, torch.Tensor]:
    """This process's random state: torch (CPU and CUDA), numpy and Python."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.cuda.get_rng_state()
    _, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["numpy"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    tensors["numpy_extra"] = torch.tensor([pos, has_gauss], dtype=torch.int64)
    tensors["numpy_gauss"] = torch.tensor([cached], dtype=torch.float64)
    version, internal, gauss = random.getstate()
    tensors["python"] = torch.tensor(internal, dtype=torch.int64)
    tensors["python_extra"] = torch.tensor([version], dtype=torch.int64)
    tensors["python_gauss"] = torch.tensor([float("nan") if gauss is None else gauss], dtype=torch.float64)
    return tensors


def _restore_rng(tensors: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["cuda"])
    pos, has_gauss = tensors["numpy_extra"].tolist()
    np.random.set_state(
        ("MT19937", tensors["numpy"].numpy().astype(np.uint32), pos, has_gauss, tensors["numpy_gauss"].item())
    )
    gauss = tensors["python_gauss"].item()
    random.setstate(
        (int(tensors["python_extra"][0]), tuple(tensors["python"].tolist()), None if gauss != gauss else gauss)
    )


def save_per_rank(per_rank: list[dict[str, torch.Tensor]], path: Path) -> None:
    """Every rank's tensors in one file, as ``rank<r>.<name>``."""
    flat = {f"rank{rank}.{key}": value for rank, states in enumerate(per_rank) for key, value in states.items()}
    save_safetensors(flat, path)


def load_per_rank(path: Path, rank: int) -> dict[str, torch.Tensor] | None:
    """The tensors ``rank`` saved with ``save_per_rank`` (or None when that rank did not exist then)."""
    flat = read_safetensors(path)
    prefix = f"rank{rank}."
    mine = {k.removeprefix(prefix): v for k, v in flat.items() if k.startswith(prefix)}
    return mine or None
