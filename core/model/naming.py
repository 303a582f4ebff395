"""How a model's weights are named when stored: the model's own concern, read by every writer and reader.

A plain policy stores every tensor of its state dict under its own name in
``model.safetensors`` (``FullNaming``); a PEFT model stores only its adapter under peft's
names in ``adapter_model.safetensors`` (``core.model.peft.PeftNaming``). The naming is
chosen once, where the model is known (``core.model.peft.model_weights``), and travels
with it as ``ModelWeights``, so the checkpoint code never asks what kind of model it has.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import paths


class WeightNaming(ABC):
    """Which tensors of a model its weights file holds, and under which names."""

    file_name: str  # in pretrained_model/
    include_frozen: bool  # frozen parameters are stored too (an adapter's frozen base never is)

    @abstractmethod
    def to_saved(self, state: dict[str, Any]) -> dict[str, Any]:
        """The tensors to store, under their stored names, taken from the model's state dict."""

    @abstractmethod
    def to_model(self, saved: dict[str, Any], source: Path) -> dict[str, Any]:
        """Stored tensors under the model's names; ``CheckpointError`` naming ``source`` when
        they are not exactly the tensors this model stores."""

    def save_config(self, directory: Path) -> None:
        """Files a loader needs next to the weights (peft's ``adapter_config.json``); none by default."""


class FullNaming(WeightNaming):
    """A plain model: its whole state dict, under its own names, in ``model.safetensors``."""

    file_name = paths.MODEL_WEIGHTS
    include_frozen = True

    def __init__(self, model: nn.Module) -> None:
        self._keys = frozenset(model.state_dict())
        self._model_name = type(model).__name__

    def to_saved(self, state: dict[str, Any]) -> dict[str, Any]:
        return state

    def to_model(self, saved: dict[str, Any], source: Path) -> dict[str, Any]:
        missing, unexpected = sorted(self._keys - set(saved)), sorted(set(saved) - self._keys)
        if missing or unexpected:
            raise CheckpointError(
                f"{source} does not fit this {self._model_name} (saved with other settings or features?): "
                f"missing {missing[:3]}, unexpected {unexpected[:3]}"
            )
        return saved


@dataclass(frozen=True)
class ModelWeights:
    """A model and the naming its weights are stored under: what every function here takes."""

    model: nn.Module
    naming: WeightNaming

    def file_in(self, pretrained_dir: Path) -> Path:
        """Where this model's gathered weights file lives in ``pretrained_dir``."""
        return Path(pretrained_dir) / self.naming.file_name
