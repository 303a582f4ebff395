"""A pretrained backbone LeRobot cannot fetch is one line naming the flag.

LeRobot's ACT starts its ResNet backbone from torchvision's ImageNet weights by default
(``--policy.pretrained_backbone_weights=ResNet18_Weights.IMAGENET1K_V1``; Diffusion when
it is set), which torchvision downloads from download.pytorch.org into torch.hub's cache
the first time. Without the network (a cluster node, ``HF_HUB_OFFLINE=1`` does not stop
it), or with a damaged copy in the cache, the download or the load fails inside
LeRobot's constructor with a bare ``URLError``: the flag's setting, not a fault of the
bridge. What fails inside torch.hub's loading is reported with the file to put in the
cache, or the flag that does without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lerobot_kit.api import ConfigError

HUB_LOADER = ("torch.hub", "load_state_dict_from_url")


def raised_in(exc: BaseException, module: str, function: str) -> bool:
    """Whether ``exc`` was raised inside ``module.function`` (or something it called)."""
    trace = exc.__traceback__
    while trace is not None:
        frame = trace.tb_frame
        if frame.f_code.co_name == function and frame.f_globals.get("__name__") == module:
            return True
        trace = trace.tb_next
    return False


def cached_file(weights_name: str) -> tuple[str, Path]:
    """The URL torchvision fetches ``weights_name`` from, and where torch.hub keeps the file."""
    import torch.hub
    from torchvision.models import get_weight

    url = get_weight(weights_name).url
    return url, Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(url).path).name


@contextlib.contextmanager
def backbone_weights_fetched(config: Any) -> Iterator[None]:
    """LeRobot's constructor runs inside; a failure to fetch or read the backbone's pretrained
    weights becomes a ``ConfigError`` naming ``--policy.pretrained_backbone_weights``."""
    try:
        yield
    except Exception as exc:
        name = getattr(config, "pretrained_backbone_weights", None)
        if name is None or isinstance(exc, MemoryError) or not raised_in(exc, *HUB_LOADER):
            raise
        url, file = cached_file(name)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"--policy.pretrained_backbone_weights={name}: torchvision cannot fetch or read these weights "
            f"({type(exc).__name__}: {reason}): without the network, put {file.name} (from {url}) at {file} "
            "(torch.hub's cache, where a run with the network keeps it), or start the backbone from random "
            "weights with --policy.pretrained_backbone_weights=null"
        ) from exc
