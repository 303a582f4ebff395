"""Reading and writing the project's JSON files: one reader, whose every failure is one line.

A disk fault, a truncated copy or a hand edit can leave bytes that are not UTF-8, not
JSON, nested deeper than the parser's recursion allows, or a folder, a named pipe or a
device where a file should be. Every JSON file lerobot-kit reads (a checkpoint's, a
dataset's, a config) goes through ``parse_json_file``: the file is opened as a regular
file only (``regular_file``: a named pipe never blocks, ``/dev/zero`` is never read), and
each way it fails is an ``UnusableJson`` phrase instead of whatever the parser raises.
``read_json`` turns that phrase into the caller's error, one line naming the file and
ending with the caller's fix (what the file is, and what to do about it). A caller that
opens its file its own way hands the bytes to ``decode_json_bytes``, for the same phrases.
Every JSON file lerobot-kit writes goes through ``write_json``, one layout for all of them,
replaced atomically where a crash must not tear it. Torch-free.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from lerobot_kit.core.errors import CheckpointError, LerobotError
from lerobot_kit.core.layout.file_access import (
    CheckpointAccessError,
    NotAFileError,
    access_line,
    access_problem,
    not_a_file_problem,
)
from lerobot_kit.core.layout.fsync import fsync_dir
from lerobot_kit.core.layout.paths import TMP_SUFFIX
from lerobot_kit.core.layout.regular_file import NotRegularFile, open_regular


class UnusableJson(ValueError):
    """Why a text or file is not usable as JSON, as one phrase (no file name), and ``fix``,
    what to do about it when that does not depend on where the JSON came from."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(problem)
        self.fix = fix


class NotAJsonFile(UnusableJson):
    """The path names a folder, a named pipe, a device or a socket."""


class UnreadableJsonFile(UnusableJson):
    """The system refused to read the file (``os_error``): its contents were not seen, so
    nothing is known to be wrong with them."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(access_problem(os_error))
        self.os_error = os_error


class SizeLimit(NamedTuple):
    """A bound on what is read: a file above ``max_bytes`` is refused with ``problem``."""

    max_bytes: int
    problem: str


def parse_json_file(path: Path, *, decode: Callable[[str], Any] = json.loads, limit: SizeLimit | None = None) -> Any:
    """The JSON value in the regular file ``path`` (links followed), decoded by ``decode``;
    ``UnusableJson`` (a phrase) for any way it is not one: missing, not a file, unreadable,
    above ``limit``, not UTF-8, not JSON."""
    try:
        handle = open_regular(path)
    except FileNotFoundError as exc:
        raise UnusableJson("missing") from exc
    except NotRegularFile as exc:
        raise NotAJsonFile(not_a_file_problem(exc.mode)) from exc
    except OSError as exc:
        raise UnreadableJsonFile(exc) from exc
    try:
        with handle:
            if limit is not None and os.fstat(handle.fileno()).st_size > limit.max_bytes:
                raise UnusableJson(limit.problem)
            raw = handle.read() if limit is None else handle.read(limit.max_bytes + 1)  # /proc files report size 0
    except OSError as exc:
        raise UnreadableJsonFile(exc) from exc
    if limit is not None and len(raw) > limit.max_bytes:
        raise UnusableJson(limit.problem)
    return decode_json_bytes(raw, decode)


def decode_json_bytes(raw: bytes, decode: Callable[[str], Any] = json.loads) -> Any:
    """``raw`` as UTF-8 JSON, for bytes read by a caller that opens its file its own way
    (a safetensors header, a cache manifest): the same phrases as a file read here."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnusableJson(
            f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})", "save it as UTF-8 JSON"
        ) from exc
    return decode_json_text(text, decode)


def decode_json_text(text: str, decode: Callable[[str], Any] = json.loads) -> Any:
    """``decode(text)``, with the parser's own errors as ``UnusableJson`` phrases."""
    try:
        return decode(text)
    except UnusableJson:
        raise
    except json.JSONDecodeError as exc:
        raise UnusableJson(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    except RecursionError as exc:
        raise UnusableJson("not valid JSON (nested deeper than the parser can follow)") from exc
    except ValueError as exc:  # an integer of more digits than Python converts
        raise UnusableJson(f"not valid JSON ({exc})") from exc


def read_json(path: Path, fix: str | None = None, *, label: str | None = None,
              error: type[LerobotError] = CheckpointError) -> Any:
    """The JSON value in ``path``, or one ``error`` line: ``<label>: <problem>; <fix>``.

    ``label`` names the file (default: its path); ``fix`` says what the file is and what
    to do about it ("the checkpoint is damaged: ..."). A file the system will not let this
    user read is not called damaged: its line gives the system's fix instead (for a
    checkpoint's file a ``CheckpointAccessError``, whose fix names the errno's cause). A
    checkpoint's path that is not a file is a ``NotAFileError``.
    """
    name = label or str(path)
    checkpoint = error is CheckpointError
    try:
        return parse_json_file(Path(path))
    except UnreadableJsonFile as exc:
        if checkpoint:
            raise CheckpointAccessError(access_line(name, exc.os_error), name) from exc
        raise error(f"{name}: {exc}; fix what the system reports and run again") from exc
    except UnusableJson as exc:
        kind = NotAFileError if checkpoint and isinstance(exc, NotAJsonFile) else error
        raise kind(f"{name}: {exc}" + (f"; {fix}" if fix else "")) from exc


def write_json(path: Path, data: Any, *, durable: bool = False) -> None:
    """``data`` as a JSON file, indented as LeRobot writes its own.

    ``durable`` is for a record that replaces one a crash must not tear (a checkpoint's
    ``training_step.json``, its ``checksums.json``): the text goes to a temporary file
    beside ``path``, reaches the disk, and is renamed over ``path``, whose folder entry is
    then flushed too, so a crash leaves the old record or the new one, never half of one.
    """
    text = json.dumps(data, indent=2) + "\n"
    if not durable:
        Path(path).write_text(text, encoding="utf-8")
        return
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def json_type(value: Any) -> str:
    """How a JSON value is called in messages."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
