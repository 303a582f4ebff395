"""One problem of pydantic's ``ValidationError`` in the words a user reads: on one line, the
value shortened, never a link to pydantic's documentation.

It sits in the layout layer because the checkpoint check refuses a ``config.json`` its
policy type does not accept in one line (``file_line``: the file's first problem and how
many more); the flag parser above words each flag's problem the same way.
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence
from typing import Any

from pydantic_core import ErrorDetails

# Inputs are echoed short: a flag value can be a 5000-digit number or a JSON list.
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 60
_SHORT.maxlist = _SHORT.maxtuple = 6
_SHORT.maxlevel = 2


def file_line(errors: Sequence[ErrorDetails]) -> str:
    """The first of ``errors`` (a ``ValidationError``'s) as ``field.path: problem``, and ``(and N more)``."""
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "the config as a whole"
    problem = "unknown field" if first["type"] == "extra_forbidden" else problem_line(first)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {problem}{more}"


def problem_line(err: ErrorDetails) -> str:
    """pydantic's message on one line, with the input unless it is a whole section or list
    (a JSON list of members, say), which the message names the parts of."""
    message = " ".join(str(err["msg"]).split())
    given = err.get("input")
    return message if isinstance(given, (dict, list)) else f"{message} (got {shown(given)})"


def shown(value: Any) -> str:
    """``repr(value)`` cut to a readable length: a flag value can be a 5000-digit number."""
    return _SHORT.repr(value)
