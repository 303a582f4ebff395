"""The ``safetensors_fp16`` checkpoint format: the gathered weights file at half the size.

``--checkpoint_format=safetensors_fp16`` writes the usual gathered weights file, but with
every float32 tensor stored as float16, for runs whose checkpoints are shipped rather
than resumed bit-exactly. The file lists the tensors it narrowed in its metadata, and
loading widens exactly those back to float32, so:

* ``--policy.path`` and ``load_pretrained`` read it through ``load_weights`` below: the
  checkpoint records which format wrote it;
* ``--resume=true`` restores it through ``load_weights`` as well, on any topology; the
  optimizer state keeps full precision (the toolkit stores it, not the format), so a
  resumed run continues from weights rounded to fp16 — close to, not equal to, an
  uninterrupted run;
* a float32 tensor with a value beyond float16's range stays float32 rather than
  becoming inf;
* a PEFT run's adapter is narrowed the same way, with no code here: the toolkit's
  ``gathered_state``, ``write_weights_file`` and ``load_state`` pick the tensors, their
  names and the file (``adapter_model.safetensors``) from ``weights``; a format only
  encodes them.

A format decides only how weights are written and read; the rest of the checkpoint is
the toolkit's. ``save_weights`` and ``load_weights`` are collective: every rank calls
them, only the main process touches the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from lerobot_kit.api import (
    CheckpointError,
    CheckpointFormat,
    ModelWeights,
    gathered_state,
    load_state,
    read_safetensors,
    write_weights_file,
)

NARROWED_KEY = "lerobot_kit_mlp.fp16_from_fp32"  # metadata: JSON list of tensors stored narrowed
FP16_MAX = torch.finfo(torch.float16).max


class Fp16SafetensorsFormat(CheckpointFormat):
    def save_weights(self, weights: ModelWeights, pretrained_dir: Path, *, sharded: bool, is_main: bool) -> str:
        # Collective gather of full tensors; only the main process gets them.
        state = gathered_state(weights, sharded=sharded, is_main=is_main)
        if is_main:
            tensors, narrowed = narrow_to_fp16(state)
            write_weights_file(weights, tensors, pretrained_dir, metadata={NARROWED_KEY: json.dumps(narrowed)})
        # One of the toolkit's weight kinds: inspect-checkpoint then checks the file is there.
        return "gathered"

    def load_weights(self, weights: ModelWeights, pretrained_dir: Path, *, distributed: bool, is_main: bool) -> None:
        path = weights.file_in(pretrained_dir)
        # The main process reads; distributed, load_state broadcasts and reshards the tensors.
        saved = read_widened(path) if (is_main or not distributed) else {}
        load_state(weights, saved, source=path, distributed=distributed, is_main=is_main)


def narrow_to_fp16(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """CPU copies of ``state`` with float32 tensors as float16, and the names narrowed."""
    tensors: dict[str, torch.Tensor] = {}
    narrowed: list[str] = []
    for name, tensor in state.items():
        tensor = tensor.detach().to("cpu")
        # NaN fails the comparison too, so a diverged tensor is kept as it is.
        if tensor.dtype == torch.float32 and (tensor.numel() == 0 or bool(tensor.abs().max() <= FP16_MAX)):
            tensor = tensor.to(torch.float16)
            narrowed.append(name)
        tensors[name] = tensor.contiguous()
    return tensors, narrowed


def read_widened(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``path``, those this format narrowed back in float32 (others as stored)."""
    tensors = read_safetensors(path)
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
    try:
        narrowed = json.loads(metadata.get(NARROWED_KEY, "[]"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: metadata {NARROWED_KEY!r} is not valid JSON; the file is damaged") from exc
    for name in narrowed:
        if name in tensors:
            tensors[name] = tensors[name].to(torch.float32)
    return tensors
