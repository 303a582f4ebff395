"""How frames are sampled and augmented: ``--dataset.image_transforms.*`` and ``--dataset.sampler.*``.

Torch-free (pydantic only), so ``lerobot train --help`` lists these flags without torch.

Image augmentations keep LeRobot's names and defaults (``ImageTransformsConfig`` of
LeRobot 0.6.1): ``--dataset.image_transforms.enable=true`` turns them on; each item
then gets ``min(max_num_transforms, transforms with weight > 0)`` of them, drawn without
replacement with probability proportional to ``weight``, applied in the listed order
unless ``random_order``. Each transform's ``kwargs`` give the range its factor is drawn
from, as torchvision's transforms of the same ``type`` read them. A transform is set
whole or field by field (``--dataset.image_transforms.tfs.hue.weight=2``); ``kwargs``
replace the default kwargs of that transform.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lerobot_kit.core.config.bounds import within_int64

# type -> kwargs it accepts. These are the types of LeRobot's default transforms.
TRANSFORM_TYPES: dict[str, tuple[str, ...]] = {
    "Identity": (),
    "ColorJitter": ("brightness", "contrast", "saturation", "hue"),
    "SharpnessJitter": ("sharpness",),
    "RandomAffine": ("degrees", "translate"),
}
DEFAULT_TRANSFORMS: dict[str, dict[str, Any]] = {
    "brightness": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"brightness": [0.8, 1.2]}},
    "contrast": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"contrast": [0.8, 1.2]}},
    "saturation": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"saturation": [0.5, 1.5]}},
    "hue": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"hue": [-0.05, 0.05]}},
    "sharpness": {"weight": 1.0, "type": "SharpnessJitter", "kwargs": {"sharpness": [0.5, 1.5]}},
    "affine": {"weight": 1.0, "type": "RandomAffine", "kwargs": {"degrees": [-5.0, 5.0], "translate": [0.05, 0.05]}},
}


class _Options(BaseModel):
    """As ``Section``: unknown keys are errors, integers within int64, floats finite."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _numbers_in_range(cls, value: Any) -> Any:
        return within_int64(value)


class ImageTransformConfig(_Options):
    weight: float = Field(1.0, ge=0, description="Relative chance of being picked; 0 disables the transform.")
    type: str = Field("Identity", description=f"One of {', '.join(TRANSFORM_TYPES)}.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Ranges of the transform's random factors.")

    @model_validator(mode="after")
    def _known_type_and_ranges(self) -> ImageTransformConfig:
        transform_ranges(self.type, self.kwargs)
        return self


class ImageTransformsConfig(_Options):
    enable: bool = Field(False, description="Augment camera frames while training (in DataLoader workers).")
    max_num_transforms: int = Field(3, ge=1, description="Transforms applied to each frame, at most.")
    random_order: bool = Field(False, description="Apply the picked transforms in random order, not as listed.")
    tfs: dict[str, ImageTransformConfig] = Field(
        default_factory=lambda: {k: ImageTransformConfig(**v) for k, v in DEFAULT_TRANSFORMS.items()},
        description="Named transforms: brightness, contrast, saturation, hue, sharpness, affine (LeRobot's).",
    )

    @field_validator("tfs", mode="before")
    @classmethod
    def _over_the_defaults(cls, value: Any) -> Any:
        """A partial entry (``tfs.hue.weight=2``) keeps the rest of that transform's defaults."""
        if not isinstance(value, dict):
            return value
        merged: dict[str, Any] = {k: dict(v) for k, v in DEFAULT_TRANSFORMS.items()}
        for name, entry in value.items():
            if isinstance(entry, BaseModel):
                entry = entry.model_dump()
            if isinstance(entry, dict) and name in merged:
                merged[name] = {**merged[name], **entry}
            else:
                merged[name] = entry
        return merged


class SamplerConfig(_Options):
    type: Literal["random", "episode_blocks"] = Field(
        "random",
        description="random: uniform permutation of frames each epoch; episode_blocks: contiguous runs of frames "
        "decoded in sequence, shuffled in windows (faster video decoding, less random batches).",
    )
    block_size: int = Field(16, ge=1, description="episode_blocks: frames per block (never across episodes).")
    buffer_size: int = Field(
        256, ge=1, description="episode_blocks: frames shuffled together, a window a worker decodes into its batches "
        "(rounded down to whole batches); each worker holds two windows in memory.")

    @model_validator(mode="after")
    def _no_ignored_block_options(self) -> SamplerConfig:
        """The random sampler has no blocks: a block option set for it would be recorded and never used.
        Compared with the defaults, so a recorded config (which lists every field) loads again."""
        if self.type == "random":
            for name in ("block_size", "buffer_size"):
                if getattr(self, name) != type(self).model_fields[name].default:
                    raise ValueError(
                        f"{name} applies to type=episode_blocks only, so with type=random it would be ignored: "
                        f"add --dataset.sampler.type=episode_blocks or remove --dataset.sampler.{name}"
                    )
        return self


def transform_ranges(kind: str, kwargs: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """``kwargs`` of a transform ``kind`` as (low, high) ranges, as torchvision reads them.

    A single number ``x`` means ``[max(0, 1-x), 1+x]`` for multiplicative factors,
    ``[-x, x]`` for hue and degrees; ``translate`` is the largest shift as fractions of
    width and height. Raises ``ValueError`` (a flag error) naming what is wrong.
    """
    if kind not in TRANSFORM_TYPES:
        raise ValueError(f"unsupported transform type {kind!r}; supported: {', '.join(TRANSFORM_TYPES)}")
    unknown = sorted(set(kwargs) - set(TRANSFORM_TYPES[kind]))
    if unknown:
        raise ValueError(f"{kind} takes {list(TRANSFORM_TYPES[kind]) or 'no kwargs'}, not {unknown}")
    if kind == "ColorJitter" and not kwargs:
        raise ValueError("ColorJitter needs at least one of brightness, contrast, saturation, hue")
    out = {}
    for name, value in kwargs.items():
        if name == "translate":
            x, y = _pair(name, value)
            if not (0 <= x <= 1 and 0 <= y <= 1):
                raise ValueError(f"translate fractions must lie in [0, 1], got {value}")
            out[name] = (x, y)
            continue
        centred = name in ("hue", "degrees")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} as one number must be finite and >= 0, got {value}")
            low, high = (-float(value), float(value)) if centred else (max(0.0, 1 - value), 1.0 + value)
        else:
            low, high = _pair(name, value)
        if low > high or (not centred and low < 0) or (name == "hue" and not -0.5 <= low <= high <= 0.5):
            bound = {"hue": "-0.5 <= low <= high <= 0.5", "degrees": "low <= high"}.get(name, "0 <= low <= high")
            raise ValueError(f"{name} range must satisfy {bound}, got {value}")
        out[name] = (low, high)
    return out


def _pair(name: str, value: Any) -> tuple[float, float]:
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    ):
        return float(value[0]), float(value[1])
    raise ValueError(f"{name} must be a number or a [low, high] pair, got {value!r}")
