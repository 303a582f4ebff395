"""The installed distribution's version, recorded in checkpoints and banners."""

from __future__ import annotations

from importlib import metadata


def package_version() -> str:
    try:
        return metadata.version("lerobot-kit")
    except metadata.PackageNotFoundError:
        return "0+unknown"
