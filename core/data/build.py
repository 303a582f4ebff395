"""The dataset a run trains on: the registered factory of ``--dataset.type``, asked for the
frame offsets the policy stacks (``PolicyConfig.delta_indices``).

One function for ``lerobot train``, ``lerobot plan``, benchmarks and ``lerobot_kit.api``,
so they cannot disagree on which frames a policy sees. A mixture is also checked against
what the policy declares it can take (missing cameras, vectors of other widths) here,
before a model is built.
"""

from __future__ import annotations

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.data.dataset import PolicyDataset
from lerobot_kit.core.data.mixture import MixtureDataset


def build_dataset(config: TrainConfig) -> PolicyDataset:
    from lerobot_kit.core.registry.registry import get_registry

    registry = get_registry()
    dataset = registry.dataset(config.dataset.type).build(config.dataset, config.policy.delta_indices())
    if isinstance(dataset, MixtureDataset):
        policy_class = registry.policy(config.policy.type).load()
        dataset.check_policy(config.policy.type, policy_class.accepts_missing_cameras, policy_class.pads_vectors)
    return dataset
