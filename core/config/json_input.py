"""JSON a user hands in as config (a ``--config_path`` file, a ``--a.b=[...]`` flag, a
checkpoint's ``config.json``), decoded so that any way it is unusable is one phrase.

Python's ``json`` module raises ``RecursionError`` on deep nesting and ``ValueError`` on
an integer of more than 4300 digits, and accepts ``NaN``, ``Infinity`` and ``1e999`` (an
infinity) although JSON has no such numbers; a path may name a character device such as
``/dev/zero``, which reads until memory runs out, or a named pipe, which blocks. Here
each of those is an ``UnusableJson`` whose message the caller prefixes with the file or
flag it came from. A file is read by ``core.layout.json_file``, as every JSON file is, so
it is missing or a named pipe in the same words. No config nests deeper than a few
levels or weighs more than a few kilobytes, so the limits below refuse only what cannot
be a config.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lerobot_kit.core.layout.json_file import SizeLimit, UnusableJson, decode_json_text, json_type, parse_json_file

MAX_DEPTH = 64
MAX_BYTES = 16 * 2**20

__all__ = ["UnusableJson", "decode", "read", "read_object"]


def decode(text: str) -> Any:
    """``text`` as JSON with finite numbers only, nested at most ``MAX_DEPTH`` levels."""
    data = decode_json_text(text, _strict_loads)
    _check_depth(data)
    return data


def read(path: Path) -> Any:
    """The JSON in the regular file ``path`` (symbolic links followed), decoded as ``decode`` does
    and at most ``MAX_BYTES`` long (``core.layout.json_file.parse_json_file``)."""
    return parse_json_file(path, decode=decode, limit=SizeLimit(MAX_BYTES, _too_large()))


def read_object(path: Path) -> dict[str, Any]:
    """``read(path)``, which must be a JSON object (a config maps names to values)."""
    data = read(path)
    if not isinstance(data, dict):
        raise UnusableJson(f"expected a JSON object at the top level, got {json_type(data)}")
    return data


def _strict_loads(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_int)
    except RecursionError as exc:
        raise UnusableJson(_too_deep()) from exc


def _refuse_constant(name: str) -> Any:
    raise UnusableJson(f"{name} is not a JSON number", "give a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnusableJson(f"the number {text} is beyond a float's range (about 1.8e308)")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:  # more digits than Python converts (sys.get_int_max_str_digits)
        digits = len(text.lstrip("-"))
        raise UnusableJson(f"the integer {text[:12]}... has {digits} digits, beyond any field's range") from exc


def _check_depth(data: Any) -> None:
    pending = [(data, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise UnusableJson(_too_deep())
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def _too_large() -> str:
    return f"is larger than {MAX_BYTES // 2**20} MiB, which no config is"


def _too_deep() -> str:
    return f"nested more than {MAX_DEPTH} levels deep, which no config is"
