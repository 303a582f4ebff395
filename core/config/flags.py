"""Flags and config files to a validated ``TrainConfig``, with errors a user can act on.

``--a.b=v`` (or ``--a.b v``) becomes ``{"a": {"b": v}}``; values that look like JSON
lists or objects are decoded, ``null``/``none`` become None, everything else stays a
string for pydantic's lax coercion. Flags are deep-merged over ``--config_path``.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lerobot_kit.core.config import json_input
from lerobot_kit.core.config.retired import without_retired
from lerobot_kit.core.config.schema import DatasetConfig, EnvConfig, PolicyConfig, Section, TrainConfig
from lerobot_kit.core.config.validation_errors import flag_lines
from lerobot_kit.core.errors import CheckpointError, ConfigError, LerobotError
from lerobot_kit.core.layout.file_rules import policy_config_problems
from lerobot_kit.core.layout.foreign_config import lerobot_train_config_advice, refused_config_advice
from lerobot_kit.core.layout.hub_snapshot import local_policy_path
from lerobot_kit.core.layout.validate import check_loadable
from lerobot_kit.core.layout.validation_lines import file_line, shown

CONFIG_PATH_FLAG = "config_path"
POLYMORPHIC = {"policy": ("policy", PolicyConfig), "dataset": ("dataset", DatasetConfig), "env": ("env", EnvConfig)}


def parse_value(text: str, flag: str) -> Any:
    stripped = text.strip()
    if stripped.startswith(("[", "{")):
        try:
            return json_input.decode(stripped)
        except json_input.UnusableJson as exc:
            # Python-style single quotes are a common slip in shells.
            try:
                return json_input.decode(stripped.replace("'", '"'))
            except json_input.UnusableJson:
                fix = exc.fix or "write a JSON list or object, with double quotes around strings"
                raise ConfigError(f"--{flag}: the value looks like JSON but is unusable: {exc}; {fix}") from exc
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
        node[parts[-1]] = parse_value(value, key)
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
    try:
        raw = json_input.read_object(Path(path))
    except json_input.UnusableJson as exc:
        fix = exc.fix or "give a JSON config file, such as the train_config.json a run writes"
        raise ConfigError(f"--config_path={path}: {exc}; {fix}") from exc
    advice = lerobot_train_config_advice(Path(path), raw)
    if advice:
        raise ConfigError(f"--config_path={path}: {advice}")
    return without_retired(raw)


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
        problems.append(f"--{key}: expected a section, got {shown(value)}")
        return None
    value = dict(value)
    given = frozenset(value)
    if key == "policy" and isinstance(value.get("path"), str):
        value["path"] = local_policy_path(value["path"])
    pretrained = value.get("path") if key == "policy" and "type" not in value else None
    saved: dict[str, Any] = {}
    if pretrained:
        saved = _pretrained_policy_config(pretrained)
        claimed = get_registry().claiming_policy_type(saved)
        # A type that claims the checkpoint reads its files itself: only the type is set here.
        value = {**value, "type": claimed} if claimed else deep_merge(saved, value)
    if key == "dataset" and "type" not in value and (value.get("repo_id") or value.get("mixture") is not None):
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
        if pretrained:
            _refuse_damaged_pretrained(exc, given, pretrained, type_name, saved)
        problems.extend(flag_lines(exc, config_class, prefix=f"{key}."))
        return None


def _refuse_damaged_pretrained(
    exc: ValidationError, given: frozenset[str], path: str, type_name: str, saved: dict[str, Any]
) -> None:
    """A ``CheckpointError`` when fields that no flag set, read from the ``config.json`` of
    ``--policy.path``, are what the policy rejects: the checkpoint is damaged or of another
    version, which no flag fixes. Problems with the fields the flags set stay flag errors."""
    from_file = [
        err for err in exc.errors()
        if (err["loc"] and str(err["loc"][0]) not in given) or (not err["loc"] and given <= {"path"})
    ]
    if from_file:
        raise CheckpointError(
            f"--policy.path={path}: {_pretrained_config_file(path)}: not a valid {type_name!r} config: "
            f"{file_line(from_file)}; {refused_config_advice(saved)}"
        ) from exc


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


def _pretrained_config_file(path: str) -> Path:
    from lerobot_kit.core.layout.paths import find_pretrained_dir

    return find_pretrained_dir(Path(path)) / "config.json"


def _pretrained_policy_config(path: str) -> dict[str, Any]:
    config_file = _pretrained_config_file(path)
    check_loadable(config_file.parent)  # every file loading reads, in the words of inspect-checkpoint and eval
    try:
        config = json_input.read_object(config_file)
    except json_input.UnusableJson as exc:
        raise CheckpointError(
            f"--policy.path={path}: {config_file}: {exc}; the checkpoint is damaged: give another --policy.path"
        ) from exc
    problems = policy_config_problems(config)
    if problems:
        raise CheckpointError(
            f"--policy.path={path}: {config_file}: {problems[0]}; the checkpoint is damaged: give another --policy.path"
        )
    return config


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
        problems.extend(flag_lines(exc, TrainConfig))
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
