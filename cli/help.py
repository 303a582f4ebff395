"""``train --help`` generated from the config models: every flag, its type, default and help."""

from __future__ import annotations

import json
import types
from typing import Any, Iterator, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


def _type_name(annotation: Any) -> str:
    """Short, shell-minded type names: ``{no|bf16|fp16}``, ``int|null``, ``list[str]``."""
    origin = get_origin(annotation)
    if origin is Literal:
        return "{" + "|".join(str(a) for a in get_args(annotation)) + "}"
    if origin in (Union, types.UnionType):
        return "|".join("null" if a is type(None) else _type_name(a) for a in get_args(annotation))
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type_name(a) for a in get_args(annotation))}]"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "{…}"
    if field.default is PydanticUndefined:
        return "required"
    value = field.default
    return json.dumps(value) if isinstance(value, (list, tuple, dict)) else str(value)


def iter_flags(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """(flag, type, default, help) for every leaf field, depth first."""
    for name, field in model.model_fields.items():
        nested = field.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            yield from iter_flags(nested, f"{prefix}{name}.")
            continue
        yield f"--{prefix}{name}", _type_name(field.annotation), _default(field), field.description or ""


def render_help(policy_class: type[BaseModel], dataset_class: type[BaseModel], registry_names: dict[str, list[str]]) -> str:
    from lerobot_kit.core.config.schema import TrainConfig

    lines = [
        "Usage: lerobot train [--section.field=VALUE ...] [--config_path=train_config.json]",
        "",
        "Train a policy. Flags override --config_path; values are JSON for lists/dicts.",
        "Under torchrun / accelerate launch the same flags apply; no --parallelism.* means DDP.",
    ]
    sections: list[tuple[str, Iterator[tuple[str, str, str, str]]]] = [
        ("", (f for f in iter_flags(TrainConfig) if not f[0].startswith(("--policy", "--dataset")))),
        (f"policy ({policy_class.__name__}; types: {', '.join(registry_names['policy'])})", iter_flags(policy_class, "policy.")),
        (f"dataset ({dataset_class.__name__}; types: {', '.join(registry_names['dataset'])})", iter_flags(dataset_class, "dataset.")),
    ]
    for title, flags in sections:
        if title:
            lines += ["", f"{title}:"]
        for flag, type_name, default, help_text in flags:
            lines.append(f"  {flag}  {type_name}  (default: {default})  {help_text}".rstrip())
    lines += ["", "Pick --policy.type / --dataset.type before --help to see that type's fields."]
    return "\n".join(lines)
