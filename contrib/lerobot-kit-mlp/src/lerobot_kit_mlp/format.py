"""The ``safetensors_fp16`` checkpoint format: the gathered weights file at half the size.

``--checkpoint_format=safetensors_fp16`` writes the usual ``model.safetensors``, but with
every float32 tensor stored as float16, for runs whose checkpoints are shipped rather
than resumed bit-exactly. The file lists the tensors it narrowed in its metadata, and
loading widens exactly those back to float32, so:

* ``--policy.path`` loads it like any weights file (PyTorch copies fp16 into fp32);
* ``--resume=true`` restores it through ``load_weights`` below on any topology; the
  optimizer state keeps full precision (the toolkit stores it, not the format), so a
  resumed run continues from weights rounded to fp16 — close to, not equal to, an
  uninterrupted run;
* a float32 tensor with a value beyond float16's range stays float32 rather than
  becoming inf;
* a PEFT run's adapter is small, so it is stored as the built-in ``safetensors`` format
  stores it (``adapter_model.safetensors``, full precision): a format handles the cases
  it cares about and hands the others to the toolkit's writers and readers.

A format decides only how weights are written and read; the rest of the checkpoint is
the toolkit's. ``save_weights`` and ``load_weights`` are collective: every rank calls
them, only the main process touches the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from lerobot_kit.api import (
    MODEL_WEIGHTS,
    CheckpointError,
    CheckpointFormat,
    is_peft_model,
    read_safetensors,
    write_gathered,
)

NARROWED_KEY = "lerobot_kit_mlp.fp16_from_fp32"  # metadata: JSON list of tensors stored narrowed
FP16_MAX = torch.finfo(torch.float16).max


class Fp16SafetensorsFormat(CheckpointFormat):
    def save_weights(self, model: nn.Module, pretrained_dir: Path, *, sharded: bool, is_main: bool) -> str:
        if is_peft_model(model):
            write_gathered(model, pretrained_dir, sharded=sharded, is_main=is_main)
            return "gathered"
        if sharded:
            # Collective gather of full tensors; with cpu_offload only the main process gets them.
            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        else:
            state = model.state_dict()
        if is_main:
            tensors, narrowed = narrow_to_fp16(state)
            metadata = {"format": "pt", NARROWED_KEY: json.dumps(narrowed)}
            save_file(tensors, str(pretrained_dir / MODEL_WEIGHTS), metadata=metadata)
        # One of the toolkit's weight kinds: inspect-checkpoint then checks model.safetensors is there.
        return "gathered"

    def load_weights(self, model: nn.Module, pretrained_dir: Path, *, distributed: bool, is_main: bool) -> None:
        if is_peft_model(model):
            super().load_weights(model, pretrained_dir, distributed=distributed, is_main=is_main)
            return
        path = pretrained_dir / MODEL_WEIGHTS
        if not path.is_file():
            raise CheckpointError(f"{pretrained_dir}: no {MODEL_WEIGHTS}, which format safetensors_fp16 writes")
        if not distributed:
            try:
                model.load_state_dict(read_widened(path), strict=True)
            except RuntimeError as exc:
                raise CheckpointError(f"{path}: does not match the policy ({exc})") from None
            return
        # The main process reads; set_model_state_dict broadcasts and reshards the tensors.
        full = read_widened(path) if is_main else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True)
        set_model_state_dict(model, full, options=options)


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
    except json.JSONDecodeError:
        raise CheckpointError(f"{path}: metadata {NARROWED_KEY!r} is not valid JSON; the file is damaged") from None
    for name in narrowed:
        if name in tensors:
            tensors[name] = tensors[name].to(torch.float32)
    return tensors
