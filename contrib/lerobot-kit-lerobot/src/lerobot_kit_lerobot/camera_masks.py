"""A mixture sample's missing camera masked out of π0, π0.5 and SmolVLA, as LeRobot masks a
camera the whole batch lacks.

LeRobot's VLAs prepare each camera's image and a ``[B]`` mask (``_preprocess_images`` for
π0/π0.5, ``prepare_images`` for SmolVLA); a camera absent from the batch becomes an image
of -1 (black after their [0, 1] -> [-1, 1] mapping) with a False mask, or no image at all
(SmolVLA past ``empty_cameras``). Masked image tokens are attended by no other token and
move no position, so the loss and the actions do not depend on what they hold.

A mixture batch holds every camera of any member, with a black placeholder and a True
``missing_key(camera)`` flag for the samples whose member lacks it. ``install`` wraps the
policy's preparation method so that, where a batch carries such flags, those samples get
LeRobot's empty-camera image and a False mask: per sample what LeRobot does per batch.
Training (``vla_loss`` calls the same method) and inference (LeRobot's ``select_action`` /
``predict_action_chunk``) both go through it; a batch without flags is prepared as LeRobot
prepares it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lerobot_kit.api import missing_key

# What LeRobot's VLAs give a camera they have no image of (-1: black in SigLIP's [-1, 1] range).
EMPTY_CAMERA = -1.0

Prepared = tuple[list[Tensor], list[Tensor]]


def preparation_method(lerobot_type: str) -> str:
    """The name of the LeRobot method that turns a batch's cameras into images and masks."""
    return "prepare_images" if lerobot_type == "smolvla" else "_preprocess_images"


def install(policy: Any) -> None:
    """Wrap LeRobot's VLA ``policy``'s image preparation, on this object only, with the
    per-sample masks (see the module doc)."""
    name = preparation_method(policy.config.type)
    setattr(policy, name, functools.partial(masked_images, getattr(policy, name), policy.config))


def masked_images(prepare: Callable[[dict[str, Tensor]], Prepared], config: Any, batch: dict[str, Tensor]) -> Prepared:
    """LeRobot's images and masks for ``batch``, each flagged sample's camera made empty.

    LeRobot lists the cameras the batch holds first, in the config's order, then the
    placeholders for those it lacks, so a held camera's position is its place among them."""
    images, masks = prepare(batch)
    held = [camera for camera in config.image_features if camera in batch]
    for position, camera in enumerate(held):
        flag = batch.get(missing_key(camera))
        if flag is None:
            continue
        mask = masks[position]
        missing = flag.to(device=mask.device, dtype=torch.bool).reshape(-1).expand_as(mask)
        image = images[position]
        images[position] = image.masked_fill(missing.view(-1, *[1] * (image.ndim - 1)), EMPTY_CAMERA)
        masks[position] = mask & ~missing
    return images, masks
