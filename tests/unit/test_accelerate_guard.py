"""Accelerate engine settings in the environment stop the run, naming the flag to use instead.

Accelerate is supported as a launcher only; its engine options (mixed precision, FSDP,
DeepSpeed, ...) would silently disagree with the kit's own flags.
"""

from __future__ import annotations

import pytest

from lerobot_kit.core.distributed.accelerate_guard import OVERRIDE_ENV, check_accelerate_env
from lerobot_kit.core.errors import ConfigError

# Exactly what a plain `accelerate launch --multi_gpu --num_processes=2` exports (plus torch's).
PLAIN = {
    "ACCELERATE_MIXED_PRECISION": "no",
    "ACCELERATE_DYNAMO_BACKEND": "NO",
    "ACCELERATE_DYNAMO_MODE": "default",
    "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
    "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "False",
    "ACCELERATE_USE_CPU": "False",
    "ACCELERATE_DEBUG_MODE": "true",
    "TORCHELASTIC_RUN_ID": "none",
    "RANK": "0",
    "OMP_NUM_THREADS": "1",
}


def test_a_plain_launch_passes() -> None:
    check_accelerate_env(PLAIN)
    check_accelerate_env({})


@pytest.mark.parametrize(
    ("name", "value", "flag"),
    [
        ("ACCELERATE_MIXED_PRECISION", "bf16", "--accelerator.mixed_precision=bf16|fp16"),
        ("ACCELERATE_MIXED_PRECISION", "fp8", "--accelerator.mixed_precision"),
        ("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR", "does not torch.compile"),
        ("ACCELERATE_DYNAMO_MODE", "max-autotune", "does not torch.compile"),
        ("ACCELERATE_DYNAMO_USE_FULLGRAPH", "True", "does not torch.compile"),
        ("ACCELERATE_USE_FSDP", "true", "--parallelism.dp_shard=N (FSDP2) and --accelerator.fsdp.*"),
        ("ACCELERATE_USE_FSDP", "false", "--parallelism.dp_shard"),
        ("ACCELERATE_USE_PARALLELISM_CONFIG", "true", "--parallelism.dp_replicate / --parallelism.dp_shard"),
        ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4", "--accelerator.gradient_accumulation.steps"),
        ("ACCELERATE_GRADIENT_CLIPPING", "1.0", "--optimizer.grad_clip_norm"),
        ("ACCELERATE_USE_DEEPSPEED", "true", "DeepSpeed is not supported"),
        ("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3", "DeepSpeed is not supported"),
        ("ACCELERATE_CONFIG_DS_FIELDS", "zero_stage", "DeepSpeed is not supported"),
        ("ACCELERATE_USE_MEGATRON_LM", "true", "Megatron-LM is not supported"),
        ("MEGATRON_LM_TP_DEGREE", "2", "Megatron-LM is not supported"),
        ("ACCELERATE_FP8_BACKEND", "TE", "fp8 is not supported"),
        ("ACCELERATE_DOWNCAST_BF16", "1", "--accelerator.mixed_precision=bf16"),
        ("FSDP_TRANSFORMER_CLS_TO_WRAP", "Block", "--accelerator.fsdp.wrap_modules"),
        ("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP", "--accelerator.fsdp.wrap_modules or"),
        ("FSDP_MIN_NUM_PARAMS", "1000", "--accelerator.fsdp.min_num_params"),
        ("FSDP_OFFLOAD_PARAMS", "true", "--accelerator.fsdp.cpu_offload"),
        ("FSDP_RESHARD_AFTER_FORWARD", "false", "--accelerator.fsdp.reshard_after_forward"),
        ("FSDP_IGNORED_MODULES", "head", "--accelerator.fsdp.ignored_modules"),
        ("FSDP_SHARDING_STRATEGY", "HYBRID_SHARD", "--parallelism.dp_shard / --parallelism.dp_replicate"),
        ("FSDP_STATE_DICT_TYPE", "SHARDED_STATE_DICT", "--checkpoint_format"),
        ("FSDP_VERSION", "2", "--parallelism.dp_shard=N and --accelerator.fsdp.*"),
        ("FSDP_ACTIVATION_CHECKPOINTING", "true", "--accelerator.fsdp.*"),
        ("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2", "--parallelism.dp_shard"),
        ("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "2", "--parallelism.dp_replicate"),
        ("PARALLELISM_CONFIG_TP_SIZE", "2", "only data parallelism"),
    ],
)
def test_each_engine_variable_is_refused_with_its_flag(name: str, value: str, flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_accelerate_env({**PLAIN, name: value})
    lines = str(err.value).splitlines()
    offending = [line for line in lines if line.startswith("  ")]
    assert offending == [f"  {name}={value!r} -> " + offending[0].split(" -> ", 1)[1]]
    assert flag in offending[0]
    assert "LEROBOT_ALLOW_ACCELERATE_ENV=1" in lines[-1]
    assert "only as a launcher" in lines[0]


def test_every_offender_is_named_at_once() -> None:
    env = {**PLAIN, "ACCELERATE_MIXED_PRECISION": "fp16", "FSDP_VERSION": "2", "ACCELERATE_USE_FSDP": "true"}
    with pytest.raises(ConfigError) as err:
        check_accelerate_env(env)
    named = [line.split("=")[0].strip() for line in str(err.value).splitlines() if line.startswith("  ")]
    assert named == ["ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_FSDP", "FSDP_VERSION"]


@pytest.mark.parametrize(("value", "allowed"), [("1", True), ("true", True), ("YES", True), ("0", False),
                                                ("false", False), ("", False), ("no", False)])
def test_override(value: str, allowed: bool) -> None:
    env = {**PLAIN, "ACCELERATE_USE_FSDP": "true", OVERRIDE_ENV: value}
    if allowed:
        check_accelerate_env(env)
    else:
        with pytest.raises(ConfigError, match="ACCELERATE_USE_FSDP"):
            check_accelerate_env(env)
