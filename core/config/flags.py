"""Flags and config files to a validated ``TrainConfig``, with errors a user can act on.

``--a.b=v`` (or ``--a.b v``) becomes ``{"a": {"b": v}}``; values that look like JSON
lists or objects are decoded, ``null``/``none`` become None, everything else stays a
string for pydantic's lax coercion. Flags are deep-merged over ``--config_path``.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from lerobot_kit.core.config.schema import DatasetConfig, EnvConfig, PolicyConfig, Section, TrainConfig
from lerobot_kit.core.errors import ConfigError, LerobotError

CONFIG_PATH_FLAG = "config_path"
POLYMORPHIC = {"policy": ("policy", PolicyConfig), "dataset": ("dataset", DatasetConfig), "env": ("env", EnvConfig)}


def parse_value(text: str) -> Any:
    stripped = text.strip()
    if stripped[:1] in "[{":
        try:
            return json.loads(stripped)
        except json.JSONDecodeError:
            # Python-style single quotes are a common slip in shells.
            try:
                return json.loads(stripped.replace("'", '"'))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"value {text!r} looks like JSON but does not parse: {exc.msg}") from exc
    if stripped.lower() in ("null", "none"):
        return None
    return text


def flags_to_dict(args: list[str]) -> dict[str, Any]:
    """``["--a.b=1", "--c", "x"]`` → ``{"a": {"b": "1"}, "c": "x"}``."""
    tree: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"unexpected argument {arg!r}: flags look like --section.field=value")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
                i += 1
            else:
                raise ConfigError(f"flag --{key} has no value: write --{key}=VALUE")
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"flag --{key} conflicts with --{part} given as a value")
            node = child
        node[parts[-1]] = parse_value(value)
        i += 1
    return tree


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_config_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--config_path={path}: no such file; give the path of a train_config.json")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config_path={path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"--config_path={path}: expected a JSON object at the top level")
    return data


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Names of the fields at ``loc`` inside ``model`` (for did-you-mean)."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current = _model_in(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    if get_origin(annotation) is None:
        return None
    return None


def format_validation_error(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> list[str]:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = (prefix + ".".join(str(p) for p in loc)).rstrip(".") or "config"
        if err["type"] == "extra_forbidden":
            siblings = _field_names(model, loc[:-1])
            hint = difflib.get_close_matches(str(loc[-1]), siblings, n=1)
            suggestion = f"; did you mean --{prefix}{'.'.join([*map(str, loc[:-1]), hint[0]])}?" if hint else ""
            lines.append(f"--{path}: unknown flag{suggestion}")
        else:
            given = err.get("input")
            shown = f" (got {given!r})" if not isinstance(given, dict) else ""
            lines.append(f"--{path}: {err['msg']}{shown}")
    return lines


def resolve_section(raw: dict[str, Any], key: str, problems: list[str]) -> Section | None:
    """Validate ``raw[key]`` with the config class its ``type`` names in the registry."""
    from lerobot_kit.core.registry.registry import get_registry

    kind, base = POLYMORPHIC[key]
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        problems.append(f"--{key}: expected a section, got {value!r}")
        return None
    value = dict(value)
    if key == "policy" and value.get("path") and "type" not in value:
        value = deep_merge(_pretrained_policy_config(value["path"]), value)
    if key == "dataset" and "type" not in value and value.get("repo_id"):
        value["type"] = "lerobot"
    type_name = value.setdefault("type", base.model_fields["type"].default)
    try:
        registry = get_registry()
        config_class = getattr(registry, kind)(type_name).config_class
    except LerobotError as exc:
        problems.append(f"--{key}.type: {exc}")
        return None
    try:
        return config_class.model_validate(value)
    except ValidationError as exc:
        problems.extend(format_validation_error(exc, config_class, prefix=f"{key}."))
        return None


def _pretrained_policy_config(path: str) -> dict[str, Any]:
    from lerobot_kit.core.checkpoint.paths import find_pretrained_dir

    config_file = find_pretrained_dir(Path(path)) / "config.json"
    try:
        return json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--policy.path={path}: cannot read {config_file}: {exc}") from exc


def build_train_config(raw: dict[str, Any]) -> TrainConfig:
    """Validate a nested dict into a ``TrainConfig``; all problems in one ``ConfigError``."""
    from lerobot_kit.core.registry.registry import get_registry

    problems: list[str] = []
    sections = {key: resolve_section(raw, key, problems) for key in POLYMORPHIC}
    rest = {k: v for k, v in raw.items() if k not in POLYMORPHIC}
    config = None
    try:
        config = TrainConfig.model_validate(rest)
    except ValidationError as exc:
        problems.extend(format_validation_error(exc, TrainConfig))
    if config is not None:
        formats = get_registry().names("checkpoint_format")
        if config.checkpoint_format not in formats:
            hint = difflib.get_close_matches(config.checkpoint_format, formats, n=1)
            suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
            problems.append(
                f"--checkpoint_format: {config.checkpoint_format!r} is not a registered format "
                f"({', '.join(formats)}).{suggestion}"
            )
    if problems:
        raise ConfigError("\n".join(problems))
    assert config is not None
    for key, section in sections.items():
        setattr(config, key, section)
    return config


def parse_train_config(args: list[str]) -> TrainConfig:
    """CLI args (flags and optional ``--config_path``) to a validated config."""
    flags = flags_to_dict(args)
    config_path = flags.get(CONFIG_PATH_FLAG)
    raw = read_config_file(config_path) if config_path else {}
    return build_train_config(deep_merge(raw, flags))


def load_train_config_file(path: str | Path) -> TrainConfig:
    return build_train_config(read_config_file(str(path)))
