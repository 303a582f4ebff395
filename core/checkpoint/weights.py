"""What a checkpoint format is, and the two ways of storing weights the built-ins combine.

A format decides how a run's *weights* are stored; optimizer and training state are
the same for every format (DCP shards for sharded runs, safetensors otherwise).
Non-sharded runs always store one gathered file, whatever the format: there is
nothing to shard. A plugin format subclasses ``CheckpointFormat``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from torch import nn

from lerobot_kit.core.checkpoint import paths
from lerobot_kit.core.checkpoint.shard_writes import save_shards
from lerobot_kit.core.checkpoint.training_state import read_safetensors
from lerobot_kit.core.errors import CheckpointError, first_line
from lerobot_kit.core.model.peft import is_peft_model, to_model_keys, to_saved_keys


class CheckpointFormat(ABC):
    """Saves and loads model weights of a (possibly sharded) model. Both are collective."""

    @abstractmethod
    def save_weights(self, model: nn.Module, pretrained_dir: Path, *, sharded: bool, is_main: bool) -> str:
        """Write the weights; return what was written ("gathered", "dcp" or "gathered+dcp")."""

    def load_weights(self, model: nn.Module, pretrained_dir: Path, *, distributed: bool, is_main: bool) -> None:
        """Load weights into ``model`` on the current topology, from whatever the folder holds."""
        load_any_weights(model, pretrained_dir, distributed=distributed, is_main=is_main)


def write_gathered(model: nn.Module, pretrained_dir: Path, *, sharded: bool, is_main: bool) -> None:
    """One ``model.safetensors`` of full fp32 weights; the gather is collective, the main process writes.

    A PEFT model writes ``adapter_model.safetensors`` instead: only the adapter (and
    fully trained modules), under peft's saved names; the frozen base is never gathered.
    """
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    peft = is_peft_model(model)
    if sharded:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=peft)
        state = get_model_state_dict(model, options=options)
    else:
        state = model.state_dict()
    if is_main:
        if peft:
            state = to_saved_keys(model, state)
        tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}
        name = paths.ADAPTER_WEIGHTS if peft else paths.MODEL_WEIGHTS
        save_file(tensors, str(pretrained_dir / name), metadata={"format": "pt"})


def write_shards(model: nn.Module, pretrained_dir: Path) -> None:
    """DCP shards of the weights: every rank writes its own part, nothing is gathered
    (in the background under ``async_checkpoint``).

    A PEFT model's shards hold only the adapter, keyed as in ``adapter_model.safetensors``.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    peft = is_peft_model(model)
    state = get_model_state_dict(model, options=StateDictOptions(ignore_frozen_params=peft))
    if peft:
        state = to_saved_keys(model, state)
    save_shards(state, pretrained_dir / paths.DCP_MODEL_DIR)


def load_any_weights(model: nn.Module, pretrained_dir: Path, *, distributed: bool, is_main: bool) -> None:
    """DCP shards when present (reshard onto any topology), else the gathered file.

    A PEFT model loads only its adapter (the base was loaded from --policy.path).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    peft = is_peft_model(model)
    shards = pretrained_dir / paths.DCP_MODEL_DIR
    gathered = pretrained_dir / (paths.ADAPTER_WEIGHTS if peft else paths.MODEL_WEIGHTS)
    if shards.is_dir():
        state = get_model_state_dict(model, options=StateDictOptions(ignore_frozen_params=peft))
        if peft:
            state = to_saved_keys(model, state)
        try:
            dcp.load(state, checkpoint_id=str(shards))
        except Exception as exc:  # noqa: BLE001 - DCP raises many types for damaged shards
            raise CheckpointError(f"{shards}: cannot load the weight shards ({first_line(exc)})") from exc
        if peft:
            state = to_model_keys(model, state, shards)
        set_model_state_dict(model, state, options=StateDictOptions(strict=not peft))
        return
    if not gathered.is_file():
        raise CheckpointError(f"{pretrained_dir}: holds neither {gathered.name} nor {paths.DCP_MODEL_DIR}/")
    full = read_safetensors(gathered) if (is_main or not distributed) else {}
    if peft and full:
        full = to_model_keys(model, full, gathered)
    if distributed:
        set_model_state_dict(
            model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=not peft)
        )
    else:
        missing, unexpected = model.load_state_dict(full, strict=False)
        if unexpected or (missing and not peft):  # a PEFT model's base keys are never in the file
            raise CheckpointError(
                f"{gathered}: does not match the policy (missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
            )
