"""``lerobot eval``'s config: a checkpoint, an environment, the evaluation settings (torch-free).

The flags are LeRobot's (``--policy.path``, ``--env.type``, ``--eval.n_episodes``,
``--eval.batch_size``, ``--seed``, ``--output_dir``) and parse like ``train``'s: dotted
flags, every problem reported at once, a misspelt flag named with the closest real one.
``--env`` is polymorphic (its type from the registry), like ``--policy`` in training.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from pydantic import Field, SerializeAsAny, ValidationError

from lerobot_kit.core.config.bounds import Seed
from lerobot_kit.core.config.flags import flags_to_dict, resolve_section
from lerobot_kit.core.config.schema import EnvConfig, EvalConfig, Section
from lerobot_kit.core.config.validation_errors import flag_lines
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.eval.output import refuse_inside_run
from lerobot_kit.core.layout.hub_snapshot import local_policy_path
from lerobot_kit.core.layout.paths import find_pretrained_dir
from lerobot_kit.core.layout.validate import check_loadable

DEFAULT_OUTPUT_ROOT = Path("outputs/eval")


class EvalPolicyConfig(Section):
    path: str | None = Field(
        None, description="Checkpoint to evaluate: a step folder, its pretrained_model/, a run folder (then last), "
        "or a Hugging Face Hub model id."
    )


class EvalRunConfig(Section):
    policy: EvalPolicyConfig = Field(default_factory=EvalPolicyConfig)
    env: SerializeAsAny[EnvConfig] = Field(default_factory=EnvConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    seed: Seed = Field(1000, description="Episode i starts from seed + i (the expert runs the same seeds).")
    output_dir: str | None = Field(
        None, description="Where eval_info.json, videos/ and rollouts.png go (default outputs/eval/<date>/<time>_<env>)."
    )


def parse_eval_config(args: list[str]) -> EvalRunConfig:
    raw = flags_to_dict(args)
    problems: list[str] = []
    env = resolve_section(raw, "env", problems)
    config = None
    try:
        config = EvalRunConfig.model_validate({k: v for k, v in raw.items() if k != "env"})
    except ValidationError as exc:
        problems.extend(flag_lines(exc, EvalRunConfig))
    if config is not None and not config.policy.path:
        problems.append("--policy.path: required; give the checkpoint to evaluate (e.g. outputs/train/<run>/checkpoints/last)")
    if problems:
        raise ConfigError("\n".join(problems))
    assert config is not None and env is not None and config.policy.path
    if config.output_dir is not None:
        refuse_inside_run(Path(config.output_dir))
    config.policy.path = local_policy_path(config.policy.path)
    # The checkpoint's files, checked before torch is imported, as load_pretrained checks them.
    check_loadable(find_pretrained_dir(Path(config.policy.path)))
    config.env = env
    return config


def output_dir_of(config: EvalRunConfig) -> Path:
    """The folder to write; an existing, non-empty one is refused (nothing is touched), and so is
    one inside a training run's folder (``core.eval.output``)."""
    if config.output_dir is None:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
        return DEFAULT_OUTPUT_ROOT / f"{stamp}_{config.env.type}"
    output_dir = Path(config.output_dir)
    refuse_inside_run(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise ConfigError(
            f"--output_dir={output_dir} already exists and is not empty; choose another --output_dir "
            "(nothing was changed)"
        )
    return output_dir
