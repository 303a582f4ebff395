"""The weight shapes a checkpoint's ``config.json`` builds, known without building the model.

A ``model.safetensors`` or shard folder can be whole and self-consistent and still not
be the model its ``config.json`` describes (a config edited after the save, weights
copied from another run); loading then fails late, deep inside ``load_state_dict``.
A policy config that implements ``WeightShapes`` says its model's ``state_dict`` shapes
from the config and the dataset features alone, without torch, so ``inspect-checkpoint``
can check the stored shapes in a second and ``convert-dcp`` can refuse shards of
another model before writing anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import ValidationError

from lerobot_kit.core.errors import LerobotError
from lerobot_kit.core.layout.foreign_config import lerobot_config_advice
from lerobot_kit.core.layout.paths import DATASET_META, POLICY_CONFIG
from lerobot_kit.core.layout.validation_lines import file_line

if TYPE_CHECKING:
    from lerobot_kit.core.data.dataset import DatasetMeta

Shapes = dict[str, tuple[int, ...]]


@runtime_checkable
class WeightShapes(Protocol):
    """What a policy config implements to have its checkpoints' weight shapes checked offline.

    ``weight_shapes(meta)`` returns ``{tensor name: shape}`` for every tensor of the
    model's ``state_dict`` (buffers included) as this config and the dataset features
    ``meta`` build it, computed from fields alone: it runs inside ``inspect-checkpoint``,
    which never imports torch. It raises ``ValueError`` for features the model refuses.
    """

    def weight_shapes(self, meta: DatasetMeta) -> Shapes: ...


@dataclass(frozen=True)
class Expected:
    """The shapes config.json builds; ``None`` with the reason when they cannot be known,
    and ``problems`` (file name, message) when config.json or dataset_meta.json is unusable."""

    shapes: Shapes | None
    why_unknown: str = ""
    problems: list[tuple[str, str]] = field(default_factory=list)


def expected_shapes(config: dict[str, Any], meta: Any) -> Expected:
    """From the parsed ``config.json`` and ``dataset_meta.json`` (``None`` when missing)."""
    from lerobot_kit.core.registry.registry import get_registry

    registry = get_registry()
    policy_type = registry.claiming_policy_type(config) or config.get("type")
    try:
        config_class = registry.policy(str(policy_type)).config_class
    except LerobotError:
        return Expected(None, f"policy type {policy_type!r} is not installed here, so its weight shapes are unknown")
    if not callable(getattr(config_class, "weight_shapes", None)):
        return Expected(None, f"policy {policy_type!r} declares no weight shapes")
    try:
        policy_config = config_class.model_validate(config)
    except ValidationError as err:
        advice = lerobot_config_advice(config)
        problem = f"not a valid {policy_type!r} config: {file_line(err.errors())}{f': {advice}' if advice else ''}"
        return Expected(None, "", [(POLICY_CONFIG, problem)])
    if meta is None:
        return Expected(None, "", [(DATASET_META, "missing; the model's shapes depend on the dataset features")])
    from lerobot_kit.core.data.dataset import DatasetMeta

    try:
        dataset_meta = DatasetMeta.from_json(meta)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        return Expected(None, "", [(DATASET_META, f"malformed ({type(err).__name__}: {err})")])
    try:
        shapes = policy_config.weight_shapes(dataset_meta)
    except ValueError as err:
        return Expected(None, "", [(DATASET_META, str(err))])
    return Expected({name: tuple(shape) for name, shape in shapes.items()})


def shape_mismatch(expected: Shapes, stored: Shapes) -> str | None:
    """One line on how ``stored`` differs from ``expected`` (the first difference, and how
    many more), or ``None`` when every name and shape agree."""
    lines = [
        f"tensor {name!r} has shape {list(stored[name])}, but {POLICY_CONFIG} gives {list(expected[name])}"
        for name in sorted(expected.keys() & stored.keys())
        if tuple(stored[name]) != expected[name]
    ]
    lines += [
        f"tensor {name!r} ({list(expected[name])} in {POLICY_CONFIG}) is missing"
        for name in sorted(expected.keys() - stored.keys())
    ]
    lines += [
        f"tensor {name!r} {list(stored[name])} is not in {POLICY_CONFIG}'s model"
        for name in sorted(stored.keys() - expected.keys())
    ]
    if not lines:
        return None
    more = f" (and {len(lines) - 1} more tensors differ)" if len(lines) > 1 else ""
    return f"{lines[0]}{more}: these weights are not the model {POLICY_CONFIG} describes"
