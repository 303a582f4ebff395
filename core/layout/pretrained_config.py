"""A checkpoint's ``config.json`` validated as ``--policy.path`` validates it, for every reader.

``inspect-checkpoint``, a resume, ``--policy.path``, ``lerobot eval`` and
``load_pretrained`` all pass a checkpoint through ``core.layout.validate`` before reading
it, which asks here whether its ``config.json`` is a config its policy type builds: the
installed type's config class validates it, field by field, or, for a file another
library wrote (LeRobot's), the type that claims it validates it the way ``--policy.path``
hands it over (the folder, read by that type). So "loadable" and "resumable" mean the
same in all of them, and the line naming the problem is the same line.

A policy type that is not installed cannot tell, and is not a problem here: loading
says so when it needs the type.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lerobot_kit.core.errors import LerobotError
from lerobot_kit.core.layout.foreign_config import lerobot_config_advice
from lerobot_kit.core.layout.validation_lines import file_line


@dataclass(frozen=True)
class ConfigProblem:
    """Why ``config.json`` does not validate (without the file name); ``damage`` False when it
    is not damage but a file of another library that no installed type reads, whose line
    then ends with what to do."""

    line: str
    damage: bool = True


def pretrained_config_problem(folder: Path, saved: dict[str, Any]) -> ConfigProblem | None:
    """The problem of ``saved``, the parsed ``config.json`` of the loadable ``folder``; None
    when its policy type accepts it, or when no installed type can tell."""
    from lerobot_kit.core.registry.registry import get_registry

    registry = get_registry()
    claimed = registry.claiming_policy_type(saved)
    policy_type = claimed or saved.get("type")
    try:
        config_class = registry.policy(str(policy_type)).config_class
    except LerobotError:
        return None
    given = {"path": str(folder), "type": claimed} if claimed else saved
    try:
        validated = config_class.model_validate(given)
    except ValidationError as err:
        line = f"not a valid {policy_type!r} config: {file_line(err.errors())}"
        advice = None if claimed else lerobot_config_advice(saved)
        return ConfigProblem(f"{line}: {advice}", damage=False) if advice else ConfigProblem(line)
    # A type may check the rest of the folder against the config (the LeRobot bridge: that the
    # weights are the model the config describes), in the same words for every reader.
    folder_problem = getattr(validated, "pretrained_problem", None)
    line = folder_problem(folder) if callable(folder_problem) else None
    return ConfigProblem(line) if line else None
