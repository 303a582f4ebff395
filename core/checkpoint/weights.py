"""Reading and writing model weights: the functions every path goes through.

Checkpoint formats (built-in and plugins), ``save_pretrained``, ``load_pretrained``,
``--policy.path`` and resume all store and load weights with the functions below, so a
gathered file, DCP shards and a PEFT adapter in either are written by one piece of code
and read back by another, whoever asks.

*Which* tensors are stored, under which names and in which file, is the model's
``ModelWeights`` (``core.model.naming``); *where* weights are read from is what the
checkpoint recorded (``StoredWeights``), not whichever files happen to exist.

A checkpoint format decides how a run's weights are stored; optimizer and training
state are the same for every format. A plugin format subclasses ``CheckpointFormat``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from lerobot_kit.core.checkpoint.shard_writes import save_shards
from lerobot_kit.core.checkpoint.training_state import read_safetensors
from lerobot_kit.core.checkpoint.write_failures import held_until_phase_end
from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.file_modes import save_safetensors
from lerobot_kit.core.layout.stored_weights import StoredWeights
from lerobot_kit.core.model.naming import ModelWeights
from lerobot_kit.core.registry.contracts import contract

# --- writing ------------------------------------------------------------------------------


def gathered_state(weights: ModelWeights, *, sharded: bool, is_main: bool) -> dict[str, Tensor]:
    """The full tensors to store, under their stored names, on the CPU: on the main process;
    empty on the others. Collective when ``sharded``; only stored parameters are gathered."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    if sharded:
        options = StateDictOptions(
            full_state_dict=True, cpu_offload=True, ignore_frozen_params=not weights.naming.include_frozen
        )
        state = get_model_state_dict(weights.model, options=options)  # full tensors on the main process only
    elif is_main:
        state = weights.model.state_dict()
    if not is_main:
        return {}
    return {name: tensor.detach().to("cpu") for name, tensor in weights.naming.to_saved(state).items()}


def write_weights_file(
    weights: ModelWeights, tensors: dict[str, Tensor], pretrained_dir: Path, *, metadata: dict[str, str] | None = None
) -> Path:
    """Main process only: ``tensors`` (stored names, as ``gathered_state`` gives them, or
    re-encoded by a format) as the model's weights file, with extra safetensors ``metadata``.

    During a checkpoint save, a refused write is held until the save's phase ends, where
    every rank stops alike (``write_failures``): a format's collectives after this call
    (DCP shards after the gathered file) still run on every rank.
    """
    path = weights.file_in(pretrained_dir)
    with held_until_phase_end():
        save_safetensors(_own_storage(tensors), path, metadata={"format": "pt", **(metadata or {})})
    return path


def write_gathered(weights: ModelWeights, pretrained_dir: Path, *, sharded: bool, is_main: bool) -> None:
    """One file of full weights (the adapter's only, for PEFT): gathered collectively, written by the main process."""
    state = gathered_state(weights, sharded=sharded, is_main=is_main)
    if is_main:
        write_weights_file(weights, state, pretrained_dir)


def write_shards(weights: ModelWeights, pretrained_dir: Path) -> None:
    """DCP shards under the stored names: every rank writes its own part, nothing is
    gathered (in the background under ``async_checkpoint``)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    options = StateDictOptions(ignore_frozen_params=not weights.naming.include_frozen)
    state = get_model_state_dict(weights.model, options=options)
    save_shards(weights.naming.to_saved(state), pretrained_dir / paths.DCP_MODEL_DIR)


def _own_storage(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Contiguous CPU tensors, each alone in its storage: safetensors refuses views into a
    larger storage and tensors sharing one. Copies only those."""
    owned: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, tensor in tensors.items():
        tensor = tensor.detach().to("cpu").contiguous()
        storage = tensor.untyped_storage()
        if tensor.numel() and (storage.data_ptr() in seen or storage.nbytes() != tensor.nbytes):
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        owned[name] = tensor
    return owned


# --- reading ------------------------------------------------------------------------------

SHAPE_FIX = (
    "load it with the policy settings it was saved with (its pretrained_model/config.json records them), "
    "or start a new run in another --output_dir"
)


