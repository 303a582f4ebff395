"""The ``pretrained_model/`` folder: writing it, and rebuilding a policy and its processors from it.

What a loadable folder holds: the policy's ``config.json`` (its own or another library's,
``Policy.save_config``), ``dataset_meta.json``, the processors' files and the weights in
the naming of the model (``core.model.naming``). ``--policy.path``, ``load_pretrained``,
``lerobot eval`` and checkpoints all read and write it here.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError
from torch import Tensor, nn

from lerobot_kit.core.checkpoint.weights import write_weights_file
from lerobot_kit.core.config.schema import PolicyConfig
from lerobot_kit.core.data.dataset import DatasetMeta
from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.foreign_config import refused_config_advice
from lerobot_kit.core.layout.json_file import read_json, write_json
from lerobot_kit.core.layout.paths import (
    ADAPTER_WEIGHTS,
    DATASET_META,
    POLICY_CONFIG,
    POSTPROCESSOR,
    PREPROCESSOR,
    find_pretrained_dir,
)
from lerobot_kit.core.layout.stored_weights import StoredWeights
from lerobot_kit.core.layout.validate import check_loadable
from lerobot_kit.core.layout.validation_lines import file_line
from lerobot_kit.core.model.naming import ModelWeights
from lerobot_kit.core.model.peft import attach_adapter, model_weights, recorded_base
from lerobot_kit.core.model.policy import Policy, make_policy
from lerobot_kit.core.model.processor import PolicyProcessor


def save_pretrained(
    policy: nn.Module,
    meta: DatasetMeta,
    preprocessor: PolicyProcessor | None,
    postprocessor: PolicyProcessor | None,
    state_dict: dict[str, Tensor] | None,
    directory: Path,
) -> None:
    """Write a loadable ``pretrained_model/``; weights only when ``state_dict`` is given.

    ``policy`` may be wrapped (DDP, PEFT): its config comes from the ``Policy`` inside,
    and its weights are stored as every writer stores them (a PEFT model's adapter only,
    with ``adapter_config.json``). ``state_dict`` must hold full (gathered) tensors;
    checkpoints pass None and let their format write the weights.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    inner = next((m for m in policy.modules() if isinstance(m, Policy)), None)
    if inner is None:
        raise TypeError(f"save_pretrained needs a Policy (or a wrapper around one), got {type(policy).__name__}")
    inner.save_config(directory)
    write_json(directory / DATASET_META, meta.to_json())
    if preprocessor is not None:
        preprocessor.save(directory, PREPROCESSOR)
    if postprocessor is not None:
        postprocessor.save(directory, POSTPROCESSOR)
    weights = model_weights(policy)
    weights.naming.save_config(directory)
    if state_dict is not None:
        write_weights_file(weights, weights.naming.to_saved(state_dict), directory)


def load_pretrained(directory: Path, *, load_weights: bool = True) -> tuple[Policy, PolicyProcessor, PolicyProcessor]:
    """Rebuild a policy and its processors from a ``pretrained_model/`` (or its step folder).

    ``load_weights=False`` returns the freshly initialised policy, for callers that
    load weights another way.

    A folder recorded as a PEFT adapter gives its base policy, loaded from the path
    ``adapter_config.json`` records, with the adapter merged in: a plain ``Policy``
    (``load_peft_model`` keeps the adapter unmerged).

    Every file loading reads is checked first (``check_loadable``), so a damaged folder
    is one ``CheckpointError`` line naming the file before anything is built.
    """
    directory = find_pretrained_dir(Path(directory))
    check_loadable(directory)
    stored = StoredWeights.of(directory) if load_weights else None
    if stored is not None and stored.adapter:
        model, preprocessor, postprocessor = _adapter_on_base(directory)
        return model.merge_and_unload(), preprocessor, postprocessor
    config, meta = _read_policy(directory)
    if stored is not None:
        stored.gathered_file()  # refuses a folder without its file before paying for the build
    policy = make_policy(config, meta)
    if stored is not None:
        _load_stored(model_weights(policy), stored)
    return (policy, *type(policy).load_processors(directory))


