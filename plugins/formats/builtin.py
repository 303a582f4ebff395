"""The three built-in formats, built from the two weight writers.

Each says only *how* weights are laid out; which tensors are stored under which names
(the full model, or a PEFT adapter) comes with ``weights`` and is applied by the writers.
"""

from __future__ import annotations

from pathlib import Path

from lerobot_kit.api import CheckpointFormat, ModelWeights, write_gathered, write_shards


class SafetensorsFormat(CheckpointFormat):
    """Default: one gathered ``model.safetensors``, loadable at once anywhere."""

    def save_weights(self, weights: ModelWeights, pretrained_dir: Path, *, sharded: bool, is_main: bool) -> str:
        write_gathered(weights, pretrained_dir, sharded=sharded, is_main=is_main)
        return "gathered"


class DcpFormat(CheckpointFormat):
    """Shards only: fast saves and resumes; ``convert-dcp`` makes the single file later.
    A run that is not sharded has nothing to shard and stores the gathered file."""

    def save_weights(self, weights: ModelWeights, pretrained_dir: Path, *, sharded: bool, is_main: bool) -> str:
        if not sharded:
            write_gathered(weights, pretrained_dir, sharded=False, is_main=is_main)
            return "gathered"
        write_shards(weights, pretrained_dir)
        return "dcp"


class SafetensorsDcpFormat(CheckpointFormat):
    """Both: shards for fast resharding resumes and one file for loading."""

    def save_weights(self, weights: ModelWeights, pretrained_dir: Path, *, sharded: bool, is_main: bool) -> str:
        write_gathered(weights, pretrained_dir, sharded=sharded, is_main=is_main)
        if not sharded:
            return "gathered"
        write_shards(weights, pretrained_dir)
        return "gathered+dcp"
