"""What a ``pretrained_model/`` folder holds, as its writer recorded it.

Loaders ask this instead of looking for files: a checkpoint's ``training_step.json``
says whether the weights are the full model or a PEFT adapter, whether they are one
gathered file, DCP shards or both, and which checkpoint format wrote them (and so has
to read them). A folder without a valid record of this layout (written by
``save_pretrained`` or ``merge_adapter``, copied or uploaded on its own, or from an
older layout) holds what ``save_pretrained`` writes: one gathered file, as the built-in
``safetensors`` format stores it, and an adapter exactly when ``adapter_config.json``
is there and full weights are not.

Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.paths import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    DCP_MODEL_DIR,
    MODEL_WEIGHTS,
    PRETRAINED_DIR,
)
from lerobot_kit.core.layout.training_step import recorded_training_step

UNRECORDED_FORMAT = "safetensors"  # the format save_pretrained's files are in


@dataclass(frozen=True)
class StoredWeights:
    folder: Path  # the pretrained_model/ folder
    adapter: bool  # a PEFT adapter (adapter_model.safetensors), not the full model
    gathered: bool  # one file of full tensors
    shards: bool  # DCP shards in pytorch_model_fsdp_0/
    checkpoint_format: str  # the registered format that wrote them

    @classmethod
    def of(cls, pretrained_dir: Path) -> StoredWeights:
        folder = Path(pretrained_dir)
        record = recorded_training_step(folder.parent) if folder.name == PRETRAINED_DIR else None
        if record is not None:
            kinds = record.weights.split("+")
            return cls(folder, record.peft, "gathered" in kinds, "dcp" in kinds, record.checkpoint_format)
        adapter = (folder / ADAPTER_CONFIG).is_file() and not (folder / MODEL_WEIGHTS).is_file()
        return cls(folder, adapter, gathered=True, shards=False, checkpoint_format=UNRECORDED_FORMAT)

    @property
    def file_name(self) -> str:
        return ADAPTER_WEIGHTS if self.adapter else MODEL_WEIGHTS

    @property
    def shard_dir(self) -> Path:
        return self.folder / DCP_MODEL_DIR

    def require_kind(self, file_name: str) -> None:
        """Refuse to load these weights into a model that stores its own as ``file_name``."""
        if file_name == self.file_name:
            return
        if self.adapter:
            raise CheckpointError(
                f"{self.folder} holds a PEFT adapter, not full weights; load it with load_pretrained, or merge it "
                "into a plain model.safetensors with lerobot_kit.api.merge_adapter"
            )
        raise CheckpointError(f"{self.folder} holds full weights ({MODEL_WEIGHTS}), not a PEFT adapter")

    def gathered_file(self) -> Path:
        """The one file of weights, for loaders that need it; when there is none, a
        ``CheckpointError`` saying how to make it."""
        path = self.folder / self.file_name
        if self.gathered and path.is_file():
            return path
        if self.shard_dir.is_dir():
            raise CheckpointError(
                f"{self.folder} holds only DCP weight shards ({DCP_MODEL_DIR}/), no {self.file_name}; "
                f"merge them first: lerobot convert-dcp --checkpoint_dir={self.folder.parent}"
            )
        raise CheckpointError(f"{self.folder}: no {self.file_name}; the pretrained_model folder is incomplete")

