"""A step folder's file digests: what is loaded is byte for byte what was saved.

Every file of a checkpoint is hashed (sha256) when it is saved, and the digests go into
one manifest, ``checksums.json`` at the top of the step folder, written into the
temporary folder before it is published: a published step folder always carries the
digests of the bytes its writer meant. Readers compare the files they are about to read
with it, so a flipped bit on a disk, a truncated copy or a file changed after the save
is named in one line instead of loading a silently wrong model or failing deep inside a
loader.

A digest shows integrity, not origin: whoever can rewrite a file can rewrite the
manifest too, so loaders stay safe without it (DCP metadata is unpickled restrictedly).

The manifest::

    {"algorithm": "sha256",
     "files": {"pretrained_model/model.safetensors": {"bytes": 1234, "sha256": "<hex>"}, ...}}

with paths relative to the step folder, in POSIX form. Torch-free: ``inspect-checkpoint``
imports it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TypeVar

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.file_access import access_line, not_a_file_line
from lerobot_kit.core.layout.json_file import read_json, write_json
from lerobot_kit.core.layout.paths import MANIFEST, link_target, resolves_inside
from lerobot_kit.core.layout.regular_file import NotRegularFile, open_regular

ALGORITHM = "sha256"
_CHUNK = 1 << 20
# Files hashed at once: sha256 and file reads release the GIL, so each thread takes a core.
_HASH_THREADS = max(1, min(4, os.cpu_count() or 1))
S = TypeVar("S")
T = TypeVar("T")


class NoManifestError(CheckpointError):
    """The step folder has no ``checksums.json``: written before manifests existed, or
    by a tool that does not write one. Nothing can be verified, which is not damage."""


@dataclass(frozen=True)
class FileDigest:
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, int | str]:
        return {"bytes": self.bytes, "sha256": self.sha256}


def file_digest(path: Path) -> FileDigest:
    """The size and sha256 of one file, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open_regular(path) as handle:
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
            size += n
    return FileDigest(size, digest.hexdigest())


def saved_files(step_dir: Path) -> list[str]:
    """Every regular file under ``step_dir`` (the manifest itself aside), relative, POSIX, sorted."""
    step_dir = Path(step_dir)
    found = []
    for dirpath, _, filenames in os.walk(step_dir):
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(step_dir).as_posix()
            if rel != MANIFEST and path.is_file() and not path.is_symlink():
                found.append(rel)
    return sorted(found)


def hash_files(step_dir: Path, rels: Iterable[str]) -> dict[str, FileDigest]:
    """Digests of the given files, keyed by their path relative to ``step_dir``; several
    files at once (a checkpoint's weights and optimizer shards are hashed side by side)."""
    rels = list(rels)
    return dict(zip(rels, _in_threads(file_digest, [Path(step_dir) / rel for rel in rels])))


def _in_threads(work: Callable[[S], T], files: list[S]) -> list[T]:
    """``[work(f) for f in files]``, up to ``_HASH_THREADS`` at a time, in order; the first
    exception is raised."""
    if len(files) < 2 or _HASH_THREADS == 1:
        return [work(file) for file in files]
    with ThreadPoolExecutor(min(_HASH_THREADS, len(files))) as pool:
        return list(pool.map(work, files))


def write_manifest(step_dir: Path, known: Mapping[str, FileDigest] | None = None) -> Path:
    """Record a digest for every file now in ``step_dir``; returns the manifest's path.

    ``known`` are digests already taken of files in it (by the ranks that wrote them,
    or by a tool that just wrote a file): they are used as they are, the other files
    are hashed here. Entries of ``known`` for files no longer there are dropped. The
    manifest replaces any earlier one atomically.
    """
    step_dir = Path(step_dir)
    known = known or {}
    files = saved_files(step_dir)
    digests = hash_files(step_dir, [rel for rel in files if rel not in known])
    digests = {rel: known[rel] if rel in known else digests[rel] for rel in files}
    body = {"algorithm": ALGORITHM, "files": {rel: d.to_json() for rel, d in digests.items()}}
    target = step_dir / MANIFEST
    write_json(target, body, durable=True)
    return target


def has_manifest(step_dir: Path) -> bool:
    """Whether the step folder has a ``checksums.json`` entry at all (one that is not a
    readable file is then refused by ``read_manifest``, never taken for an older checkpoint)."""
    return os.path.lexists(Path(step_dir) / MANIFEST)


