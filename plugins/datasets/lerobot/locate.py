"""Where a LeRobot dataset lives on disk: ``--dataset.root``, LeRobot's cache, or the Hub cache.

Runs stay offline by default: the folders LeRobot and ``huggingface_hub`` download into
are searched, and the network is touched only with ``--dataset.allow_download=true``.

Search order without a root:

1. ``$HF_LEROBOT_HOME/<repo_id>`` (default ``$HF_HOME/lerobot``, ``HF_HOME`` default
   ``~/.cache/huggingface``): where LeRobot records and keeps datasets.
2. ``$HF_LEROBOT_HOME/hub`` and then ``$HF_HUB_CACHE`` (default ``$HF_HOME/hub``): Hub
   caches, ``datasets--<user>--<name>/snapshots/<commit>/``. The snapshot is the one
   ``refs/<revision>`` points at (or a commit given as the revision); with no revision,
   ``refs/v3.0`` (LeRobot's tag), then ``refs/main``, then the newest snapshot.
"""

from __future__ import annotations

import os
from pathlib import Path

from lerobot_kit.plugins.datasets.lerobot.files import MISSING, LeRobotDatasetError, file_problem

INFO_FILE = "meta/info.json"
DEFAULT_REFS = ("v3.0", "main")


def hf_home() -> Path:
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser()


def lerobot_home() -> Path:
    return Path(os.environ.get("HF_LEROBOT_HOME", str(hf_home() / "lerobot"))).expanduser()


def hub_caches() -> list[Path]:
    """LeRobot's own snapshot cache first, then the system-wide Hub cache."""
    system = Path(os.environ.get("HF_HUB_CACHE", str(hf_home() / "hub"))).expanduser()
    return [lerobot_home() / "hub", system]


def locate_dataset(repo_id: str, root: str | None, revision: str | None, allow_download: bool) -> Path:
    """The folder holding ``meta/info.json`` of ``repo_id``; downloads only if allowed."""
    if root is not None:
        folder = Path(root).expanduser()
        problem = file_problem(folder / INFO_FILE)
        if problem is None:
            return folder
        if problem != MISSING:
            raise LeRobotDatasetError(
                f"{folder / INFO_FILE}: {problem}; put the dataset's meta/info.json there (re-copy or re-download "
                "the dataset)"
            )
        if allow_download:
            return _download(repo_id, revision, local_dir=folder)
        raise LeRobotDatasetError(
            f"--dataset.root={root}: no LeRobot dataset there ({folder / INFO_FILE} is missing). "
            "Point --dataset.root at the folder holding meta/ and data/, or add "
            "--dataset.allow_download=true to download it there"
        )
    looked: list[str] = []
    local = lerobot_home() / repo_id
    looked.append(str(local))
    if (local / INFO_FILE).is_file():
        return local
    for cache in hub_caches():
        repo_dir = cache / ("datasets--" + repo_id.replace("/", "--"))
        looked.append(str(repo_dir))
        snapshot = _snapshot(repo_dir, revision)
        if snapshot is not None:
            return snapshot
    if allow_download:
        return _download(repo_id, revision, local_dir=None)
    wanted = f" at revision {revision!r}" if revision else ""
    raise LeRobotDatasetError(
        f"dataset {repo_id!r}{wanted} not found locally; looked in {', '.join(looked)}. "
        "Give its folder with --dataset.root=<dir>, or add --dataset.allow_download=true to fetch it from the Hub"
    )


def _snapshot(repo_dir: Path, revision: str | None) -> Path | None:
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return None
    for ref in [revision] if revision else DEFAULT_REFS:
        ref_file = repo_dir / "refs" / ref
        commit = ref_file.read_text().strip() if ref_file.is_file() else ref
        candidate = snapshots / commit
        if (candidate / INFO_FILE).is_file():
            return candidate
    if revision:
        return None
    complete = [p for p in snapshots.iterdir() if (p / INFO_FILE).is_file()]
    return max(complete, key=lambda p: (p / INFO_FILE).stat().st_mtime, default=None)


def _download(repo_id: str, revision: str | None, local_dir: Path | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise LeRobotDatasetError(
            "--dataset.allow_download=true needs huggingface_hub: pip install 'lerobot-kit[hub]'"
        ) from exc
    try:
        path = snapshot_download(
            repo_id, repo_type="dataset", revision=revision, local_dir=str(local_dir) if local_dir else None
        )
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, auth: all reported the same way
        raise LeRobotDatasetError(
            f"could not download dataset {repo_id!r} from the Hugging Face Hub: {type(exc).__name__}: {exc}. "
            "Check the id and your network, or copy the dataset and pass --dataset.root=<dir>"
        ) from exc
    folder = Path(path)
    if not (folder / INFO_FILE).is_file():
        raise LeRobotDatasetError(
            f"downloaded {repo_id!r} to {folder}, but it has no {INFO_FILE}: not a LeRobot dataset"
        )
    return folder
