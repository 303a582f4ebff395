"""Normalisation around a policy: the preprocessor maps raw batches into the policy's
space, the postprocessor maps its actions back.

Processors live next to the weights (``policy_preprocessor.json`` + one safetensors
file per stateful step) so a checkpoint runs on raw robot data with no access to the
dataset. Stats are stored as float32 tensors and restored bit-exactly.

Modes: ``observation.state``-like vectors and ``action`` use the policy's
``normalization`` (``mean_std``: ``(x - mean) / std``; ``min_max``: to [-1, 1]).
Images (already in [0,1]) are always standardised per channel with the dataset's
mean/std, the scale convolutional backbones train best on. Features absent from a
batch are skipped (an inference batch has no ``action``); other keys pass through.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from safetensors.torch import load_file

from lerobot_kit.core.config.schema import PolicyConfig
from lerobot_kit.core.data.dataset import ACTION_KEY, DatasetMeta
from lerobot_kit.core.errors import CheckpointError, ConfigError, first_line
from lerobot_kit.core.layout.file_rules import processor_problems
from lerobot_kit.core.layout.hub_snapshot import cached_repo_of
from lerobot_kit.core.layout.json_file import read_json, write_json
from lerobot_kit.core.layout.safetensors_header import read_safetensors_header
from lerobot_kit.core.layout.file_modes import save_safetensors

Mode = Literal["mean_std", "min_max"]
MODES: tuple[str, ...] = ("mean_std", "min_max")
# Guards against a constant feature (std or range 0): it maps to 0 instead of inf/nan.
EPS = 1e-8
STEP_TYPES: dict[str, type[ProcessorStep]] = {}


def register_step(cls: type[ProcessorStep]) -> type[ProcessorStep]:
    """Make a step class loadable by its ``name`` from a saved processor."""
    STEP_TYPES[cls.name] = cls
    return cls


class ProcessorStep:
    """One transformation of a batch; ``state_dict`` holds its tensors (saved as safetensors)."""

    name: ClassVar[str]

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """JSON-able settings that, with ``state_dict``, rebuild the step."""
        return {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    @classmethod
    def from_saved(cls, config: dict[str, Any], state: dict[str, torch.Tensor]) -> ProcessorStep:
        return cls(**config)


class _StatsStep(ProcessorStep):
    """Shared state of (un)normalisation: a mode and float32 stats per feature."""

    def __init__(self, modes: dict[str, Mode], stats: dict[str, dict[str, torch.Tensor]]) -> None:
        for key, mode in modes.items():
            if mode not in MODES:
                raise ConfigError(f"normalisation mode {mode!r} of {key!r} is not one of {', '.join(MODES)}")
            needed = ("mean", "std") if mode == "mean_std" else ("min", "max")
            missing = [s for s in needed if s not in stats.get(key, {})]
            if missing:
                raise ConfigError(f"cannot normalise {key!r} with {mode}: the dataset has no {missing} stats for it")
        self.modes = dict(modes)
        self.stats = {
            key: {name: torch.as_tensor(v, dtype=torch.float32).detach().clone() for name, v in stats[key].items()}
            for key in modes
        }

    def config(self) -> dict[str, Any]:
        return {"modes": self.modes}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"{key}.{name}": t.contiguous() for key, s in self.stats.items() for name, t in s.items()}

    @classmethod
    def from_saved(cls, config: dict[str, Any], state: dict[str, torch.Tensor]) -> ProcessorStep:
        stats: dict[str, dict[str, torch.Tensor]] = {}
        for flat, tensor in state.items():
            key, _, name = flat.rpartition(".")
            stats.setdefault(key, {})[name] = tensor
        return cls(config["modes"], stats)

    def _stat(self, key: str, name: str, like: torch.Tensor) -> torch.Tensor:
        return self.stats[key][name].to(device=like.device, dtype=like.dtype)

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(batch)
        for key, mode in self.modes.items():
            if key in out:
                out[key] = self._apply(key, mode, out[key])
        return out

    def _apply(self, key: str, mode: Mode, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@register_step
class NormalizeStep(_StatsStep):
    name = "normalize"

    def _apply(self, key: str, mode: Mode, x: torch.Tensor) -> torch.Tensor:
        if mode == "mean_std":
            return (x - self._stat(key, "mean", x)) / (self._stat(key, "std", x) + EPS)
        low, high = self._stat(key, "min", x), self._stat(key, "max", x)
        return (x - low) / (high - low + EPS) * 2.0 - 1.0


@register_step
class UnnormalizeStep(_StatsStep):
    name = "unnormalize"

    def _apply(self, key: str, mode: Mode, x: torch.Tensor) -> torch.Tensor:
        if mode == "mean_std":
            return x * (self._stat(key, "std", x) + EPS) + self._stat(key, "mean", x)
        low, high = self._stat(key, "min", x), self._stat(key, "max", x)
        return (x + 1.0) / 2.0 * (high - low + EPS) + low


class PolicyProcessor:
    """An ordered list of steps, saved as ``<name>.json`` + ``<name>_step_<i>_<step>.safetensors``."""

    def __init__(self, steps: list[ProcessorStep]) -> None:
        self.steps = list(steps)

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for step in self.steps:
            batch = step(batch)
        return batch

    def save(self, directory: Path, name: str) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        entries = []
        for i, step in enumerate(self.steps):
            state = step.state_dict()
            state_file = f"{name}_step_{i}_{step.name}.safetensors" if state else None
            if state_file is not None:
                save_safetensors({k: v.detach().cpu().contiguous() for k, v in state.items()}, directory / state_file)
            entries.append({"registry_name": step.name, "config": step.config(), "state_file": state_file})
        write_json(directory / f"{name}.json", {"name": name, "steps": entries})

    @classmethod
    def load(cls, directory: Path, name: str) -> PolicyProcessor:
        """The processor ``save`` wrote as ``name``; its file is checked by the rule inspect-checkpoint
        applies (steps are objects, state files lie in ``directory``, or in its repo's cache
        folder for a Hub snapshot), and a damaged one is one line."""
        directory = Path(directory)
        path = directory / f"{name}.json"
        saved = read_json(path)
        problems = processor_problems(saved, directory, cached_repo_of(directory) or directory)
        if problems:
            raise CheckpointError(f"{path}: {problems[0]}; the file is damaged")
        steps: list[ProcessorStep] = []
        for i, entry in enumerate(saved["steps"]):
            registry_name = entry.get("registry_name")
            step_class = STEP_TYPES.get(registry_name)
            if step_class is None:
                raise CheckpointError(
                    f"{path}: unknown processor step {registry_name!r} (known: {', '.join(sorted(STEP_TYPES))}); "
                    "the plugin that saved it must be installed and register it with register_step"
                )
            state: dict[str, torch.Tensor] = {}
            if entry.get("state_file"):
                state_path = directory / entry["state_file"]
                read_safetensors_header(state_path)  # one line for a damaged file, where safetensors says less
                state = load_file(str(state_path))
            try:
                steps.append(step_class.from_saved(entry.get("config", {}), state))
            except (KeyError, TypeError, ValueError, ConfigError) as exc:
                raise CheckpointError(
                    f"{path}: step {i} ({registry_name}) cannot be rebuilt from its config and state "
                    f"({type(exc).__name__}: {first_line(exc)}); the file is damaged"
                ) from exc
        return cls(steps)


def make_processors(config: PolicyConfig, meta: DatasetMeta) -> tuple[PolicyProcessor, PolicyProcessor]:
    """Pre- (normalise observations and the action target) and postprocessor (unnormalise actions)."""
    mode: Mode = getattr(config, "normalization", "mean_std")
    modes: dict[str, Mode] = {}
    for key, spec in meta.features.items():
        if spec.is_image:
            modes[key] = "mean_std"
        elif spec.dtype == "float32" and (key.startswith("observation.") or key == ACTION_KEY):
            modes[key] = mode
    stats = {key: {k: torch.from_numpy(v) for k, v in meta.stats.get(key, {}).items()} for key in modes}
    pre = PolicyProcessor([NormalizeStep(modes, stats)])
    post_modes = {k: m for k, m in modes.items() if k == ACTION_KEY}
    post = PolicyProcessor([UnnormalizeStep(post_modes, {k: stats[k] for k in post_modes})])
    return pre, post
