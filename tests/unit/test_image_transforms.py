"""Image augmentations under LeRobot's names: what each does, how they are picked, their flags."""

from __future__ import annotations

import math

import pytest
import torch

from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.config.data_options import DEFAULT_TRANSFORMS, ImageTransformsConfig
from lerobot_kit.core.data.transforms import (
    ImageAugmentation,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    adjust_sharpness,
    affine,
    grey,
)


def image(seed: int = 0, shape: tuple[int, ...] = (3, 12, 16)) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def test_lerobot_names_and_defaults() -> None:
    config = ImageTransformsConfig()
    assert (config.enable, config.max_num_transforms, config.random_order) == (False, 3, False)
    assert list(config.tfs) == ["brightness", "contrast", "saturation", "hue", "sharpness", "affine"]
    assert config.tfs["saturation"].kwargs == {"saturation": [0.5, 1.5]}
    assert config.tfs["affine"].type == "RandomAffine"
    assert config.tfs["affine"].kwargs == {"degrees": [-5.0, 5.0], "translate": [0.05, 0.05]}
    assert {k: v.model_dump() for k, v in config.tfs.items()} == DEFAULT_TRANSFORMS


def test_flags_set_a_transform_field_by_field_and_round_trip() -> None:
    config = parse_train_config([
        "--dataset.image_transforms.enable=true", "--dataset.image_transforms.max_num_transforms=2",
        "--dataset.image_transforms.tfs.hue.weight=0",
        '--dataset.image_transforms.tfs.brightness.kwargs={"brightness": 0.5}',
    ])
    tfs = config.dataset.image_transforms.tfs
    assert tfs["hue"].weight == 0 and tfs["hue"].kwargs == {"hue": [-0.05, 0.05]}  # the rest kept
    assert tfs["brightness"].kwargs == {"brightness": 0.5}
    dumped = config.dataset.image_transforms.model_dump(mode="json")
    assert ImageTransformsConfig.model_validate(dumped) == config.dataset.image_transforms


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("tfs.hue.kwargs={\"hue\": [0.2, 0.7]}", "hue range must satisfy -0.5 <= low <= high <= 0.5"),
        ("tfs.blur.type=GaussianBlur", "unsupported transform type 'GaussianBlur'; supported: Identity, ColorJitter"),
        ("tfs.affine.kwargs={\"degrees\": 3, \"shear\": 2}", "RandomAffine takes ['degrees', 'translate'], not ['shear']"),
        ("tfs.contrast.kwargs={\"contrast\": [1.5, 0.5]}", "contrast range must satisfy 0 <= low <= high"),
        ("max_num_transforms=0", "greater than or equal to 1"),
    ],
)
def test_bad_transform_flags_are_one_line_naming_the_flag(flag: str, message: str) -> None:
    from lerobot_kit.core.errors import ConfigError

    with pytest.raises(ConfigError) as error:
        parse_train_config([f"--dataset.image_transforms.{flag}"])
    assert message in str(error.value) and "--dataset.image_transforms." in str(error.value)
    assert len(str(error.value).splitlines()) == 1


def test_colour_adjustments() -> None:
    x = image()
    assert torch.equal(adjust_brightness(x, 1.0), x)
    assert torch.allclose(adjust_brightness(x, 0.5), x * 0.5)
    assert adjust_brightness(x, 3.0).max() == 1.0  # clamped
    assert torch.allclose(adjust_contrast(x, 0.0), grey(x).mean().expand_as(x))
    assert torch.allclose(adjust_saturation(x, 0.0), grey(x).expand_as(x))
    assert torch.allclose(adjust_saturation(x, 1.0), x)
    assert torch.allclose(adjust_hue(x, 0.0), x, atol=1e-6)
    red = torch.zeros(3, 2, 2)
    red[0] = 1.0
    green = adjust_hue(red, 1 / 3)
    assert torch.allclose(green, torch.stack([torch.zeros(2, 2), torch.ones(2, 2), torch.zeros(2, 2)]), atol=1e-6)


def test_sharpness_blends_with_a_smoothed_interior() -> None:
    x = image()
    assert torch.allclose(adjust_sharpness(x, 1.0), x)
    smooth = adjust_sharpness(x, 0.0)
    assert torch.equal(smooth[:, 0], x[:, 0]) and torch.equal(smooth[:, :, -1], x[:, :, -1])  # borders kept
    kernel = torch.tensor([[1.0, 1, 1], [1, 5, 1], [1, 1, 1]]) / 13
    expected = (x[1, 4:7, 7:10] * kernel).sum()
    assert math.isclose(float(smooth[1, 5, 8]), float(expected), rel_tol=1e-5)


def test_affine_shifts_and_rotates_about_the_centre() -> None:
    x = image(shape=(3, 8, 8))
    assert torch.equal(affine(x, 0.0, 0, 0), x)
    shifted = affine(x, 0.0, 2, 1)
    assert torch.equal(shifted[:, 1:, 2:], x[:, :-1, :-2])
    assert shifted[:, 0].abs().sum() == 0 and shifted[:, :, :2].abs().sum() == 0  # filled with black
    assert torch.equal(affine(x, 90.0, 0, 0), torch.rot90(x, -1, dims=(-2, -1)))  # clockwise, as torchvision
    stack = torch.stack([x, image(1, (3, 8, 8))])
    assert torch.equal(affine(stack, 0.0, 1, 0)[1], affine(stack[1], 0.0, 1, 0))


def test_picks_max_num_transforms_by_weight_from_the_generator() -> None:
    only_brightness = ImageTransformsConfig(
        enable=True, max_num_transforms=5,
        tfs={name: {"weight": 0.0} for name in DEFAULT_TRANSFORMS if name != "brightness"},
    )
    augment = ImageAugmentation(only_brightness)
    assert augment.names == ["brightness"] and augment.count == 1
    x = image()
    out = augment(x, torch.Generator().manual_seed(3))
    factor = float((out / x)[x > 0.1].mean())
    assert 0.8 <= factor <= 1.2 and torch.allclose(out, (x * factor).clamp(0, 1), atol=1e-6)

    augment = ImageAugmentation(ImageTransformsConfig(enable=True))
    assert augment.count == 3
    stack = torch.stack([image(2), image(3)])  # a camera's history gets one draw for all its frames
    a = augment(stack, torch.Generator().manual_seed(11))
    b = augment(stack, torch.Generator().manual_seed(11))
    c = augment(stack, torch.Generator().manual_seed(12))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(augment(stack[1], torch.Generator().manual_seed(11)), a[1])
