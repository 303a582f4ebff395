"""Reading one JSON file of a checkpoint: any way it fails to parse is one ``CheckpointError`` line.

A disk fault, a truncated copy or a hand edit can leave bytes that are not UTF-8, not
JSON, nested deeper than the parser's recursion allows, or a folder where a file should
be; every reader of a checkpoint's JSON goes through ``read_json`` so each of these names
the file instead of raising whatever the parser raises. Torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lerobot_kit.core.errors import CheckpointError


def read_json(path: Path, label: str | None = None) -> Any:
    """The parsed value of ``path``; one ``CheckpointError`` line starting with ``label`` (default: the path)."""
    name = label or str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise CheckpointError(f"{name}: missing") from exc
    except IsADirectoryError as exc:
        raise CheckpointError(f"{name}: a folder, not a file") from exc
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{name}: not valid JSON: not UTF-8 text") from exc
    except OSError as exc:
        raise CheckpointError(f"{name}: cannot be read: {exc.strerror or exc}") from exc
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError; too deep, or too long a number
        raise CheckpointError(f"{name}: not valid JSON: {exc}") from exc


def json_type(value: Any) -> str:
    """How a JSON value is called in messages."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
