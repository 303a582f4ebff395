"""PEFT (adapter) fine-tuning around the ``peft`` package.

The policy is wrapped in a ``peft.PeftModel`` *before* it is parallelised, on every
rank alike (on the meta device where the layout builds there), so FSDP2 shards the
frozen base together with the adapters and no rank ever wraps twice, also on resume.

Checkpoints hold only what ``peft`` itself would save: the adapter tensors (and the
``--peft.full_training_modules``) under ``peft.get_peft_model_state_dict``'s naming,
adapter name stripped, next to a genuine ``adapter_config.json`` written by ``peft``'s
own config class. So ``PeftModel.from_pretrained(base_policy, pretrained_model_dir)``
loads a checkpoint as is, and the DCP shards ``convert-dcp`` merges carry the same keys.
The mapping between model parameter names and saved names comes from running peft's
saver over placeholder tensors, never from re-implementing its naming rules; it is
``PeftNaming``, which the toolkit's weight readers and writers (``core.checkpoint.weights``)
apply, so no format or loader has code of its own for adapters.

``peft`` imports ``transformers`` (seconds), so it is imported only when
``--peft.method_type`` is set or a PEFT checkpoint is loaded.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lerobot_kit.core.config.schema import PeftConfig, TrainConfig
from lerobot_kit.core.errors import CheckpointError, ConfigError
from lerobot_kit.core.layout.file_rules import PEFT_METHODS, adapter_config_problems
from lerobot_kit.core.layout.json_file import read_json
from lerobot_kit.core.layout.paths import ADAPTER_CONFIG, ADAPTER_WEIGHTS, find_pretrained_dir
from lerobot_kit.core.model.naming import FullNaming, ModelWeights, WeightNaming

if TYPE_CHECKING:
    from lerobot_kit.core.model.policy import Policy

INSTALL_HINT = "pip install 'lerobot-kit[peft]'"
ADAPTER_NAME = "default"  # peft's default; saved keys never contain it

# Methods that adapt plain nn.Linear/Conv layers of any nn.Module by name and train with
# an ordinary optimizer loop: --peft.method_type -> peft config class. The checkpoint
# check knows them too (an adapter_config.json of another peft_type does not load).
METHODS: dict[str, str] = PEFT_METHODS


def import_peft() -> ModuleType:
    try:
        import peft
    except ImportError as exc:
        raise ConfigError(f"--peft.method_type needs the peft package, which is not installed: {INSTALL_HINT}") from exc
    return peft


def is_peft_model(model: nn.Module) -> bool:
    """True for a ``PeftModel`` (also once ``fully_shard`` has swapped its class); never imports peft."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def unwrapped_policy(model: nn.Module) -> nn.Module:
    """The policy itself under a PEFT wrapper, whose own methods (``loss_weight``) the
    wrapper does not forward; ``model`` when it is not wrapped."""
    return model.get_base_model() if is_peft_model(model) else model


def check_request(config: TrainConfig) -> None:
    """Refuse an unusable PEFT request before any data or model is built."""
    method = config.peft.method_type
    if method is None:
        return
    if method.upper() not in METHODS:
        raise ConfigError(
            f"--peft.method_type={method!r} is not a known PEFT method; known: {', '.join(METHODS)}"
        )
    if not config.policy.path:
        raise ConfigError(
            f"--peft.method_type={method} fine-tunes a pretrained policy, but --policy.path is not set: pass "
            "--policy.path=<checkpoint step folder or its pretrained_model/> (adapters on a randomly "
            "initialised base would learn nothing useful; drop --peft.method_type to train from scratch)"
        )
    if method.upper() != "LORA" and config.peft.lora_dropout:
        raise ConfigError(f"--peft.lora_dropout applies to LORA only, not to --peft.method_type={method}")
    import_peft()


def base_path_of(policy_path: str | Path) -> Path:
    """The absolute ``pretrained_model/`` folder a ``--policy.path`` names: what adapter_config.json records."""
    return find_pretrained_dir(Path(policy_path)).resolve()


def wrap_policy(policy: Policy, peft_config: PeftConfig, base_path: Path) -> nn.Module:
    """Freeze ``policy`` and add adapters: a ``PeftModel`` whose module paths start ``base_model.model.``.

    Works on a meta-device policy too (the adapters are then on meta as well), so every
    rank of a sharded layout wraps the same structure.
    """
    peft = import_peft()
    targets = peft_config.target_modules or type(policy).default_peft_targets
    if not targets:
        raise ConfigError(
            f"{type(policy).__name__} declares no default_peft_targets: pass --peft.target_modules "
            "(a list of module names or a regex over module paths)"
        )
    _check_matches(policy, targets, "--peft.target_modules")
    if peft_config.full_training_modules:
        _check_matches(policy, peft_config.full_training_modules, "--peft.full_training_modules")
    config = _method_config(peft, peft_config, targets, base_path)
    try:
        return peft.PeftModel(policy, config, adapter_name=ADAPTER_NAME)
    except ValueError as exc:  # e.g. a target that is a container, not a layer peft can adapt
        raise ConfigError(f"--peft.method_type={peft_config.method_type}: peft cannot adapt this policy: {exc}") from exc


