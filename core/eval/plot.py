"""``rollouts.png``: every evaluated episode's path, green when it succeeded, red when not.

One look tells whether failures are systematic (all heading the wrong way, stopping
short of the goal, circling it) or scattered. Drawn with numpy and written with zlib,
so evaluation needs no plotting library: the axes are the environment's own
coordinates (+y up), fitted to the paths; each path starts at a grey dot and its goal is
a ring in the path's colour. Failures are drawn last, on top.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from lerobot_kit.core.eval.rollout import Episode

SIZE = 512
MARGIN = 24
SUCCESS_RGB = (30, 150, 60)
FAILURE_RGB = (210, 40, 40)
START_RGB = (120, 120, 120)


def write_rollout_plot(path: Path, episodes: list[Episode]) -> bool:
    """Draw the episodes that carry a path; False (nothing written) when none does."""
    drawn = [e for e in episodes if e.path]
    if not drawn:
        return False
    points = np.concatenate([np.asarray(e.path) for e in drawn] + [np.asarray([e.goal]) for e in drawn if e.goal])
    low, high = points.min(0), points.max(0)
    scale = (SIZE - 2 * MARGIN) / max(float((high - low).max()), 1e-9)
    centre = (low + high) / 2

    def to_pixels(xy: np.ndarray) -> np.ndarray:
        """Environment (x, y) → (column, row), centred, +y up."""
        column = SIZE / 2 + (xy[:, 0] - centre[0]) * scale
        row = SIZE / 2 - (xy[:, 1] - centre[1]) * scale
        return np.stack([column, row], axis=1)

    canvas = np.full((SIZE, SIZE, 3), 255, dtype=np.uint8)
    for episode in sorted(drawn, key=lambda e: not e.success):
        colour = SUCCESS_RGB if episode.success else FAILURE_RGB
        pixels = to_pixels(np.asarray(episode.path))
        _polyline(canvas, pixels, colour)
        _disc(canvas, pixels[0], 3.5, START_RGB)
        if episode.goal is not None:
            _ring(canvas, to_pixels(np.asarray([episode.goal]))[0], 6.0, colour)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_png(canvas))
    return True


def _paint(canvas: np.ndarray, columns: np.ndarray, rows: np.ndarray, colour: tuple[int, int, int]) -> None:
    columns, rows = np.rint(columns).astype(int), np.rint(rows).astype(int)
    inside = (columns >= 0) & (columns < canvas.shape[1]) & (rows >= 0) & (rows < canvas.shape[0])
    canvas[rows[inside], columns[inside]] = colour


def _polyline(canvas: np.ndarray, pixels: np.ndarray, colour: tuple[int, int, int]) -> None:
    """Segments sampled every half pixel, two pixels wide."""
    for start, end in zip(pixels[:-1], pixels[1:]):
        n = max(int(np.ceil(np.abs(end - start).max() * 2)), 1)
        t = np.linspace(0.0, 1.0, n + 1)[:, None]
        line = start + (end - start) * t
        for dx, dy in ((0, 0), (1, 0), (0, 1), (1, 1)):
            _paint(canvas, line[:, 0] + dx - 0.5, line[:, 1] + dy - 0.5, colour)


def _disc(canvas: np.ndarray, centre: np.ndarray, radius: float, colour: tuple[int, int, int]) -> None:
    offsets = np.arange(-int(radius), int(radius) + 1)
    dx, dy = np.meshgrid(offsets, offsets)
    keep = dx**2 + dy**2 <= radius**2
    _paint(canvas, centre[0] + dx[keep], centre[1] + dy[keep], colour)


def _ring(canvas: np.ndarray, centre: np.ndarray, radius: float, colour: tuple[int, int, int]) -> None:
    angles = np.linspace(0.0, 2 * np.pi, 64)
    for r in (radius, radius - 1):
        _paint(canvas, centre[0] + r * np.cos(angles), centre[1] + r * np.sin(angles), colour)


def encode_png(rgb: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of ``rgb`` [H, W, 3] (filter 0 on every row)."""
    height, width = rgb.shape[:2]
    raw = np.concatenate([np.zeros((height, 1), dtype=np.uint8), rgb.reshape(height, width * 3)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)) + chunk(b"IEND", b"")
