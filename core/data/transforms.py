"""Image augmentations (``--dataset.image_transforms``), in plain torch, drawn from a given generator.

Each transform follows the torchvision transform LeRobot configures under the same
name — brightness, contrast and saturation blend with black, the mean grey and the
greyscale image; hue rotates the HSV hue; sharpness blends with a 3x3 smoothed image
(border pixels kept); affine rotates and shifts about the centre with nearest-pixel
sampling and black fill — so LeRobot's ranges mean the same here. They are written
here instead of using torchvision so that every random draw comes from the generator
the caller passes: the loader seeds one per sample from ``(seed, epoch, sample index)``,
which makes an augmented run resume exactly, whatever worker serves the sample.

Frames are float ``[..., C, H, W]`` in [0, 1]; a stack of frames (a camera's history)
gets the same draw, as LeRobot's transform applied to a stacked tensor.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch.nn import functional as F

from lerobot_kit.core.config.data_options import ImageTransformsConfig, transform_ranges

Op = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
GREY_WEIGHTS = (0.2989, 0.587, 0.114)  # ITU-R 601, as torchvision's rgb_to_grayscale


class ImageAugmentation:
    """LeRobot's random subset of transforms: ``n`` picked by weight without replacement."""

    def __init__(self, config: ImageTransformsConfig) -> None:
        picked = [(name, tf) for name, tf in config.tfs.items() if tf.weight > 0]
        self.names = [name for name, _ in picked]
        self.ops = [_make_op(tf.type, transform_ranges(tf.type, tf.kwargs)) for _, tf in picked]
        self.weights = torch.tensor([tf.weight for _, tf in picked], dtype=torch.float64)
        self.count = min(len(picked), config.max_num_transforms)
        self.random_order = config.random_order

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if self.count == 0:
            return images
        chosen = torch.multinomial(self.weights, self.count, replacement=False, generator=generator)
        if not self.random_order:
            chosen = chosen.sort().values
        for index in chosen.tolist():
            images = self.ops[index](images, generator)
        return images


def _uniform(low: float, high: float, generator: torch.Generator) -> float:
    return low + (high - low) * float(torch.rand((), generator=generator, dtype=torch.float64))


