"""What a VLA's tokenizer or VLM folder holds, recorded with the run so a resume compares contents, not paths.

π0/π0.5 tokenize with the folder ``--policy.tokenizer_name`` names, SmolVLA builds its VLM
from and tokenizes with ``--policy.vlm_model_name``'s. A resume must find the same files
(other token ids, another architecture would train something else), but a path says
little: the folder may have moved with the data, or another folder may sit at the old
path. So the run records, beside the flag's value in ``train_config.json``, a digest of
what the folder held when the run's config was validated (``files_digest``), and a resume
compares the digests: a folder that moved is taken from the flag, one whose files
changed is refused in one line naming the flag.

The digest is the run's record, never the user's input: its key holds a dot, which no flag
can produce (``--policy.a.b`` is the field ``b`` of a section ``a``), so a flag of that
name is an unknown flag, and the key is dropped only where a recorded config is read back.

The digest covers every file at the folder's top level (names and contents) but weights:
a resume restores every weight from the checkpoint, so a VLM folder's pretrained weights
(``--policy.load_vlm_weights=true``) matter only to a run's start, and hashing gigabytes
at every start would be slow. A hub id is not a folder: it is compared as a name, as
before. Torch-free.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

from lerobot_kit.api import NotRegularFile, open_regular

# LeRobot type -> the flag naming the folder of files LeRobot loads for it.
FILES_FLAG = {"pi0": "tokenizer_name", "pi05": "tokenizer_name", "smolvla": "vlm_model_name"}
DIGEST_KEY = "recorded.files_digest"
# The key runs recorded it under before it was renamed (a name that reads as a flag): read alike
# when it holds a digest; anything else under it stays an unknown flag.
EARLIER_DIGEST_KEY = "files_digest"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".npz")


def folder_digest(name: str) -> str | None:
    """``sha256:<hex>`` of the folder ``name`` (its top-level files less weights, by name and
    content); None when ``name`` is not a local folder (a hub id) or cannot be read."""
    folder = Path(name).expanduser()
    try:
        if not folder.is_dir():
            return None
        files = sorted(path for path in folder.iterdir() if _hashed(path))
        signature = tuple((path.name, path.stat().st_size, path.stat().st_mtime_ns) for path in files)
        return _digest(str(folder.resolve()), signature)
    except (OSError, NotRegularFile):
        return None  # replaced since the folder's check (``folder_files``), which names it on the next start


def _hashed(path: Path) -> bool:
    return path.is_file() and not path.name.startswith(".") and path.suffix not in WEIGHT_SUFFIXES


@cache
def _digest(folder: str, signature: tuple[tuple[str, int, int], ...]) -> str:
    """Keyed by each file's size and modification time, so a process hashes a folder once."""
    total = hashlib.sha256()
    for name, _, _ in signature:
        content = hashlib.sha256()
        with open_regular(Path(folder) / name) as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                content.update(block)
        total.update(f"{name}\0{content.hexdigest()}\n".encode())
    return f"sha256:{total.hexdigest()}"


def resume_views(
    flag: str | None, new: dict[str, Any], recorded: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both policy sections as a resume compares them: where both name a folder with its
    digest, the flag's value stands for the folder's contents (the same files: no
    difference, wherever the folder is; other files: the paths with their digests, so the
    line naming the flag shows both); otherwise the values as they are."""
    new_digest, old_digest = recorded_digest(new), recorded_digest(recorded)
    new, recorded = without_digest(new), without_digest(recorded)
    if flag is None or not (new_digest and old_digest and flag in new and flag in recorded):
        return new, recorded
    if new_digest == old_digest:
        return new, {**recorded, flag: new[flag]}
    return ({**new, flag: f"{new[flag]} (files {new_digest[:19]}…)"},
            {**recorded, flag: f"{recorded[flag]} (files {old_digest[:19]}…)"})


def recorded_digest(section: dict[str, Any]) -> str | None:
    """The folder digest a policy section records, under either key it has been recorded as."""
    return next((section[key] for key in _digest_keys(section) if section[key]), None)


def without_digest(section: dict[str, Any]) -> dict[str, Any]:
    dropped = _digest_keys(section)
    return {key: value for key, value in section.items() if key not in dropped}


def _digest_keys(section: dict[str, Any]) -> list[str]:
    earlier = section.get(EARLIER_DIGEST_KEY)
    keys = [DIGEST_KEY] if DIGEST_KEY in section else []
    if isinstance(earlier, str) and earlier.startswith("sha256:"):
        keys.append(EARLIER_DIGEST_KEY)
    return keys
