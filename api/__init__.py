"""The stable surface of lerobot-kit, for plugin packages and notebooks.

Everything a plugin or a notebook needs is importable from here, and only what is
here is promised to stay: the names below keep their meaning and signatures while the
modules behind them are reorganised (they are re-exported, so moving an implementation
changes an import here, not in every plugin). Everything under ``lerobot_kit.core``,
``lerobot_kit.plugins`` and ``lerobot_kit.cli`` is internal and may move in any release,
so a plugin imports ``lerobot_kit.api`` and nothing else from lerobot-kit.

Stable:

* hooks: ``hookimpl``, the marker of a plugin's ``lerobot_register_*`` functions;
* configs: ``TrainConfig``, ``PolicyConfig``, ``DatasetConfig``, ``parse_train_config``; for a
  plugin's own JSON-valued flags, ``decode_json`` and ``read_json_file`` (finite numbers, bounded
  depth and size, no FIFO or device read), which raise ``UnusableJson`` with a one-phrase reason;
  for a plugin's own JSON files (a dataset's metadata), ``read_json(path, fix, error=...)``, the
  value or one line of the plugin's error naming the file, the problem and the fix,
  ``decode_json_bytes`` for bytes a plugin read its own way (``UnusableJson`` as a file read
  gives), and ``write_json(path, data)``, which writes them as lerobot-kit writes its own; for any
  other file a plugin hands a library, ``open_regular(path)``, which opens a regular file only
  and raises ``NotRegularFile`` (its ``kind``: "a named pipe", ...) without blocking on a pipe,
  and ``not_a_file_problem(mode)``, the words lerobot-kit's messages use for such a path
  ("a named pipe, not a file");
  ``byte_size``, a byte count as lerobot-kit's messages write it (``12.34 MiB``);
* training: ``train(config)``, what ``lerobot train`` runs — in a process group the caller
  initialised it joins that group and leaves it initialised, so a notebook or a sweep can
  run many configs in the same processes;
* running pieces: ``build_dataset``, ``build_policy``, ``load_pretrained``, and for PEFT
  checkpoints ``load_peft_model`` (the adapter unmerged) and ``merge_adapter``;
* policy contract: ``Policy`` (see its docstring and the example plugin's README),
  ``feature_dims`` (a policy's camera keys, state and action sizes from ``DatasetMeta``),
  ``PolicyProcessor``, the processor interface a policy's ``make_processors`` returns
  (a callable on batches with ``save(directory, name)``), and ``WeightShapes``, what a
  policy config implements (``weight_shapes(meta)``, torch-free) to have its checkpoints'
  weight shapes checked by ``inspect-checkpoint`` and ``convert-dcp``;
* dataset contract: ``PolicyDataset``, ``InMemoryDataset``, ``DatasetMeta``,
  ``FeatureSpec``, ``compute_stats``, the item keys ``STATE_KEY``, ``ACTION_KEY``,
  ``IMAGE_PREFIX``, ``pad_key``, ``INDEX_KEY`` (the frame) and ``EPOCH_KEY`` (the epoch of
  the data order a training batch's sample was drawn in: with ``INDEX_KEY`` it names one
  draw of a frame on any layout and after a resume); for readers of their own: ``STAT_NAMES``,
  ``vector_stats`` and ``PixelStats`` (exact statistics of vectors and of uint8 frames),
  ``camera_to_float``, ``EpisodeWindows`` and ``expand_delta_indices`` (frame windows
  within an episode, padded at its ends); ``ALL_CAMERAS`` and ``ALL_OBSERVATIONS``, the
  ``delta_indices`` keys that name every camera and every ``observation.*`` feature;
  ``MixtureDataset``, ``MixtureMember`` and ``member_delta_indices``, to train on several
  datasets as one (a dataset plugin builds the members, the mixture joins them), with the
  item keys ``MEMBER_KEY`` and ``missing_key``;
* checkpoint formats: ``CheckpointFormat``, ``ModelWeights`` (what a format is handed:
  the model and how its weights are named), ``model_weights``, the weight writers and
  readers ``gathered_state``, ``write_weights_file``, ``write_gathered``, ``write_shards``,
  ``load_state``, ``load_any_weights``, ``read_safetensors``, ``is_peft_model`` and the
  file names ``MODEL_WEIGHTS``, ``ADAPTER_WEIGHTS``, ``DCP_MODEL_DIR``;
* launchers: ``Launcher``, ``LaunchEnv``, ``env_int``, ``DEFAULT_MASTER_PORT``;
* evaluation environments: ``EnvConfig`` and ``VectorEnv`` (gymnasium's vector API, keyed
  by the dataset's feature names; see its docstring and ``lerobot_register_envs``), with
  its ``Observation`` and ``Info`` types;
* sharding contract: ``UnitGroup`` (see the block at the end of the imports);
* errors a plugin raises: ``ConfigError`` (bad flags or data for this plugin),
  ``CheckpointError`` (a missing or damaged file), ``PluginError`` (the plugin itself is
  unusable), all ``LerobotError``: the CLI prints their message as one line, without a
  traceback.

Importing this module does not import torch, so a plugin's hook module and config
classes stay light (``lerobot train --help`` and ``lerobot plugins`` import every plugin). The names that need torch
(``Policy``, ``feature_dims``, ``PolicyProcessor``, ``CheckpointFormat``, the weight I/O, ``is_peft_model``, ``train``) are imported on
first access; ``from lerobot_kit.api import *`` takes them all, and so imports torch.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.config.json_input import UnusableJson
from lerobot_kit.core.config.json_input import decode as decode_json
from lerobot_kit.core.config.json_input import read as read_json_file
from lerobot_kit.core.config.schema import DatasetConfig, EnvConfig, PolicyConfig, TrainConfig
from lerobot_kit.core.data.build import build_dataset
from lerobot_kit.core.data.dataset import (
    ACTION_KEY,
    EPOCH_KEY,
    IMAGE_PREFIX,
    INDEX_KEY,
    MEMBER_KEY,
    STAT_NAMES,
    STATE_KEY,
    DatasetMeta,
    FeatureSpec,
    InMemoryDataset,
    PixelStats,
    PolicyDataset,
    camera_to_float,
    compute_stats,
    missing_key,
    pad_key,
    vector_stats,
)
from lerobot_kit.core.data.mixture import MixtureDataset, MixtureMember, member_delta_indices
from lerobot_kit.core.data.windows import ALL_CAMERAS, ALL_OBSERVATIONS, EpisodeWindows, expand_delta_indices
from lerobot_kit.core.distributed.launcher import DEFAULT_MASTER_PORT, LaunchEnv, Launcher, env_int
from lerobot_kit.core.errors import CheckpointError, ConfigError, LerobotError, PluginError
from lerobot_kit.core.eval.env import Info, Observation, VectorEnv
from lerobot_kit.core.layout.byte_size import byte_size
from lerobot_kit.core.layout.file_access import not_a_file_problem
from lerobot_kit.core.layout.json_file import decode_json_bytes, read_json, write_json
from lerobot_kit.core.layout.paths import ADAPTER_WEIGHTS, DCP_MODEL_DIR, MODEL_WEIGHTS
from lerobot_kit.core.layout.regular_file import NotRegularFile, open_regular
from lerobot_kit.core.offline.weight_shapes import WeightShapes
from lerobot_kit.core.registry.hookspecs import hookimpl

# --- Unit groups: FSDP units for models that compute with their layers' submodules from
# outside the layers (joint attention over two towers). A policy's ``fsdp_unit_groups()``
# returns ``UnitGroup``s: modules sharded as one unit, and the method that runs them
# (see ``lerobot_kit.core.parallel.wrap_units``). Torch-free.
from lerobot_kit.core.parallel.unit_group import UnitGroup
# --- end of unit groups

if TYPE_CHECKING:
    from torch import nn

    from lerobot_kit.core.checkpoint.training_state import read_safetensors
    from lerobot_kit.core.checkpoint.weights import (
        CheckpointFormat,
        ModelWeights,
        gathered_state,
        load_any_weights,
        load_state,
        write_gathered,
        write_shards,
        write_weights_file,
    )
    from lerobot_kit.core.model.peft import is_peft_model, model_weights
    from lerobot_kit.core.model.policy import Policy, feature_dims
    from lerobot_kit.core.model.processor import PolicyProcessor
    from lerobot_kit.core.run.prepare import train

# Torch-backed names: (module, attribute), imported on first access by ``__getattr__``.
_LAZY: dict[str, tuple[str, str]] = {
    "Policy": ("lerobot_kit.core.model.policy", "Policy"),
    "feature_dims": ("lerobot_kit.core.model.policy", "feature_dims"),
    "PER_SAMPLE_LOSS": ("lerobot_kit.core.model.policy", "PER_SAMPLE_LOSS"),
    "PolicyProcessor": ("lerobot_kit.core.model.processor", "PolicyProcessor"),
    "CheckpointFormat": ("lerobot_kit.core.checkpoint.weights", "CheckpointFormat"),
    "ModelWeights": ("lerobot_kit.core.checkpoint.weights", "ModelWeights"),
    "gathered_state": ("lerobot_kit.core.checkpoint.weights", "gathered_state"),
    "write_weights_file": ("lerobot_kit.core.checkpoint.weights", "write_weights_file"),
    "write_gathered": ("lerobot_kit.core.checkpoint.weights", "write_gathered"),
    "write_shards": ("lerobot_kit.core.checkpoint.weights", "write_shards"),
    "load_state": ("lerobot_kit.core.checkpoint.weights", "load_state"),
    "load_any_weights": ("lerobot_kit.core.checkpoint.weights", "load_any_weights"),
    "read_safetensors": ("lerobot_kit.core.checkpoint.training_state", "read_safetensors"),
    "is_peft_model": ("lerobot_kit.core.model.peft", "is_peft_model"),
    "model_weights": ("lerobot_kit.core.model.peft", "model_weights"),
    "train": ("lerobot_kit.core.run.prepare", "train"),
}

__all__ = [
    "ACTION_KEY",
    "ADAPTER_WEIGHTS",
    "ALL_CAMERAS",
    "ALL_OBSERVATIONS",
    "DCP_MODEL_DIR",
    "DEFAULT_MASTER_PORT",
    "EPOCH_KEY",
    "IMAGE_PREFIX",
    "INDEX_KEY",
    "MEMBER_KEY",
    "MODEL_WEIGHTS",
    "PER_SAMPLE_LOSS",
    "STATE_KEY",
    "STAT_NAMES",
    "CheckpointError",
    "CheckpointFormat",
    "ConfigError",
    "DatasetConfig",
    "DatasetMeta",
    "EnvConfig",
    "EpisodeWindows",
    "FeatureSpec",
    "InMemoryDataset",
    "Info",
    "LaunchEnv",
    "Launcher",
    "MixtureDataset",
    "MixtureMember",
    "LerobotError",
    "ModelWeights",
    "NotRegularFile",
    "Observation",
    "PixelStats",
    "PluginError",
    "Policy",
    "PolicyConfig",
    "PolicyDataset",
    "PolicyProcessor",
    "TrainConfig",
    "UnitGroup",
    "UnusableJson",
    "VectorEnv",
    "WeightShapes",
    "build_dataset",
    "build_policy",
    "byte_size",
    "camera_to_float",
    "compute_stats",
    "decode_json",
    "decode_json_bytes",
    "env_int",
    "expand_delta_indices",
    "feature_dims",
    "gathered_state",
    "hookimpl",
    "is_peft_model",
    "load_any_weights",
    "load_peft_model",
    "load_pretrained",
    "load_state",
    "member_delta_indices",
    "merge_adapter",
    "missing_key",
    "model_weights",
    "not_a_file_problem",
    "open_regular",
    "pad_key",
    "parse_train_config",
    "read_json",
    "read_json_file",
    "read_safetensors",
    "train",
    "vector_stats",
    "write_gathered",
    "write_json",
    "write_shards",
    "write_weights_file",
]


def build_policy(config: PolicyConfig, meta: DatasetMeta) -> Policy:
    """A new policy of the type ``config.type`` names, for a dataset described by ``meta``,
    on torch's current default device (``with torch.device("meta"):`` builds it without storage)."""
    from lerobot_kit.core.model.policy import make_policy

    return make_policy(config, meta)


def load_peft_model(path: str | Path) -> tuple[nn.Module, PolicyProcessor, PolicyProcessor]:
    """``(model, preprocessor, postprocessor)`` from an adapter's ``pretrained_model/`` (or its
    step folder): its base policy with the adapter applied, not merged, in inference mode."""
    from lerobot_kit.core.checkpoint.pretrained import load_peft_model as load

    return load(Path(path))


def merge_adapter(pretrained_dir: str | Path, output_dir: str | Path) -> Path:
    """Write ``output_dir`` as a plain ``pretrained_model/`` of base and adapter merged, which
    loads without peft (``--policy.path``, ``load_pretrained``)."""
    from lerobot_kit.core.checkpoint.pretrained import merge_adapter as merge

    return merge(Path(pretrained_dir), Path(output_dir))


def load_pretrained(path: str | Path) -> tuple[Policy, PolicyProcessor, PolicyProcessor]:
    """``(policy, preprocessor, postprocessor)`` from a ``pretrained_model/`` folder or its step
    folder; a PEFT folder gives its base policy with the adapter merged in. The processors
    map raw observations to the policy's normalised inputs and its actions back."""
    from lerobot_kit.core.checkpoint.pretrained import load_pretrained as load

    return load(Path(path))


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
