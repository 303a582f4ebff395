"""``train --help`` and ``eval --help`` generated from the config models: every flag, its type, default and help."""

from __future__ import annotations

import json
import types
from typing import Annotated, Any, Iterator, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


def _type_name(annotation: Any) -> str:
    """Short, shell-minded type names: ``{no|bf16|fp16}``, ``int|null``, ``list[str]``."""
    origin = get_origin(annotation)
    if origin is Annotated:  # a bounded type (``Seconds``) inside ``| None``: its bounds are in the description
        return _type_name(get_args(annotation)[0])
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


def selected_type(args: list[str], section: str, default: str) -> str:
    for arg in args:
        if arg.startswith(f"--{section}.type="):
            return arg.split("=", 1)[1]
    return default


def render_help(usage: list[str], root: type[BaseModel], args: list[str]) -> str:
    """Every flag of ``root``; a polymorphic section (policy, dataset, env) lists the fields
    of the type ``args`` pick (``--policy.type=…``), or of its default type."""
    from lerobot_kit.core.config.flags import POLYMORPHIC
    from lerobot_kit.core.registry.registry import get_registry

    registry = get_registry()
    polymorphic = {
        name: base for name, (_, base) in POLYMORPHIC.items()
        if name in root.model_fields and root.model_fields[name].annotation is base
    }
    sections: list[tuple[str, Iterator[tuple[str, str, str, str]]]] = [
        ("", (f for f in iter_flags(root) if f[0].split(".")[0][2:] not in polymorphic)),
    ]
    for name, base in polymorphic.items():
        chosen = selected_type(args, name, base.model_fields["type"].default)
        config_class = getattr(registry, name)(chosen).config_class
        title = f"{name} ({config_class.__name__}; types: {', '.join(registry.names(name))})"  # type: ignore[arg-type]
        sections.append((title, iter_flags(config_class, f"{name}.")))
    lines = list(usage)
    for title, flags in sections:
        if title:
            lines += ["", f"{title}:"]
        for flag, type_name, default, help_text in flags:
            lines.append(f"  {flag}  {type_name}  (default: {default})  {help_text}".rstrip())
    choices = " / ".join(f"--{name}.type" for name in polymorphic)
    lines += ["", f"Pick {choices} before --help to see that type's fields."]
    return "\n".join(lines)