def read_manifest(step_dir: Path) -> dict[str, FileDigest]:
    """The recorded digests; ``NoManifestError`` when there is no manifest, ``CheckpointError``
    when it does not parse or is not a file, ``CheckpointAccessError`` when the system will not
    read it."""
    path = Path(step_dir) / MANIFEST
    if not os.path.lexists(path):
        raise NoManifestError(f"{Path(step_dir)}: no {MANIFEST}, so its files cannot be verified")
    body = read_json(path, "not a readable checksum manifest, so the step folder's files cannot be verified")
    files = body.get("files") if isinstance(body, dict) else None
    if not isinstance(body, dict) or body.get("algorithm") != ALGORITHM or not isinstance(files, dict):
        raise CheckpointError(f'{path}: not a checksum manifest (expected {{"algorithm": "{ALGORITHM}", "files": ...}})')
    digests = {}
    for rel, entry in files.items():
        if not (
            isinstance(entry, dict)
            and type(entry.get("bytes")) is int
            and isinstance(entry.get("sha256"), str)
            and _inside(rel)
        ):
            raise CheckpointError(f"{path}: entry {rel!r} is not a file inside the step folder with bytes and sha256")
        digests[rel] = FileDigest(entry["bytes"], entry["sha256"])
    return digests


@dataclass(frozen=True)
class Finding:
    """A file that differs from the manifest (``unreadable`` False: damage) or that could
    not be read to tell (``unreadable`` True: the system refused it, named with its errno)."""

    line: str
    unreadable: bool = False


def verify_manifest(step_dir: Path, only: Iterable[str] | None = None) -> list[str]:
    """Problems between the files and the manifest, one line naming each file; [] when all match.

    ``only`` limits the check to those files or folders (relative to ``step_dir``, e.g.
    ``"pretrained_model"``); a file named there that the manifest does not record is a
    problem too. Files the manifest does not record are otherwise not looked at. Raises
    ``NoManifestError`` when there is no manifest (``has_manifest`` tells first).
    """
    return [finding.line for finding in manifest_findings(step_dir, only)]


def manifest_findings(step_dir: Path, only: Iterable[str] | None = None) -> list[Finding]:
    """``verify_manifest``'s problems, each marked damage or unreadable."""
    step_dir = Path(step_dir)
    recorded = read_manifest(step_dir)
    selected, problems = _select(recorded, only, step_dir)

    def check(rel: str) -> Finding | None:
        expected, path = recorded[rel], step_dir / rel
        if not resolves_inside(path, step_dir):
            return Finding(f"{path}: links outside the step folder (to {link_target(path)}); nothing outside a "
                           "checkpoint is read")
        try:
            status = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return Finding(f"{path}: missing ({MANIFEST} records a file of {expected.bytes} bytes)")
        except OSError as exc:
            return Finding(access_line(str(path), exc), unreadable=True)
        if not stat.S_ISREG(status.st_mode):
            return Finding(f"{not_a_file_line(str(path), status.st_mode)} ({MANIFEST} records a file of "
                           f"{expected.bytes} bytes)")
        if status.st_size != expected.bytes:
            return Finding(f"{path}: {status.st_size} bytes, but {MANIFEST} records {expected.bytes}")
        try:
            actual = file_digest(path)
        except NotRegularFile as exc:  # replaced since the stat
            return Finding(not_a_file_line(str(path), exc.mode))
        except OSError as exc:
            return Finding(access_line(str(path), exc), unreadable=True)
        if actual.sha256 != expected.sha256:
            return Finding(f"{path}: sha256 differs from the one {MANIFEST} records (changed since it was saved)")
        return None

    found = _in_threads(check, selected)
    return [Finding(line) for line in problems] + [finding for finding in found if finding is not None]


def _select(recorded: Mapping[str, FileDigest], only: Iterable[str] | None, step_dir: Path) -> tuple[list[str], list[str]]:
    if only is None:
        return sorted(recorded), []
    selected: set[str] = set()
    problems = []
    for wanted in only:
        wanted = PurePosixPath(wanted).as_posix().rstrip("/")
        matches = [rel for rel in recorded if rel == wanted or rel.startswith(wanted + "/")]
        if not matches and (step_dir / wanted).is_file():
            problems.append(f"{step_dir / wanted}: not recorded in {MANIFEST} (added after the save?)")
        selected.update(matches)
    return sorted(selected), problems


def _inside(rel: object) -> bool:
    if not isinstance(rel, str) or not rel:
        return False
    parts = PurePosixPath(rel).parts
    return not PurePosixPath(rel).is_absolute() and ".." not in parts and "\\" not in rel
