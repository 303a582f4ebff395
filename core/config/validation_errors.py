"""pydantic's ``ValidationError`` in the words a user reads, for what the user typed: one
``--policy.dim_model: ...`` line per problem, a misspelt flag with the closest real one.

The wording of one problem is ``core.layout.validation_lines``'s, shared with the one line
that refuses a checkpoint's ``config.json`` (``file_line``).
"""

from __future__ import annotations

import difflib
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from lerobot_kit.core.config.lerobot_flags import lerobot_flag_advice
from lerobot_kit.core.layout.validation_lines import problem_line


def flag_lines(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> list[str]:
    """One ``--flag: problem`` line per error of ``exc`` (``model`` validated the section
    whose flags start with ``--{prefix}``); an unknown flag gets the closest real one."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = (prefix + ".".join(str(p) for p in loc)).rstrip(".") or "config"
        if err["type"] == "extra_forbidden" and (advice := lerobot_flag_advice(path)):
            lines.append(f"--{path}: {advice}")
        elif err["type"] == "extra_forbidden":
            hint = difflib.get_close_matches(str(loc[-1]), _field_names(model, loc[:-1]), n=1)
            suggestion = f"; did you mean --{prefix}{'.'.join([*map(str, loc[:-1]), hint[0]])}?" if hint else ""
            lines.append(f"--{path}: unknown flag{suggestion}")
        else:
            lines.append(f"--{path}: {problem_line(err)}")
    return lines


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
    return None
