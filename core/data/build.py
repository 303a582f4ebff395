"""The dataset a run trains on: the registered factory of ``--dataset.type``, asked for the
frame offsets the policy stacks (``PolicyConfig.delta_indices``).

One function for ``lerobot train``, ``lerobot plan``, benchmarks and ``lerobot_kit.api``,
so they cannot disagree on which frames a policy sees.
"""

from __future__ import annotations

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.data.dataset import PolicyDataset


def build_dataset(config: TrainConfig) -> PolicyDataset:
    from lerobot_kit.core.registry.registry import get_registry

    return get_registry().dataset(config.dataset.type).build(config.dataset, config.policy.delta_indices())
