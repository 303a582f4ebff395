"""JSON a user hands in as config (a ``--config_path`` file, a ``--a.b=[...]`` flag, a
checkpoint's ``config.json``), decoded so that any way it is unusable is one phrase.

Python's ``json`` module raises ``RecursionError`` on deep nesting and ``ValueError`` on
an integer of more than 4300 digits, and accepts ``NaN``, ``Infinity`` and ``1e999`` (an
infinity) although JSON has no such numbers; a path may name a character device such as
``/dev/zero``, which reads until memory runs out, or a named pipe, which blocks. Here
each of those is an ``UnusableJson`` whose message the caller prefixes with the file or
flag it came from. No config nests deeper than a few levels or weighs more than a few
kilobytes, so the limits below refuse only what cannot be a config.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from lerobot_kit.core.layout.json_file import json_type
from lerobot_kit.core.layout.regular_file import NotRegularFile, open_regular

MAX_DEPTH = 64
MAX_BYTES = 16 * 2**20


class UnusableJson(ValueError):
    """Why a text or file is not usable as JSON config, as one phrase (no file name), and
    ``fix``, what to do about it when that does not depend on where the JSON came from."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(problem)
        self.fix = fix


def decode(text: str) -> Any:
    """``text`` as JSON with finite numbers only, nested at most ``MAX_DEPTH`` levels."""
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_int)
    except UnusableJson:
        raise
    except json.JSONDecodeError as exc:
        raise UnusableJson(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    except RecursionError as exc:
        raise UnusableJson(_too_deep()) from exc
    _check_depth(data)
    return data


def read(path: Path) -> Any:
    """The JSON in the regular file ``path`` (symbolic links followed).

    The file is opened as every checkpoint file is (``core.layout.regular_file``): without
    blocking and checked through its own descriptor, so a named pipe never stalls the open
    and a path replaced after the check is not read.
    """
    try:
        handle = open_regular(path)
    except FileNotFoundError as exc:
        raise UnusableJson("no such file") from exc
    except NotRegularFile as exc:
        raise UnusableJson(f"is {exc.kind}, not a file") from exc
    except OSError as exc:
        raise UnusableJson(f"cannot be read ({exc.strerror})") from exc
    try:
        with handle:
            if os.fstat(handle.fileno()).st_size > MAX_BYTES:
                raise UnusableJson(_too_large())
            raw = handle.read(MAX_BYTES + 1)  # bounded too: /proc files report size 0
    except OSError as exc:
        raise UnusableJson(f"cannot be read ({exc.strerror})") from exc
    if len(raw) > MAX_BYTES:
        raise UnusableJson(_too_large())
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnusableJson(
            f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})", "save it as UTF-8 JSON"
        ) from exc
    return decode(text)


def read_object(path: Path) -> dict[str, Any]:
    """``read(path)``, which must be a JSON object (a config maps names to values)."""
    data = read(path)
    if not isinstance(data, dict):
        raise UnusableJson(f"expected a JSON object at the top level, got {json_type(data)}")
    return data


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
