"""The policy contract the trainer drives, and the ``pretrained_model/`` folder format.

A policy sees only normalised batches (the processors of ``core.model.processor`` sit
around it), declares its FSDP wrap units and default PEFT targets as class
attributes, and can be built on the meta device: ``init_weights`` re-creates every
parameter from the torch RNG, and construction itself runs ``init_weights`` from the
RNG state it was entered with, so ``manual_seed(s); Policy(...)`` and ``manual_seed(s);
meta build; to_empty; init_weights()`` give the same weights.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import ClassVar

import torch
from pydantic import ValidationError
from torch import Tensor, nn

from lerobot_kit.core.checkpoint.paths import (
    ADAPTER_WEIGHTS,
    DATASET_META,
    POLICY_CONFIG,
    POSTPROCESSOR,
    PREPROCESSOR,
    find_pretrained_dir,
)
from lerobot_kit.core.checkpoint.stored_weights import StoredWeights
from lerobot_kit.core.checkpoint.weights import ModelWeights, write_weights_file
from lerobot_kit.core.config.schema import PolicyConfig
from lerobot_kit.core.data.dataset import ACTION_KEY, STATE_KEY, DatasetMeta
from lerobot_kit.core.errors import CheckpointError, ConfigError
from lerobot_kit.core.model.peft import attach_adapter, model_weights, recorded_base
from lerobot_kit.core.model.processor import PolicyProcessor


class Policy(nn.Module):
    """Base of every policy.

    A subclass captures ``rng = torch.get_rng_state()`` first thing in ``__init__``,
    calls ``super().__init__``, builds its modules, and ends with
    ``self._init_from_entry_rng(rng)``; that is what makes a CPU build and a
    meta-device build + ``init_weights`` agree.
    """

    config_class: ClassVar[type[PolicyConfig]]
    _fsdp_wrap_modules: ClassVar[list[str] | None] = None
    default_peft_targets: ClassVar[list[str] | str | None] = None
    # Set by action-chunking policies that use ``_next_from_queue``: deque(maxlen=n_action_steps).
    _action_queue: deque[Tensor]

    def __init__(self, config: PolicyConfig, meta: DatasetMeta) -> None:
        super().__init__()
        if not isinstance(config, self.config_class):
            raise ConfigError(
                f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__} "
                f"(policy.type={config.type!r})"
            )
        self.config = config
        self.meta = meta

    @classmethod
    def make_processors(cls, config: PolicyConfig, meta: DatasetMeta) -> tuple[PolicyProcessor, PolicyProcessor]:
        """The preprocessor a run applies to every batch, and the postprocessor of actions.

        The default normalises with the dataset's stats (``core.model.processor``). A
        policy that brings another library's normalisation overrides this, so the run
        trains with it and its checkpoints hold that library's processor files.
        """
        from lerobot_kit.core.model.processor import make_processors

        return make_processors(config, meta)

    def save_config(self, directory: Path) -> None:
        """Write ``config.json`` into a ``pretrained_model/`` folder: the config as JSON.

        A policy wrapping another library's model writes that library's config instead,
        so that the library loads the folder as its own.
        """
        _write_json(Path(directory) / POLICY_CONFIG, self.config.model_dump(mode="json"))

    def init_weights(self) -> None:
        """(Re)initialise every parameter and buffer from the current torch RNG, in module order.

        The default calls ``reset_parameters()`` on each submodule that has one; a policy
        with other parameters overrides this.
        """
        for module in self.modules():
            if module is not self and callable(getattr(module, "reset_parameters", None)):
                module.reset_parameters()

    def _init_from_entry_rng(self, rng_state: Tensor) -> None:
        """Re-seat the RNG where ``__init__`` began, then ``init_weights`` (see the module doc)."""
        torch.set_rng_state(rng_state)
        with torch.no_grad():
            self.init_weights()

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """Training loss on a normalised batch, plus detached scalar metrics."""
        raise NotImplementedError

    def loss_weight(self, batch: dict[str, Tensor]) -> Tensor | None:
        """How many terms this batch's loss averages over, for a loss whose divisor depends
        on the batch (a mean over the action entries that are not padding); ``None`` (the
        default) for a plain mean, where every batch of the same size weighs the same.

        Data-parallel workers each average over their own slice of the global batch. With a
        weight, the trainer rescales every worker's loss by its share of the weight summed
        over all workers, so the averaged gradient is the loss of one process on the whole
        global batch: a masked mean over every worker's valid entries, not a mean of
        per-worker masked means. Losses, gradients and a resume onto another number of
        workers then do not depend on how the global batch was split.
        """
        return None

    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        """Next normalised action [B, action_dim] for normalised observations."""
        raise NotImplementedError

    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """A normalised chunk of actions [B, chunk, action_dim], for policies that predict chunks."""
        raise NotImplementedError

    def _next_from_queue(self, batch: dict[str, Tensor]) -> Tensor:
        """``select_action`` of an action-chunking policy: pop ``self._action_queue``, and
        predict a new chunk (its first ``n_action_steps`` = the queue's ``maxlen``) only
        when the queue is empty, so a chunk is executed open-loop before re-planning."""
        queue = self._action_queue
        if not queue:
            chunk = self.predict_action_chunk(batch)[:, : queue.maxlen]
            queue.extend(chunk.transpose(0, 1))
        return queue.popleft()

    def reset(self) -> None:
        """Forget per-episode state (action queues); call at each episode start."""


def feature_dims(meta: DatasetMeta, policy_name: str) -> tuple[list[str], int, int]:
    """(camera keys, state size or 0 without a state, action size) for a policy that reads
    a state and/or cameras and predicts actions; refuses, naming the policy, a dataset
    that leaves it nothing to predict or nothing to observe."""
    if ACTION_KEY not in meta.features:
        raise ConfigError(f"{policy_name} needs an {ACTION_KEY!r} feature; the dataset has {sorted(meta.features)}")
    image_keys = meta.image_keys()
    state_dim = meta.features[STATE_KEY].shape[0] if STATE_KEY in meta.features else 0
    if not state_dim and not image_keys:
        raise ConfigError(
            f"{policy_name} needs {STATE_KEY!r} or an image feature; the dataset has {sorted(meta.features)}"
        )
    return image_keys, state_dim, meta.features[ACTION_KEY].shape[0]


def make_policy_processors(config: PolicyConfig, meta: DatasetMeta) -> tuple[PolicyProcessor, PolicyProcessor]:
    """The processors of the policy registered under ``config.type`` (``Policy.make_processors``)."""
    from lerobot_kit.core.registry.registry import get_registry

    return get_registry().policy(config.type).processors(config, meta)  # type: ignore[return-value]


def make_policy(config: PolicyConfig, meta: DatasetMeta) -> Policy:
    """Construct the policy registered under ``config.type`` (on the current default device)."""
    from lerobot_kit.core.registry.registry import get_registry

    return get_registry().policy(config.type).build(config, meta)


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
    _write_json(directory / DATASET_META, meta.to_json())
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
    """
    directory = find_pretrained_dir(Path(directory))
    stored = StoredWeights.of(directory) if load_weights else None
    if stored is not None and stored.adapter:
        model, preprocessor, postprocessor = load_peft_model(directory)
        return model.merge_and_unload(), preprocessor, postprocessor
    config, meta = _read_policy(directory)
    if stored is not None:
        stored.gathered_file()  # refuses a folder without its file before paying for the build
    policy = make_policy(config, meta)
    if stored is not None:
        _load_stored(model_weights(policy), stored)
    return policy, PolicyProcessor.load(directory, PREPROCESSOR), PolicyProcessor.load(directory, POSTPROCESSOR)


def load_pretrained_weights(policy: nn.Module, path: Path) -> None:
    """The weights of a pretrained folder (or step folder) into ``policy`` (``--policy.path``).

    Strict: a missing, extra or mis-shaped tensor means the folder was saved by another
    policy shape, which must not be half-loaded silently.
    """
    _load_stored(model_weights(policy), StoredWeights.of(find_pretrained_dir(Path(path))))


def load_peft_model(directory: Path) -> tuple[nn.Module, PolicyProcessor, PolicyProcessor]:
    """The base policy an adapter folder's ``adapter_config.json`` names, with the adapter
    applied (not merged), in inference mode.

    Strict where ``PeftModel.from_pretrained`` only warns: a missing or extra adapter
    tensor is an error. The processors are the adapter folder's (those the run trained with).
    """
    directory = find_pretrained_dir(Path(directory))
    stored = StoredWeights.of(directory)
    stored.require_kind(ADAPTER_WEIGHTS)
    stored.gathered_file()  # before loading the base
    base, _, _ = load_pretrained(recorded_base(directory))
    model = attach_adapter(base, directory)
    _load_stored(model_weights(model), stored)
    model.eval()
    return model, PolicyProcessor.load(directory, PREPROCESSOR), PolicyProcessor.load(directory, POSTPROCESSOR)


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
    from lerobot_kit.core.checkpoint.verify import check_pretrained
    from lerobot_kit.core.registry.registry import get_registry

    stored.require_kind(weights.naming.file_name)
    stored.gathered_file()
    check_pretrained(stored.folder)
    checkpoint_format = get_registry().checkpoint_format(stored.checkpoint_format)
    checkpoint_format.load_weights(weights, stored.folder, distributed=False, is_main=True)


def _read_policy(directory: Path) -> tuple[PolicyConfig, DatasetMeta]:
    """The policy config and dataset features a pretrained folder records."""
    from lerobot_kit.core.registry.registry import get_registry

    config_json = _read_json(directory / POLICY_CONFIG)
    policy_type = config_json.get("type")
    if not isinstance(policy_type, str):
        raise CheckpointError(f"{directory / POLICY_CONFIG}: no policy 'type' field")
    try:
        config = get_registry().policy(policy_type).config_class.model_validate(config_json)
    except ValidationError as exc:
        raise CheckpointError(f"{directory / POLICY_CONFIG}: not a valid {policy_type!r} config: {exc}") from None
    try:
        meta = DatasetMeta.from_json(_read_json(directory / DATASET_META))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory / DATASET_META}: malformed ({type(exc).__name__}: {exc})") from None
    return config, meta


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; the pretrained_model folder is incomplete") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc}); the file is damaged") from None
