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
    """The JSON object in ``path``; any way it cannot be one is a one-line ``ConfigError``."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--config_path={path}: no such file; give the path of a train_config.json")
    try:
        text = file.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"--config_path={path}: cannot be read ({exc.strerror}); check its permissions") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"--config_path={path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8 JSON, e.g. a train_config.json a run wrote"
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"--config_path={path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            "fix the file or give a train_config.json a run wrote"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"--config_path={path}: expected a JSON object at the top level, got a {type(data).__name__} "
            "(a config file maps sections to fields: {\"policy\": {...}, \"steps\": 1000})"
        )
    return data


def merge_sources(file: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """Flags deep-merged over the config file, except that a flag changing the ``type``
    of ``policy``, ``dataset`` or ``env`` drops the file's fields of the old type: they
    describe a class no longer selected, and the user typed none of them. The file's
    fields every type has (``DatasetConfig.sampler``, ``PolicyConfig.repo_id``, ...) stay."""
    merged = deep_merge(file, flags)
    for key, (_, base) in POLYMORPHIC.items():
        file_section, flag_section = file.get(key), flags.get(key)
        if not (isinstance(file_section, dict) and isinstance(flag_section, dict) and "type" in flag_section):
            continue
        if flag_section["type"] != file_section.get("type", base.model_fields["type"].default):
            common = {k: v for k, v in file_section.items() if k in base.model_fields and k != "type"}
            merged[key] = deep_merge(common, flag_section)
    return merged


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


def resolve_section(raw: dict[str, Any], key: str, problems: list[str], typed_by_file: bool = False) -> Section | None:
    """Validate ``raw[key]`` with the config class its ``type`` names in the registry.

    A field of another type of the same kind is refused by name ("does not apply to
    --dataset.type=reach") rather than as unknown, and is never silently dropped; set to
    null it means unset (configs recorded before a field moved from the shared base to
    the types that read it, such as ``dataset.repo_id``, hold it as null).
    """
    from lerobot_kit.core.registry.registry import get_registry

    kind, base = POLYMORPHIC[key]
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        problems.append(f"--{key}: expected a section, got {value!r}")
        return None
    value = dict(value)
    if key == "policy" and value.get("path") and "type" not in value:
        saved = _pretrained_policy_config(value["path"])
        claimed = _claiming_type(saved)
        # A type that claims the checkpoint reads its files itself: only the type is set here.
        value = {**value, "type": claimed} if claimed else deep_merge(saved, value)
    if key == "dataset" and "type" not in value and value.get("repo_id"):
        value["type"] = "lerobot"
    type_name = value.setdefault("type", base.model_fields["type"].default)
    try:
        registry = get_registry()
        config_class = getattr(registry, kind)(type_name).config_class
    except LerobotError as exc:
        problems.append(f"--{key}.type: {exc}")
        return None
    owners = _other_types_by_field(kind, type_name)
    origin = " (the type --config_path sets)" if typed_by_file else ""
    for field in [f for f in value if f not in config_class.model_fields and f in owners]:
        if value.pop(field) is not None:
            types = " or ".join(f"--{key}.type={t}" for t in owners[field])
            problems.append(
                f"--{key}.{field} does not apply to --{key}.type={type_name}{origin}, so it would be ignored; "
                f"it is a field of {types}: pass --{key}.type={owners[field][0]} too, or remove --{key}.{field}"
            )
    try:
        return config_class.model_validate(value)
    except ValidationError as exc:
        problems.extend(format_validation_error(exc, config_class, prefix=f"{key}."))
        return None


def _other_types_by_field(kind: str, selected: str) -> dict[str, list[str]]:
    """``{field: [types that have it]}`` over the registered types of ``kind`` other than ``selected``."""
    from lerobot_kit.core.registry.registry import get_registry

    registry = get_registry()
    owners: dict[str, list[str]] = {}
    for name in registry.names(kind):  # type: ignore[arg-type]
        if name != selected:
            for field in getattr(registry, kind)(name).config_class.model_fields:
                owners.setdefault(field, []).append(name)
    return owners


def _claiming_type(saved: dict[str, Any]) -> str | None:
    """The registered policy type whose config class claims a pretrained ``config.json``
    written by another library (its classmethod ``claims_pretrained(saved) -> bool``, as
    the LeRobot bridge's types recognise LeRobot's files), else None: the file's own
    ``type`` is then a lerobot-kit type, read as it is."""
    from lerobot_kit.core.registry.registry import get_registry

    registry = get_registry()
    for name in registry.names("policy"):
        claims = getattr(registry.policy(name).config_class, "claims_pretrained", None)
        if callable(claims) and claims(saved):
            return name
    return None


def _pretrained_policy_config(path: str) -> dict[str, Any]:
    from lerobot_kit.core.layout.paths import find_pretrained_dir

    config_file = find_pretrained_dir(Path(path)) / "config.json"
    try:
        return json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--policy.path={path}: cannot read {config_file}: {exc}") from exc


def build_train_config(raw: dict[str, Any], typed_by_file: frozenset[str] = frozenset()) -> TrainConfig:
    """Validate a nested dict into a ``TrainConfig``; all problems in one ``ConfigError``.

    ``typed_by_file``: the polymorphic sections whose ``type`` came from ``--config_path``
    (messages then say so)."""
    from lerobot_kit.core.registry.registry import get_registry

    problems: list[str] = []
    sections = {key: resolve_section(raw, key, problems, key in typed_by_file) for key in POLYMORPHIC}
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
    typed_by_file = frozenset(
        key for key in POLYMORPHIC
        if isinstance(raw.get(key), dict) and "type" in raw[key]
        and not (isinstance(flags.get(key), dict) and "type" in flags[key])
    )
    return build_train_config(merge_sources(raw, flags), typed_by_file)


def load_train_config_file(path: str | Path) -> TrainConfig:
    return build_train_config(read_config_file(str(path)))