def _method_config(peft: ModuleType, peft_config: PeftConfig, targets: list[str] | str, base_path: Path) -> Any:
    method = str(peft_config.method_type).upper()
    common: dict[str, Any] = {
        "target_modules": targets,
        "modules_to_save": peft_config.full_training_modules,
        "base_model_name_or_path": str(base_path),
    }
    alpha = peft_config.lora_alpha if peft_config.lora_alpha is not None else peft_config.r
    specific: dict[str, dict[str, Any]] = {
        "LORA": {"r": peft_config.r, "lora_alpha": alpha, "lora_dropout": peft_config.lora_dropout},
        "LOHA": {"r": peft_config.r, "alpha": alpha},
        "LOKR": {"r": peft_config.r, "alpha": alpha},
        "IA3": {"feedforward_modules": []},
    }
    return getattr(peft, METHODS[method])(**common, **specific[method])


def _module_matches(path: str, pattern: list[str] | str) -> bool:
    """peft's rule: a list names modules by (a suffix of whole) name, a string is a regex over the full path."""
    if isinstance(pattern, str):
        return re.fullmatch(pattern, path) is not None
    return any(path == name or path.endswith("." + name) for name in pattern)


def _check_matches(policy: nn.Module, pattern: list[str] | str, flag: str) -> None:
    """Every listed name (or the regex) must select a module, or the request is a typo."""
    paths = [path for path, _ in policy.named_modules() if path]
    if isinstance(pattern, str):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{flag}={pattern!r} is not a valid regex: {exc}") from exc
        missing = [] if any(_module_matches(p, pattern) for p in paths) else [pattern]
    else:
        missing = [name for name in pattern if not any(_module_matches(p, [name]) for p in paths)]
    if missing:
        layers = sorted({p.rpartition(".")[2] for p, m in policy.named_modules() if p and not list(m.children())})
        how = "a string is a regex over whole module paths such as 'encoder.layers.0.self_attn.q_proj', so " \
              "start it with '.*'" if isinstance(pattern, str) else "names match a module's name or path suffix"
        raise ConfigError(
            f"{flag}: {', '.join(repr(m) for m in missing)} matches no module of {type(policy).__name__} ({how}); "
            f"its layer names are: {', '.join(layers)}"
        )


# --- stored naming ----------------------------------------------------------------------


def saved_key_map(model: nn.Module) -> dict[str, str]:
    """Model state-dict key -> key in ``adapter_model.safetensors``, for the adapter's tensors.

    Runs peft's own saver over placeholder tensors and follows them by identity, so the
    keys are exactly peft's, whatever the method. Cheap and collective-free on sharded models.
    """
    peft = import_peft()
    placeholders = {key: torch.empty(0) for key in model.state_dict().keys()}
    saved = peft.get_peft_model_state_dict(
        model, state_dict=placeholders, adapter_name=ADAPTER_NAME, save_embedding_layers=False
    )
    key_of = {id(tensor): key for key, tensor in placeholders.items()}
    return {key_of[id(tensor)]: saved_key for saved_key, tensor in saved.items()}


class PeftNaming(WeightNaming):
    """A PEFT model stores only what peft itself saves: the adapter (and the
    ``--peft.full_training_modules``) under peft's names, in ``adapter_model.safetensors``,
    next to peft's ``adapter_config.json``. The frozen base is never stored: it is the
    ``--policy.path`` the run started from."""

    file_name = ADAPTER_WEIGHTS
    include_frozen = False

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._saved_key = saved_key_map(model)  # computed once: it runs peft's saver

    def to_saved(self, state: dict[str, Any]) -> dict[str, Any]:
        missing = [key for key in self._saved_key if key not in state]
        if missing:
            raise RuntimeError(f"the state dict lacks adapter tensors {missing[:3]}: were frozen adapters dropped?")
        return {saved: state[key] for key, saved in self._saved_key.items()}

    def to_model(self, saved: dict[str, Any], source: Path) -> dict[str, Any]:
        model_key = {saved_key: key for key, saved_key in self._saved_key.items()}
        unexpected = sorted(set(saved) - set(model_key))
        missing = sorted(set(model_key) - set(saved))
        if unexpected or missing:
            raise CheckpointError(
                f"{source}: does not fit this adapter configuration (missing {missing[:3]}, unexpected "
                f"{unexpected[:3]}); was it saved with other --peft settings or another policy shape?"
            )
        return {model_key[key]: tensor for key, tensor in saved.items()}

    def save_config(self, directory: Path) -> None:
        """``adapter_config.json``, written by peft's own config class (so peft loads it as its own)."""
        self._model.peft_config[ADAPTER_NAME].save_pretrained(str(directory))


def model_weights(model: nn.Module) -> ModelWeights:
    """``model`` with the naming its weights are stored under: the one place where a PEFT
    model and a plain one are told apart for reading and writing weights."""
    return ModelWeights(model, PeftNaming(model) if is_peft_model(model) else FullNaming(model))


# --- adapter folders --------------------------------------------------------------------


def recorded_base(directory: Path) -> Path:
    """The base ``pretrained_model/`` an adapter folder's ``adapter_config.json`` names; it must
    exist and load (``core.layout.validate``'s rule for the file, which inspect applies too)."""
    config_file = directory / ADAPTER_CONFIG
    recorded = read_json(config_file)
    problems = adapter_config_problems(recorded)
    if problems:
        raise CheckpointError(f"{config_file}: {problems[0]}")
    return Path(recorded["base_model_name_or_path"])


def attach_adapter(base: nn.Module, directory: Path) -> nn.Module:
    """``base`` wrapped, for inference, in the adapter ``directory/adapter_config.json``
    describes; the adapter's weights are loaded by the caller, as any weights are."""
    peft = import_peft()
    config = peft.PeftConfig.from_pretrained(str(directory))
    config.inference_mode = True
    return peft.PeftModel(base, config, adapter_name=ADAPTER_NAME)
