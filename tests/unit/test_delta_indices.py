"""``expand_delta_indices``: a policy names features before the dataset exists, some by kind."""

from __future__ import annotations

import pytest

from lerobot_kit.api import ALL_CAMERAS, ALL_OBSERVATIONS, ConfigError, expand_delta_indices

# PushT's layout, as LeRobot records it: an environment state beside the state and a camera.
FEATURES = {"observation.state": False, "observation.environment_state": False, "observation.images.top": True,
            "observation.images.wrist": True, "action": False, "next.reward": False}


def expanded(delta_indices: dict[str, list[int]]) -> dict[str, list[int]]:
    return {key: offsets.tolist() for key, offsets in expand_delta_indices(delta_indices, FEATURES).items()}


def test_all_observations_names_every_observation_feature_as_lerobots_delta_timestamps_do() -> None:
    assert expanded({"action": [0, 1], ALL_OBSERVATIONS: [-1, 0]}) == {
        "action": [0, 1], "observation.environment_state": [-1, 0], "observation.images.top": [-1, 0],
        "observation.images.wrist": [-1, 0], "observation.state": [-1, 0]}


def test_all_cameras_names_the_cameras_only() -> None:
    assert expanded({ALL_CAMERAS: [-2, -1, 0]}) == {"observation.images.top": [-2, -1, 0],
                                                    "observation.images.wrist": [-2, -1, 0]}


@pytest.mark.parametrize("order", [1, -1])
def test_a_named_feature_overrides_a_wildcard_and_cameras_override_observations(order: int) -> None:
    """Whatever order the policy lists them in."""
    asked = list({ALL_OBSERVATIONS: [0], ALL_CAMERAS: [-1, 0], "observation.state": [-2, -1, 0]}.items())[::order]
    assert expanded(dict(asked)) == {
        "observation.environment_state": [0], "observation.images.top": [-1, 0], "observation.images.wrist": [-1, 0],
        "observation.state": [-2, -1, 0]}


def test_a_feature_the_dataset_lacks_is_a_config_error_but_a_wildcard_matching_nothing_is_not() -> None:
    with pytest.raises(ConfigError, match=r"frame offsets of \['observation.velocity'\], which this dataset lacks"):
        expanded({"observation.velocity": [0]})
    assert expand_delta_indices({ALL_OBSERVATIONS: [0], ALL_CAMERAS: [0]}, {"action": False}) == {}
