"""The policy contract the trainer drives.

A policy sees only normalised batches (the processors of ``core.model.processor`` sit
around it), declares its FSDP wrap units and default PEFT targets as class
attributes, and can be built on the meta device: ``init_weights`` re-creates every
parameter from the torch RNG, and construction itself runs ``init_weights`` from the
RNG state it was entered with, so ``manual_seed(s); Policy(...)`` and ``manual_seed(s);
meta build; to_empty; init_weights()`` give the same weights.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor, nn

from lerobot_kit.core.config.schema import PolicyConfig
from lerobot_kit.core.data.dataset import ACTION_KEY, STATE_KEY, DatasetMeta
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.layout.json_file import write_json
from lerobot_kit.core.layout.paths import POLICY_CONFIG, POSTPROCESSOR, PREPROCESSOR
from lerobot_kit.core.model.processor import PolicyProcessor
from lerobot_kit.core.registry.contracts import contract


# An optional entry of the metrics ``forward`` returns: the loss of each sample of the batch
# ([B], detached or not), from which a mixture's run logs each member's mean loss. Never
# logged itself.
PER_SAMPLE_LOSS = "per_sample_loss"


@contract
class Policy(nn.Module):
    """Base of every policy.

    A subclass captures ``rng = torch.get_rng_state()`` first thing in ``__init__``,
    calls ``super().__init__``, builds its modules, and ends with
    ``self._init_from_entry_rng(rng)``; that is what makes a CPU build and a
    meta-device build + ``init_weights`` agree.
    """

    config_class: ClassVar[type[PolicyConfig]]
    # Whether the policy takes batches in which some samples lack a camera (a mixture member
    # without it): their frame is a black placeholder flagged by ``missing_key(camera)``,
    # which the policy must mask out. Policies that do not declare it are refused such data.
    accepts_missing_cameras: ClassVar[bool] = False
    # Whether the policy zero-pads the state and action vectors to a width of its own, so
    # mixture members of different widths (zero-padded to the widest) can share it.
    pads_vectors: ClassVar[bool] = False
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

    @classmethod
    def load_processors(cls, directory: Path) -> tuple[PolicyProcessor, PolicyProcessor]:
        """The processors a ``pretrained_model/`` folder holds, as ``make_processors`` made
        them for the run that wrote it (``policy_preprocessor.json`` and its state files).

        A policy whose ``make_processors`` brings another library's processors overrides
        this to read that library's files.
        """
        return PolicyProcessor.load(directory, PREPROCESSOR), PolicyProcessor.load(directory, POSTPROCESSOR)

    def save_config(self, directory: Path) -> None:
        """Write ``config.json`` into a ``pretrained_model/`` folder: the config as JSON.

        A policy wrapping another library's model writes that library's config instead,
        so that the library loads the folder as its own.
        """
        write_json(Path(directory) / POLICY_CONFIG, self.config.model_dump(mode="json"))

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
    """The processors of the policy registered under ``config.type`` (``Policy.make_processors``):
    the one way ``train``, ``plan`` and evaluation during training get a new run's processors."""
    from lerobot_kit.core.registry.registry import get_registry

    return get_registry().policy(config.type).processors(config, meta)  # type: ignore[return-value]


def make_policy(config: PolicyConfig, meta: DatasetMeta) -> Policy:
    """Construct the policy registered under ``config.type`` (on the current default device)."""
    from lerobot_kit.core.registry.registry import get_registry

    return get_registry().policy(config.type).build(config, meta)
