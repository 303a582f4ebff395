"""The three built-in formats of SPEC S6.2, built from the two weight writers."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from lerobot_kit.core.checkpoint.weights import CheckpointFormat, write_gathered, write_shards


class SafetensorsFormat(CheckpointFormat):
    """Default: one gathered ``model.safetensors``, loadable at once anywhere."""

    def save_weights(self, model: nn.Module, pretrained_dir: Path, *, sharded: bool, is_main: bool) -> str:
        write_gathered(model, pretrained_dir, sharded=sharded, is_main=is_main)
        return "gathered"


class DcpFormat(CheckpointFormat):
    """Shards only: fast saves and resumes; ``convert-dcp`` makes the single file later."""

    def save_weights(self, model: nn.Module, pretrained_dir: Path, *, sharded: bool, is_main: bool) -> str:
        if not sharded:
            write_gathered(model, pretrained_dir, sharded=False, is_main=is_main)
            return "gathered"
        write_shards(model, pretrained_dir)
        return "dcp"


class SafetensorsDcpFormat(CheckpointFormat):
    """Both: shards for fast resharding resumes and one file for loading."""

    def save_weights(self, model: nn.Module, pretrained_dir: Path, *, sharded: bool, is_main: bool) -> str:
        write_gathered(model, pretrained_dir, sharded=sharded, is_main=is_main)
        if not sharded:
            return "gathered"
        write_shards(model, pretrained_dir)
        return "gathered+dcp"