def load_pretrained_weights(policy: nn.Module, path: Path) -> None:
    """The weights of a pretrained folder (or step folder) into ``policy`` (``--policy.path``).

    Strict: a missing, extra or mis-shaped tensor means the folder was saved by another
    policy shape, which must not be half-loaded silently. The run's spec checked the
    folder (``check_loadable``) before the model was built.
    """
    _load_stored(model_weights(policy), StoredWeights.of(find_pretrained_dir(Path(path))))


def load_peft_model(directory: Path) -> tuple[nn.Module, PolicyProcessor, PolicyProcessor]:
    """The base policy an adapter folder's ``adapter_config.json`` names, with the adapter
    applied (not merged), in inference mode.

    Strict where ``PeftModel.from_pretrained`` only warns: a missing or extra adapter
    tensor is an error. The processors are the adapter folder's (those the run trained with).
    """
    directory = find_pretrained_dir(Path(directory))
    check_loadable(directory)
    return _adapter_on_base(directory)


def _adapter_on_base(directory: Path) -> tuple[nn.Module, PolicyProcessor, PolicyProcessor]:
    """``load_peft_model`` of a folder ``check_loadable`` passed."""
    stored = StoredWeights.of(directory)
    stored.require_kind(ADAPTER_WEIGHTS)
    stored.gathered_file()  # before loading the base
    base, _, _ = load_pretrained(recorded_base(directory))
    model = attach_adapter(base, directory)
    _load_stored(model_weights(model), stored)
    model.eval()
    return (model, *type(base).load_processors(directory))


def merge_adapter(pretrained_dir: Path, output_dir: Path) -> Path:
    """Write ``output_dir`` as a plain ``pretrained_model/`` (``model.safetensors``) of base + adapter merged.

    The result loads without peft, with ``--policy.path`` or ``load_pretrained``.
    """
    policy, preprocessor, postprocessor = load_pretrained(pretrained_dir)
    save_pretrained(policy, policy.meta, preprocessor, postprocessor, policy.state_dict(), Path(output_dir))
    return Path(output_dir)


def _load_stored(weights: ModelWeights, stored: StoredWeights) -> None:
    """Load into one process's model, by the checkpoint format that wrote the weights.

    Needs the gathered file: loading here happens in each process on its own, before
    any parallelism, while DCP shards are read collectively by every rank of a group;
    ``lerobot convert-dcp`` merges them into the file.
    """
    from lerobot_kit.core.layout.verify import check_pretrained
    from lerobot_kit.core.registry.registry import get_registry

    stored.require_kind(weights.naming.file_name)
    stored.gathered_file()
    check_pretrained(stored.folder)
    checkpoint_format = get_registry().checkpoint_format(stored.checkpoint_format)
    checkpoint_format.load_weights(weights, stored.folder, distributed=False, is_main=True)


_DAMAGED = "the pretrained_model folder is incomplete or damaged"


def _read_policy(directory: Path) -> tuple[PolicyConfig, DatasetMeta]:
    """The policy config and dataset features a pretrained folder records."""
    from lerobot_kit.core.registry.registry import get_registry

    config_json = read_json(directory / POLICY_CONFIG, _DAMAGED)
    policy_type = config_json.get("type")
    if not isinstance(policy_type, str):
        raise CheckpointError(f"{directory / POLICY_CONFIG}: no policy 'type' field")
    try:
        config = get_registry().policy(policy_type).config_class.model_validate(config_json)
    except ValidationError as exc:
        raise CheckpointError(
            f"{directory / POLICY_CONFIG}: not a valid {policy_type!r} config: {file_line(exc.errors())}; "
            f"{refused_config_advice(config_json)}"
        ) from exc
    try:
        meta = DatasetMeta.from_json(read_json(directory / DATASET_META, _DAMAGED))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory / DATASET_META}: malformed ({type(exc).__name__}: {exc})") from exc
    return config, meta