def load_state(
    weights: ModelWeights, saved: dict[str, Tensor], *, source: Path, distributed: bool, is_main: bool
) -> None:
    """Load full tensors under their stored names into the model, on the current topology.

    Distributed, only the main process passes them (the others pass ``{}``) and they are
    broadcast and resharded; collective then. Names and shapes are checked first (on the
    main process, which tells the others), so a file of another model shape fails on
    every rank with one line.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    naming = weights.naming
    problem = None
    state: dict[str, Any] = {}
    if is_main or not distributed:
        try:
            state = naming.to_model(saved, source)
            problem = _shape_mismatch(weights.model, state, source)
        except CheckpointError as exc:
            problem = str(exc)
    if distributed:
        problem = _from_main(problem)
    if problem is not None:
        raise CheckpointError(problem)
    if distributed:
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=naming.include_frozen)
        set_model_state_dict(weights.model, state, options=options)
        return
    weights.model.load_state_dict(state, strict=naming.include_frozen)


def _shape_mismatch(model: nn.Module, state: dict[str, Any], source: Path) -> str | None:
    """The first tensor of ``state`` whose shape is not the model's (a sharded model's global shape)."""
    for name, mine in model.state_dict().items():
        if name in state and tuple(state[name].shape) != tuple(mine.shape):
            return (
                f"{source} does not fit this {type(model).__name__} (saved with other settings): size mismatch for "
                f"{name}: {list(state[name].shape)} in the checkpoint, {list(mine.shape)} in the model; {SHAPE_FIX}"
            )
    return None


def _from_main(problem: str | None) -> str | None:
    """Collective: the main process's verdict, on every rank."""
    import torch.distributed as dist

    box = [problem]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def load_shards(weights: ModelWeights, shard_dir: Path) -> None:
    """Collective: DCP shards resharded onto the model's current layout, each rank reading its part."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    from lerobot_kit.core.checkpoint.safe_dcp import load_dcp

    naming = weights.naming
    options = StateDictOptions(ignore_frozen_params=not naming.include_frozen)
    state = naming.to_saved(get_model_state_dict(weights.model, options=options))
    load_dcp(state, shard_dir, what="weight shards", fix=SHAPE_FIX)
    state = naming.to_model(state, shard_dir)
    set_model_state_dict(weights.model, state, options=StateDictOptions(strict=naming.include_frozen))


def reads_shards(stored: StoredWeights, *, distributed: bool) -> bool:
    """Whether ``load_any_weights`` reads the DCP shards (else the gathered file)."""
    return stored.shards and (distributed or not stored.gathered)


def load_any_weights(weights: ModelWeights, pretrained_dir: Path, *, distributed: bool, is_main: bool) -> None:
    """The weights ``pretrained_dir`` records into the model, on the current topology.

    Distributed, DCP shards when recorded (each rank reads its part; any topology), else
    the gathered file, read by the main process and broadcast. One process, the gathered
    file when recorded (no DCP planning), else the shards.
    """
    stored = StoredWeights.of(pretrained_dir)
    stored.require_kind(weights.naming.file_name)
    if reads_shards(stored, distributed=distributed):
        load_shards(weights, stored.shard_dir)
        return
    path = stored.gathered_file()
    saved = read_safetensors(path) if (is_main or not distributed) else {}
    load_state(weights, saved, source=path, distributed=distributed, is_main=is_main)


# --- formats ------------------------------------------------------------------------------


@contract
class CheckpointFormat(ABC):
    """Saves and loads a run's weights (``--checkpoint_format``). Both are collective.

    ``weights`` holds the model (possibly FSDP-sharded) and its naming; hand it to the
    functions above, which store the right tensors under the right names, adapters included.
    """

    @abstractmethod
    def save_weights(self, weights: ModelWeights, pretrained_dir: Path, *, sharded: bool, is_main: bool) -> str:
        """Write the weights; return what was written ("gathered", "dcp" or "gathered+dcp")."""

    def load_weights(self, weights: ModelWeights, pretrained_dir: Path, *, distributed: bool, is_main: bool) -> None:
        """Load the weights into the model on the current topology, from what the folder records."""
        load_any_weights(weights, pretrained_dir, distributed=distributed, is_main=is_main)
