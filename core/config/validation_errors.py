"""pydantic's ``ValidationError`` in the words a user reads: one line per problem, named by
its flag or field, with the value shortened and never a link to pydantic's documentation.

Two shapes, one wording: ``flag_lines`` for what the user typed (``--policy.dim_model:
...``, a misspelt flag with the closest real one), ``file_line`` for a file the user did
not write field by field (a checkpoint's ``config.json``): its first problem and how many
more, as the one line of a ``CheckpointError``.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from lerobot_kit.core.config.lerobot_flags import lerobot_flag_advice

# Inputs are echoed short: a flag value can be a 5000-digit number or a JSON list.
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 60
_SHORT.maxlist = _SHORT.maxtuple = 6
_SHORT.maxlevel = 2


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
            lines.append(f"--{path}: {_problem(err)}")
    return lines


def file_line(errors: Sequence[ErrorDetails]) -> str:
    """The first of ``errors`` (a ``ValidationError``'s) as ``field.path: problem``, and ``(and N more)``."""
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "the config as a whole"
    problem = "unknown field" if first["type"] == "extra_forbidden" else _problem(first)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {problem}{more}"


def _problem(err: ErrorDetails) -> str:
    """pydantic's message on one line, with the input unless it is a whole section or list
    (a JSON list of members, say), which the message names the parts of."""
    message = " ".join(str(err["msg"]).split())
    given = err.get("input")
    return message if isinstance(given, (dict, list)) else f"{message} (got {shown(given)})"


def shown(value: Any) -> str:
    """``repr(value)`` cut to a readable length: a flag value can be a 5000-digit number."""
    return _SHORT.repr(value)


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
