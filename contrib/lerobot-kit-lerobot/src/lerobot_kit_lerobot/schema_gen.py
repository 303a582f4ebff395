"""Generate ``schemas.json``, the flags of every bridged policy, from LeRobot's config dataclasses.

Why a generated file and not introspection at start-up: importing LeRobot's config
modules imports torch and most of LeRobot (tens of seconds on a busy machine), and
``lerobot --help`` imports every plugin. So the field names, types, defaults and
descriptions are read from the dataclasses once, here, and shipped as JSON; the hook
module builds pydantic classes from it without importing LeRobot. ``check_schemas``
(run whenever a bridged policy is built, and by the tests) compares the file with the
installed LeRobot, so a LeRobot whose fields moved is refused with the command that
regenerates the file:

    python -m lerobot_kit_lerobot.schema_gen > src/lerobot_kit_lerobot/schemas.json

Types are written as a small tree (``{"kind": "optional", "of": {"kind": "int"}}``)
that ``configuration.annotation_of`` turns back into an annotation. A field whose type
has no flag form (a nested dataclass) is listed under ``"fixed"``: it keeps LeRobot's
default.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

import draccus
from lerobot import __version__ as lerobot_version
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies import ACTConfig  # noqa: F401 - importing it registers every LeRobot policy type

from lerobot_kit.api import PluginError

# Fields the bridge sets itself, each from a lerobot-kit setting, so they are not flags:
BRIDGE_SET = {
    "input_features": "from the dataset's features",
    "output_features": "from the dataset's features",
    "device": "LeRobot picks the available device",
    "use_amp": "set by --accelerator.mixed_precision",
    "use_peft": "set by --peft.method_type",
    "pretrained_path": "set by --policy.path",
    "pretrained_revision": "--policy.path is a local folder",
    # lerobot-kit's own PolicyConfig has these three, with the same meaning.
    "push_to_hub": "lerobot-kit's --policy.push_to_hub",
    "repo_id": "lerobot-kit's --policy.repo_id",
    "private": "lerobot-kit's --policy.private",
}
TRAINING_PRESET = re.compile(r"^(optimizer|scheduler)_")
PRESET_NOTE = " (LeRobot's training preset, recorded in config.json; lerobot-kit trains with --optimizer.* and --scheduler.*)"


def policy_schema(config_class: type) -> dict[str, Any]:
    """The flag schema of one LeRobot config dataclass."""
    hints = typing.get_type_hints(config_class)
    descriptions = field_descriptions(config_class)
    fields, fixed = [], []
    for field in dataclasses.fields(config_class):
        if not field.init or field.name in BRIDGE_SET:
            continue
        default = _default_of(field)
        kind = type_tree(hints[field.name], default)
        if kind is None:
            fixed.append(field.name)
            continue
        description = descriptions.get(field.name, f"LeRobot's {config_class.__name__}.{field.name}.")
        if TRAINING_PRESET.match(field.name):
            description = description.rstrip(".") + PRESET_NOTE
        fields.append({
            "name": field.name,
            "type": kind,
            "default": draccus.encode(default),
            "description": description,
        })
    return {
        "config_class": f"{config_class.__module__}:{config_class.__qualname__}",
        "fields": fields,
        "fixed": fixed,
    }


def _default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise PluginError(f"LeRobot config field {field.name!r} has no default; the bridge cannot make it a flag")


def type_tree(annotation: Any, default: Any = None) -> dict[str, Any] | None:
    """``annotation`` as a JSON tree, or None when it has no flag form."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in (int, float, bool, str):
        return {"kind": annotation.__name__}
    if annotation is Path:
        return {"kind": "str"}
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return {"kind": "literal", "values": [member.value for member in annotation]}
    if origin is typing.Literal:
        return {"kind": "literal", "values": list(args)}
    if origin in (typing.Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        inner = type_tree(present[0]) if len(present) == 1 else None
        return {"kind": "optional", "of": inner} if inner is not None else None
    if annotation in (list, tuple) and isinstance(default, (list, tuple)) and default:
        # A bare ``tuple`` (diffusion's optimizer_betas): typed by what its default holds.
        inner = type_tree(type(default[0]))
        return {"kind": annotation.__name__, "of": inner} if inner is not None else None
    if origin is list and len(args) == 1:
        inner = type_tree(args[0])
        return {"kind": "list", "of": inner} if inner is not None else None
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        inner = type_tree(args[0])
        return {"kind": "tuple", "of": inner} if inner is not None else None
    if origin is tuple and args:
        items = [type_tree(a) for a in args]
        return {"kind": "tuple", "items": items} if all(i is not None for i in items) else None
    if origin is dict and len(args) == 2 and args[0] is str:
        inner = type_tree(args[1])
        return {"kind": "dict", "of": inner} if inner is not None else None
    return None


ARG_LINE = re.compile(r"^(\s*)(\w+):\s*(.*)$")


def field_descriptions(config_class: type) -> dict[str, str]:
    """``name: text`` entries of the ``Args:`` sections of the class and its bases' docstrings
    (the nearest class wins), continuation lines joined."""
    found: dict[str, str] = {}
    for klass in reversed(config_class.__mro__):
        found.update(_args_section(klass.__dict__.get("__doc__") or ""))
    return found


def _args_section(doc: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    lines = doc.expandtabs().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return entries
    indent, current = None, None
    for line in lines[start + 1:]:
        if not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        match = ARG_LINE.match(line)
        if indent is None and match:
            indent = width
        if indent is None or width < indent:
            break
        if width == indent and match:
            current = match.group(2)
            entries[current] = match.group(3).strip()
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def check_schema(lerobot_type: str) -> None:
    """Refuse to bridge a policy whose LeRobot config no longer matches ``schemas.json``:
    its flags would be the wrong ones."""
    from lerobot_kit_lerobot.configuration import SCHEMAS

    shipped = SCHEMAS["policies"][lerobot_type]
    current = policy_schema(PreTrainedConfig.get_choice_class(lerobot_type))
    if _without_descriptions(current) != _without_descriptions(shipped):
        raise PluginError(
            f"the installed LeRobot {lerobot_version} configures {lerobot_type!r} differently from the LeRobot "
            f"{SCHEMAS['lerobot_version']} that lerobot-kit-lerobot's flags were generated from; install "
            f"lerobot=={SCHEMAS['lerobot_version']}, or regenerate the flags: "
            "python -m lerobot_kit_lerobot.schema_gen > src/lerobot_kit_lerobot/schemas.json"
        )


def _without_descriptions(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "fields": [{k: v for k, v in f.items() if k != "description"} for f in schema["fields"]]}


def all_schemas(names: list[str]) -> dict[str, Any]:
    return {
        "lerobot_version": lerobot_version,
        "policies": {name: policy_schema(PreTrainedConfig.get_choice_class(name)) for name in names},
    }


def main() -> None:
    from lerobot_kit_lerobot.policies import BRIDGED

    json.dump(all_schemas(sorted(BRIDGED)), sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
