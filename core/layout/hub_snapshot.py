"""``--policy.path=<user>/<model>``: a pretrained policy on the Hugging Face Hub, as LeRobot takes it
(and as ``lerobot eval --policy.path`` and ``lerobot inspect-checkpoint`` take it).

LeRobot users start fine-tuning from hub ids (``--policy.path=lerobot/smolvla_base``).
A path that exists here is always the local folder; otherwise a value shaped like a repo
id is fetched with ``huggingface_hub.snapshot_download`` into the Hub's own cache (reused
on the next run, shared with LeRobot; ``HF_HUB_OFFLINE=1`` reads only that cache), and the
run continues from the snapshot folder, whose path names the commit: the run's
``train_config.json`` records that folder, so a resume reads the same files and needs no
network. Only JSON and safetensors files are fetched — what a ``pretrained_model/``
holds — and none of them is code. In the Hub's cache a snapshot's files are links into
its repo's ``blobs/``: the checkpoint checks read such a folder as one whose files may
resolve anywhere in that repo's cache folder, and nowhere else (``cached_repo_of``).
``huggingface_hub`` is the optional ``hub`` extra, imported only here and only for a hub id.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

from lerobot_kit.core.errors import ConfigError, first_line

# What the Hub accepts as <user or org>/<name>; anything else is only ever a local path.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
PRETRAINED_FILES = ["*.json", "*.safetensors"]


def cached_repo_of(folder: Path) -> Path | None:
    """The Hub cache folder (``models--<user>--<name>/``) that ``folder`` is a snapshot of, else None."""
    folder = Path(folder).absolute()
    repo = folder.parent.parent
    if folder.parent.name == "snapshots" and repo.name.startswith("models--") and (repo / "blobs").is_dir():
        return repo
    return None


def is_hub_id(value: str) -> bool:
    """Whether ``value`` names a hub repo rather than a folder here (which wins when it exists)."""
    return _REPO_ID.fullmatch(value) is not None and ".." not in value and not Path(value).exists()


def local_policy_path(value: str, given_as: str = "--policy.path=") -> str:
    """``value`` itself, or for a hub id the local snapshot folder holding its files; errors
    name the value as ``given_as`` + value (a flag, or a command's argument)."""
    if not is_hub_id(value):
        return value
    named = f"{given_as}{value}"
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise ConfigError(
            f"{named}: no such folder here, and reading it from the Hugging Face Hub needs "
            "huggingface_hub: pip install 'lerobot-kit[hub]', or give a local checkpoint folder"
        ) from exc
    try:
        return snapshot_download(value, repo_type="model", allow_patterns=PRETRAINED_FILES)
    except Exception as exc:  # offline, unknown repo, gated, auth, disk: each means "not available"
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = "free space where the Hub's cache lives ($HF_HOME/hub, or point HF_HUB_CACHE at a larger disk)"
        else:
            fix = "check the id, the network and your token (HF_TOKEN)"
        raise ConfigError(
            f"{named}: no such folder here, and the Hugging Face Hub did not give it "
            f"({type(exc).__name__}: {first_line(exc)}): {fix}, or give a local checkpoint folder"
        ) from exc
