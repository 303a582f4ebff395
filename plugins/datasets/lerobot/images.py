"""Image features stored in the data files as PNG/JPEG bytes, decoded one frame at a time.

Decoding per item (in DataLoader workers) keeps memory flat: only the encoded bytes
stay on disk, mapped by ``columns``; a decoded frame lives as long as its item.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from lerobot_kit.plugins.datasets.lerobot.files import LeRobotDatasetError, require_pil

PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def check_channels(info_file: Path, key: str, shape: tuple[int, ...]) -> None:
    """Refuse, at start-up, a camera whose channel count PIL cannot produce."""
    if shape[0] not in PIL_MODES:
        raise LeRobotDatasetError(
            f"{info_file}: image feature {key!r} has {shape[0]} channels; supported: {sorted(PIL_MODES)}"
        )


def decode_image(data: bytes, shape: tuple[int, ...], where: str) -> np.ndarray:
    """uint8 ``[H, W, C]`` (channel-last, as decoded; see ``item_reads.channels_first``) from
    encoded bytes; ``where`` names file, feature and frame for errors."""
    image_module = require_pil()
    channels, height, width = shape
    try:
        with image_module.open(io.BytesIO(data)) as image:
            pixels = np.asarray(image.convert(PIL_MODES[channels]))
    except Exception as exc:  # noqa: BLE001 - PIL raises several types for bad bytes
        raise LeRobotDatasetError(f"{where} is not a decodable image ({exc})") from exc
    # Pillow's arrays are read-only views of its bytes; tensors are made from these arrays.
    pixels = np.array(pixels.reshape(pixels.shape[0], pixels.shape[1], -1))
    if pixels.shape != (height, width, channels):
        raise LeRobotDatasetError(
            f"{where} is a {pixels.shape[1]}x{pixels.shape[0]} image; meta/info.json declares {width}x{height}"
        )
    return pixels
