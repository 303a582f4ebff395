"""LeRobot's policy classes as lerobot-kit policies.

``LerobotPolicy`` builds LeRobot's own policy object (``ACTPolicy``, ``DiffusionPolicy``,
...) and adopts its child modules as its own, under the same names. So the module tree,
and with it every state-dict key, is LeRobot's: ``model.safetensors`` written by any
lerobot-kit checkpoint format is LeRobot's file, a ``model.safetensors`` LeRobot wrote
loads with ``--policy.path``, a PEFT adapter carries the keys ``PeftModel`` expects on
LeRobot's policy, and FSDP2 shards LeRobot's layers in place. The LeRobot object itself
is kept unregistered (registering it would list every tensor twice) and does the
computing: ``forward``, ``select_action`` and ``reset`` are LeRobot's, on the same
modules.

Normalisation is LeRobot's too: ``make_processors`` builds LeRobot's pre/post processor
pipelines from the dataset's stats, and checkpoints hold LeRobot's ``config.json`` and
processor files next to lerobot-kit's own (``dataset_meta.json``, ``train_config.json``,
``training_state/``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.factory import get_policy_class, make_pre_post_processors
from lerobot.policies.pretrained import PreTrainedPolicy
from torch import Tensor

from lerobot_kit.api import DatasetMeta, PluginError, Policy, PolicyProcessor
from lerobot_kit_lerobot.configuration import LerobotPolicyConfig
from lerobot_kit_lerobot.lerobot_config import to_lerobot_config
from lerobot_kit_lerobot.processors import LerobotProcessor
from lerobot_kit_lerobot.schema_gen import check_schema


class LerobotPolicy(Policy):
    """A LeRobot policy driven by lerobot-kit; subclasses name the LeRobot type."""

    config_class = LerobotPolicyConfig
    lerobot_type: ClassVar[str]
    config: LerobotPolicyConfig

    def __init__(self, config: LerobotPolicyConfig, meta: DatasetMeta) -> None:
        # No _init_from_entry_rng: LeRobot's constructor initialises every weight from the
        # RNG it is entered with, and init_weights replays exactly that construction.
        super().__init__(config, meta)
        check_schema(self.lerobot_type)
        self.lerobot_config = to_lerobot_config(config, meta)
        lerobot_policy = build_lerobot_policy(self.lerobot_config)
        own = [name for name, _ in lerobot_policy.named_parameters(recurse=False)]
        own += [name for name, _ in lerobot_policy.named_buffers(recurse=False)]
        if own:
            raise PluginError(
                f"LeRobot's {type(lerobot_policy).__name__} holds tensors outside its submodules ({own}); "
                "the bridge shares only submodules with it"
            )
        for name, child in lerobot_policy.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "lerobot", lerobot_policy)  # unregistered: see the module doc

    @classmethod
    def make_processors(cls, config: LerobotPolicyConfig, meta: DatasetMeta) -> tuple[PolicyProcessor, PolicyProcessor]:
        """LeRobot's own pipelines for this policy, normalising with the dataset's stats."""
        stats = {key: {name: torch.as_tensor(value) for name, value in stats.items()} for key, stats in meta.stats.items()}
        pre, post = make_pre_post_processors(to_lerobot_config(config, meta), dataset_stats=stats)
        return LerobotProcessor(pre), LerobotProcessor(post)

    def save_config(self, directory: Path) -> None:
        """LeRobot's ``config.json``, as LeRobot writes it (its ``from_pretrained`` reads it)."""
        self.lerobot_config._save_pretrained(Path(directory))

    def init_weights(self) -> None:
        """Build LeRobot's policy afresh from the current RNG and take its weights: what
        construction does, so a meta-device build equals a CPU build from the same seed."""
        fresh = build_lerobot_policy(self.lerobot_config)
        self.load_state_dict(fresh.state_dict(), strict=True)

    def train(self, mode: bool = True) -> LerobotPolicy:
        super().train(mode)
        self.lerobot.training = mode  # LeRobot code may read its own flag
        return self

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        loss, logs = self.lerobot.forward(batch)
        return loss, {name: torch.as_tensor(value).detach() for name, value in (logs or {}).items() if _scalar(value)}

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        return self.lerobot.predict_action_chunk(batch)

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        return self.lerobot.select_action(batch)

    def reset(self) -> None:
        self.lerobot.reset()


def build_lerobot_policy(lerobot_config: PreTrainedConfig) -> PreTrainedPolicy:
    """LeRobot's policy class for the config, constructed as LeRobot's ``make_policy`` does
    for a fresh policy (but left on the CPU, or on the meta device).

    A sharded run builds the model on the meta device on all ranks but the main one. A
    LeRobot policy cannot be built there: its constructors run the backbone on a dummy
    image to size the next layer, and keep tensors outside their modules (Diffusion's
    noise-scheduler tables) that nothing would fill later. So a meta build is a CPU build
    whose parameters and buffers then move to the meta device (the main process
    broadcasts their values), as every rank of LeRobot's own distributed training builds
    the whole model.
    """
    policy_class = get_policy_class(lerobot_config.type)
    if torch.get_default_device().type != "meta":
        return policy_class(config=lerobot_config)
    with torch.device("cpu"):
        policy = policy_class(config=lerobot_config)
    return policy.to("meta")


def _scalar(value: Any) -> bool:
    """LeRobot's loss dicts mix float metrics with per-sample tensors; only scalars are logged."""
    return isinstance(value, (int, float)) or (isinstance(value, Tensor) and value.numel() == 1)


def valid_actions(batch: dict[str, Tensor]) -> Tensor:
    """The action entries that are not padding past an episode's end: the divisor of
    LeRobot's masked losses (times the action size, which is the same on every rank)."""
    return (~batch["action_is_pad"]).sum()


class LerobotACT(LerobotPolicy):
    lerobot_type = "act"
    # LeRobot 0.6.1 declares no wrap units: the transformer layers hold most parameters.
    _fsdp_wrap_modules = ["ACTEncoderLayer", "ACTDecoderLayer"]
    # The feed-forward layers of every transformer layer (attention runs through
    # nn.MultiheadAttention's fused projections, which LoRA does not reach).
    default_peft_targets = ["linear1", "linear2"]

    def loss_weight(self, batch: dict[str, Tensor]) -> Tensor | None:
        """LeRobot's ACT divides its L1 loss by the valid action entries of the batch it
        sees, so data-parallel ranks are weighted by theirs: the run's loss is the masked
        mean over the whole global batch, whatever the number of ranks. With the VAE on,
        its KL term (a per-sample mean) is weighted the same way: exact on one process,
        a valid-entry-weighted mean over ranks on several."""
        return valid_actions(batch) if "action_is_pad" in batch else None


class LerobotDiffusion(LerobotPolicy):
    lerobot_type = "diffusion"
    _fsdp_wrap_modules = ["DiffusionConditionalResidualBlock1d"]
    default_peft_targets = ["cond_encoder.1"]

    def loss_weight(self, batch: dict[str, Tensor]) -> Tensor | None:
        """Diffusion's loss is a masked mean only with ``do_mask_loss_for_padding``; then
        ranks are weighted by their valid action entries, as for ACT."""
        masked = self.lerobot_config.do_mask_loss_for_padding and "action_is_pad" in batch
        return valid_actions(batch) if masked else None
