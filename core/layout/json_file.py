"""Reading one JSON file of a checkpoint: any way it fails to parse is one ``CheckpointError`` line.

A disk fault, a truncated copy or a hand edit can leave bytes that are not UTF-8, not
JSON, nested deeper than the parser's recursion allows, or a folder or a named pipe
where a file should be; every reader of a checkpoint's JSON goes through ``read_json``
so each of these names the file instead of raising whatever the parser raises (or
waiting forever on the pipe). Torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.file_access import CheckpointAccessError, access_line, open_checkpoint_file


def read_json(path: Path, label: str | None = None) -> Any:
    """The parsed value of ``path``; one ``CheckpointError`` line starting with ``label`` (default: the path).

    Only a regular file is read (``open_checkpoint_file``): a named pipe or a device is
    refused unopened, and a file the system will not read is a ``CheckpointAccessError``.
    """
    name = label or str(path)
    with open_checkpoint_file(Path(path), name) as handle:
        try:
            raw = handle.read()
        except OSError as exc:
            raise CheckpointAccessError(access_line(name, exc)) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{name}: not valid JSON: not UTF-8 text") from exc
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError; too deep, or too long a number
        raise CheckpointError(f"{name}: not valid JSON: {exc}") from exc


def json_type(value: Any) -> str:
    """How a JSON value is called in messages."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
