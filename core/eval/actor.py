"""A policy as an actor: environment observations in, environment actions out.

Observations arrive as the dataset stores frames (float32 vectors, uint8 images) and go
through what training fed the policy: images scaled to [0, 1] as dataset items are, then
the checkpoint's preprocessor; ``select_action`` (with its action queue, so chunks run
``n_action_steps`` at a time); then the postprocessor back to the environment's units.
"""

from __future__ import annotations

import numpy as np
import torch

from lerobot_kit.core.data.dataset import ACTION_KEY, DatasetMeta, FeatureSpec
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.eval.env import Observation
from lerobot_kit.core.eval.rollout import Actor
from lerobot_kit.core.model.policy import Policy
from lerobot_kit.core.model.processor import PolicyProcessor

OBSERVATION_PREFIX = "observation."


def policy_inputs(meta: DatasetMeta) -> dict[str, FeatureSpec]:
    """The features a policy trained on ``meta`` reads: every observation feature."""
    return {key: spec for key, spec in meta.features.items() if key.startswith(OBSERVATION_PREFIX)}


def check_env_features(meta: DatasetMeta, env_features: dict[str, FeatureSpec], env_name: str) -> None:
    """One line naming each feature the policy needs and the environment lacks or shapes otherwise."""
    wanted = {**policy_inputs(meta), ACTION_KEY: meta.features[ACTION_KEY]}
    problems = []
    for key, spec in wanted.items():
        got = env_features.get(key)
        if got is None:
            problems.append(f"{key} ({_describe(spec)}) is missing")
        elif (got.dtype, tuple(got.shape)) != (spec.dtype, tuple(spec.shape)):
            problems.append(f"{key} is {_describe(got)}, the policy's is {_describe(spec)}")
    if problems:
        provided = ", ".join(f"{k} ({_describe(s)})" for k, s in env_features.items())
        raise ConfigError(
            f"env {env_name!r} does not fit this policy: {'; '.join(problems)}. The env provides {provided}; "
            "choose the --env.type and --env.* options that give the policy the features it was trained on "
            "(`lerobot eval --help` lists them)"
        )


def _describe(spec: FeatureSpec) -> str:
    return f"{spec.dtype} {'x'.join(map(str, spec.shape))}"


def policy_actor(policy: Policy, preprocessor: PolicyProcessor, postprocessor: PolicyProcessor,
                 device: torch.device) -> Actor:
    inputs = policy_inputs(policy.meta)

    def act(observation: Observation) -> np.ndarray:
        batch = {}
        for key, spec in inputs.items():
            value = torch.from_numpy(np.ascontiguousarray(observation[key])).to(device)
            batch[key] = value.to(torch.float32) / 255.0 if spec.is_image else value
        with torch.no_grad():
            action = policy.select_action(preprocessor(batch))
            action = postprocessor({ACTION_KEY: action})[ACTION_KEY]
        return action.to("cpu", torch.float32).numpy()

    return act
