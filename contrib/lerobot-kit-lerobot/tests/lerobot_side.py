"""What a LeRobot user does with a checkpoint, done with LeRobot's own classes."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.policies.factory import get_policy_class, make_pre_post_processors
from lerobot.policies.pretrained import PreTrainedPolicy
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from conftest import REPO_ID
from lerobot_kit_lerobot.bridge_fields import PiSizes
from lerobot_kit_lerobot.pi_overrides import pi_sizes


def load_with_lerobot(pretrained: Path, policy_type: str) -> tuple[PreTrainedPolicy, object, object]:
    """LeRobot's policy class ``from_pretrained`` (strict: every key must be there) and its
    processors from the same folder. A π0/π0.5 trained at other sizes (``--policy.sizes``,
    recorded in the run's train_config.json) is built by LeRobot's classes at those sizes."""
    sizes = json.loads((pretrained / "train_config.json").read_text())["policy"].get("sizes")
    with pi_sizes(policy_type, PiSizes(**sizes)) if sizes else contextlib.nullcontext():
        policy = get_policy_class(policy_type).from_pretrained(pretrained, strict=True)
    preprocessor, postprocessor = make_pre_post_processors(policy.config, pretrained_path=str(pretrained))
    return policy, preprocessor, postprocessor


def observation(dataset_root: Path, index: int) -> dict[str, object]:
    """One frame's raw observation as LeRobot's dataset class reads it (PyAV decoding), with
    its task text (what language-conditioned policies are given at inference)."""
    frame = LeRobotDataset(REPO_ID, root=dataset_root, video_backend="pyav")[index]
    return {key: value for key, value in frame.items() if key.startswith("observation.") or key == "task"}


def act_on(policy: PreTrainedPolicy, preprocessor, postprocessor, raw: dict[str, torch.Tensor]) -> torch.Tensor:
    """LeRobot's inference path: preprocess one observation, select an action, postprocess."""
    policy.reset()
    with torch.no_grad():
        return postprocessor(policy.select_action(preprocessor(raw)))


def sharded_weights(pretrained: Path, workdir: Path) -> dict[str, torch.Tensor]:
    """The DCP weight shards of a sharded run, merged by torch's own converter."""
    target = workdir / "merged.pt"
    dcp_to_torch_save(str(pretrained / "pytorch_model_fsdp_0"), str(target))
    return torch.load(target, weights_only=True)


def assert_same_weights(policy: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    state = policy.state_dict()
    assert state.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(state[key].cpu(), tensor), key