def _make_op(kind: str, ranges: dict[str, tuple[float, float]]) -> Op:
    if kind == "Identity":
        return lambda images, generator: images
    if kind == "SharpnessJitter":
        return lambda images, generator: adjust_sharpness(images, _uniform(*ranges["sharpness"], generator))
    if kind == "RandomAffine":
        return lambda images, generator: _random_affine(images, ranges, generator)
    adjust = {"brightness": adjust_brightness, "contrast": adjust_contrast, "saturation": adjust_saturation,
              "hue": adjust_hue}

    def color_jitter(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        # torchvision's ColorJitter applies its factors in a random order.
        order = torch.randperm(4, generator=generator).tolist()
        names = ("brightness", "contrast", "saturation", "hue")
        for name in (names[k] for k in order):
            if name in ranges:
                images = adjust[name](images, _uniform(*ranges[name], generator))
        return images

    return color_jitter


def grey(images: torch.Tensor) -> torch.Tensor:
    r, g, b = images.unbind(-3)
    return (GREY_WEIGHTS[0] * r + GREY_WEIGHTS[1] * g + GREY_WEIGHTS[2] * b).unsqueeze(-3)


def _blend(images: torch.Tensor, other: torch.Tensor, factor: float) -> torch.Tensor:
    return (factor * images + (1.0 - factor) * other).clamp(0.0, 1.0)


def adjust_brightness(images: torch.Tensor, factor: float) -> torch.Tensor:
    return _blend(images, torch.zeros_like(images), factor)


def adjust_contrast(images: torch.Tensor, factor: float) -> torch.Tensor:
    mean = grey(images).mean(dim=(-3, -2, -1), keepdim=True) if images.shape[-3] == 3 else images.mean(
        dim=(-3, -2, -1), keepdim=True)
    return _blend(images, mean, factor)


def adjust_saturation(images: torch.Tensor, factor: float) -> torch.Tensor:
    if images.shape[-3] != 3:
        return images
    return _blend(images, grey(images), factor)


def adjust_hue(images: torch.Tensor, shift: float) -> torch.Tensor:
    """Rotate the hue by ``shift`` turns (in [-0.5, 0.5])."""
    if images.shape[-3] != 3:
        return images
    h, s, v = _rgb_to_hsv(images).unbind(-3)
    return _hsv_to_rgb(torch.stack(((h + shift) % 1.0, s, v), dim=-3))


def adjust_sharpness(images: torch.Tensor, factor: float) -> torch.Tensor:
    """Blend with the image smoothed by [[1,1,1],[1,5,1],[1,1,1]]/13; the one-pixel border stays."""
    if images.shape[-1] <= 2 or images.shape[-2] <= 2:
        return images
    shape = images.shape
    flat = images.reshape(-1, 1, shape[-2], shape[-1])
    kernel = torch.ones(1, 1, 3, 3, dtype=images.dtype, device=images.device)
    kernel[0, 0, 1, 1] = 5.0
    smoothed = flat.clone()
    smoothed[..., 1:-1, 1:-1] = F.conv2d(flat, kernel / kernel.sum())
    return _blend(images, smoothed.reshape(shape), factor)


def _random_affine(
    images: torch.Tensor, ranges: dict[str, tuple[float, float]], generator: torch.Generator
) -> torch.Tensor:
    height, width = images.shape[-2:]
    angle = _uniform(*ranges.get("degrees", (0.0, 0.0)), generator)
    max_x, max_y = ranges.get("translate", (0.0, 0.0))
    shift_x = round(_uniform(-max_x * width, max_x * width, generator))
    shift_y = round(_uniform(-max_y * height, max_y * height, generator))
    return affine(images, angle, shift_x, shift_y)


def affine(images: torch.Tensor, angle: float, shift_x: int, shift_y: int) -> torch.Tensor:
    """Rotate by ``angle`` degrees clockwise (torchvision's ``affine``) about the centre, then shift by pixels.

    Each output pixel takes the input pixel the inverse transform lands nearest to;
    pixels from outside the frame are black.
    """
    shape = images.shape
    height, width = shape[-2:]
    rad = math.radians(angle)
    cos, sin = math.cos(rad), math.sin(rad)
    # Inverse of rotate-then-translate, in pixel coordinates centred on the image.
    inverse = torch.tensor(
        [[cos, sin, -(cos * shift_x + sin * shift_y)], [-sin, cos, -(-sin * shift_x + cos * shift_y)]],
        dtype=torch.float64,
    )
    xs = torch.arange(width, dtype=torch.float64) - (width - 1) / 2
    ys = torch.arange(height, dtype=torch.float64) - (height - 1) / 2
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    points = torch.stack((grid_x, grid_y, torch.ones_like(grid_x)), dim=-1) @ inverse.T  # [H, W, 2] source pixels
    normalised = points / torch.tensor([width / 2, height / 2], dtype=torch.float64)
    flat = images.reshape(-1, shape[-3], height, width)
    grid = normalised.to(images.dtype).expand(flat.shape[0], height, width, 2)
    out = F.grid_sample(flat, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.reshape(shape)


def _rgb_to_hsv(images: torch.Tensor) -> torch.Tensor:
    r, g, b = images.unbind(-3)
    maxc, _ = images.max(dim=-3)
    minc, _ = images.min(dim=-3)
    delta = maxc - minc
    s = torch.where(maxc > 0, delta / torch.where(maxc > 0, maxc, torch.ones_like(maxc)), torch.zeros_like(maxc))
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    rc, gc, bc = (maxc - r) / safe, (maxc - g) / safe, (maxc - b) / safe
    h = torch.where(maxc == r, bc - gc, torch.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    h = torch.where(delta > 0, (h / 6.0) % 1.0, torch.zeros_like(h))
    return torch.stack((h, s, maxc), dim=-3)


def _hsv_to_rgb(images: torch.Tensor) -> torch.Tensor:
    h, s, v = images.unbind(-3)
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.to(torch.int64) % 6
    p, q, t = v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s * (1.0 - f))
    choices = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    out = [torch.zeros_like(v) for _ in range(3)]
    for k, (r, g, b) in enumerate(choices):
        mask = i == k
        for channel, value in zip(out, (r, g, b)):
            channel.copy_(torch.where(mask, value, channel))
    return torch.stack(out, dim=-3)
