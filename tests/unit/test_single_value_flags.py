"""No flag that can hold one value only: such a flag can do nothing but refuse every other
value, so it is left out of the config (and so of ``--help``) until it can do something.
Configs written while ``--parallelism.tp``, ``--parallelism.cp`` and ``--optimizer.type``
existed, holding their one value, still load (``core.config.retired``)."""

from __future__ import annotations

import re

from conftest import run_cli
from lerobot_kit.cli.help import iter_flags
from lerobot_kit.core.config.retired import RETIRED
from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.eval.config import EvalRunConfig
from lerobot_kit.core.registry.registry import get_registry

HELP_LINE = re.compile(r"^  (--\S+)  (\S+)  \(default: ", re.MULTILINE)
ONE_CHOICE = re.compile(r"\{[^|{}]*\}")  # a choice list of one: {adamw}
REPR = re.compile(r"Annotated|metadata|=|<class")  # what a type's Python repr leaks into help


def test_train_help_lists_no_flag_that_only_refuses() -> None:
    result = run_cli("train", "--help", timeout=60)
    assert result.returncode == 0, result.stderr
    flags = dict(HELP_LINE.findall(result.stdout))
    assert "--parallelism.dp_shard" in flags  # the lines are read as they are printed
    for section, field in RETIRED:
        assert f"--{section}.{field}" not in flags
    assert [flag for flag, kind in flags.items() if ONE_CHOICE.fullmatch(kind)] == []


def test_no_config_class_has_a_field_of_one_value() -> None:
    """Every flag of train and eval, under every registered policy, dataset and environment type."""
    registry = get_registry()
    models = [(TrainConfig, ""), (EvalRunConfig, "")]
    for kind in ("policy", "dataset", "env"):
        models += [(getattr(registry, kind)(name).config_class, f"{kind}.") for name in registry.names(kind)]
    single = [
        f"{flag} {type_name}"
        for model, prefix in models
        for flag, type_name, _, _ in iter_flags(model, prefix)
        if ONE_CHOICE.fullmatch(type_name)
    ]
    assert single == []


def test_no_flag_type_in_help_is_a_python_repr() -> None:
    """A bounded optional type (``Seconds | None``) reads ``int|null``, not pydantic's repr of its metadata."""
    registry = get_registry()
    models = [(TrainConfig, ""), (EvalRunConfig, "")]
    for kind in ("policy", "dataset", "env"):
        models += [(getattr(registry, kind)(name).config_class, f"{kind}.") for name in registry.names(kind)]
    raw = [f"{flag} {type_name}" for model, prefix in models for flag, type_name, _, _ in iter_flags(model, prefix)
           if REPR.search(type_name)]
    assert raw == []
    result = run_cli("train", "--help", timeout=60)
    assert dict(HELP_LINE.findall(result.stdout))["--parallelism.step_timeout_s"] == "int|null"
