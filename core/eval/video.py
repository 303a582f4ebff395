"""Rollout videos: H.264 mp4 through PyAV (the ``video`` extra), which ships its own FFmpeg.

H.264 in yuv420p plays in browsers and every player (what LeRobot's eval videos are);
frames are padded to even sizes, which 4:2:0 chroma needs.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np

from lerobot_kit.core.errors import ConfigError


def import_av() -> ModuleType:
    """PyAV, or one line saying how to get it or how to do without videos."""
    try:
        import av
    except ImportError as exc:
        raise ConfigError(
            "rollout videos need PyAV: pip install 'lerobot-kit[video]', or pass --eval.max_episodes_rendered=0"
        ) from exc
    return av


def write_mp4(path: Path, frames: list[np.ndarray], fps: int) -> None:
    """Encode uint8 ``[H, W, 3]`` frames, one per ``1/fps`` from time 0."""
    av = import_av()
    height, width = frames[0].shape[:2]
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps, options={"crf": "18"})
        stream.width, stream.height = width + width % 2, height + height % 2
        stream.pix_fmt = "yuv420p"
        for i, pixels in enumerate(frames):
            padded = np.pad(pixels, ((0, height % 2), (0, width % 2), (0, 0)))
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(padded), format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
