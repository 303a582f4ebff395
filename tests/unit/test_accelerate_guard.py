"""Accelerate engine settings in the environment stop the run, naming the flag to use instead.

Accelerate is supported as a launcher only; its engine options (mixed precision, FSDP,
DeepSpeed, ...) would silently disagree with the kit's own flags.
"""

from __future__ import annotations

import pytest

from lerobot_kit.core.distributed.accelerate_guard import OVERRIDE_ENV, accelerate_env_offenders, check_accelerate_env
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
    # The plain launch's own values (any case) are not offenders; the same variables at other values are.
    assert accelerate_env_offenders(PLAIN) == [] and accelerate_env_offenders({}) == []
    check_accelerate_env(PLAIN)
    with pytest.raises(ConfigError, match="ACCELERATE_DYNAMO_BACKEND='EAGER'"):
        check_accelerate_env({**PLAIN, "ACCELERATE_DYNAMO_BACKEND": "EAGER"})


NO_COMPILE = "no equivalent: lerobot-kit does not torch.compile through Accelerate"
DEEPSPEED = "--parallelism.dp_shard=N (FSDP2; DeepSpeed is not supported)"
MEGATRON = "no equivalent: Megatron-LM is not supported"
FSDP_FAMILY = "--parallelism.dp_shard=N and --accelerator.fsdp.*"


@pytest.mark.parametrize(
    ("name", "value", "flag"),
    [
        ("ACCELERATE_MIXED_PRECISION", "bf16", "--accelerator.mixed_precision=bf16|fp16"),
        ("ACCELERATE_MIXED_PRECISION", "fp8", "--accelerator.mixed_precision=bf16|fp16"),
        ("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR", NO_COMPILE),
        ("ACCELERATE_DYNAMO_MODE", "max-autotune", NO_COMPILE),
        ("ACCELERATE_DYNAMO_USE_FULLGRAPH", "True", NO_COMPILE),
        ("ACCELERATE_USE_FSDP", "true", "--parallelism.dp_shard=N (FSDP2) and --accelerator.fsdp.*"),
        ("ACCELERATE_USE_FSDP", "false", "--parallelism.dp_shard=N (FSDP2) and --accelerator.fsdp.*"),
        ("ACCELERATE_USE_PARALLELISM_CONFIG", "true", "--parallelism.dp_replicate / --parallelism.dp_shard"),
        ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4", "--accelerator.gradient_accumulation.steps"),
        ("ACCELERATE_GRADIENT_CLIPPING", "1.0", "--optimizer.grad_clip_norm"),
        ("ACCELERATE_USE_DEEPSPEED", "true", DEEPSPEED),
        ("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3", DEEPSPEED),
        ("ACCELERATE_CONFIG_DS_FIELDS", "zero_stage", DEEPSPEED),
        ("ACCELERATE_USE_MEGATRON_LM", "true", MEGATRON),
        ("MEGATRON_LM_TP_DEGREE", "2", MEGATRON),
        ("ACCELERATE_FP8_BACKEND", "TE", "--accelerator.mixed_precision=bf16|fp16 (fp8 is not supported)"),
        ("ACCELERATE_DOWNCAST_BF16", "1", "--accelerator.mixed_precision=bf16"),
        ("FSDP_TRANSFORMER_CLS_TO_WRAP", "Block", "--accelerator.fsdp.wrap_modules='[\"Block\"]'"),
        ("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP",
         "--accelerator.fsdp.wrap_modules or --accelerator.fsdp.min_num_params"),
        ("FSDP_MIN_NUM_PARAMS", "1000", "--accelerator.fsdp.min_num_params"),
        ("FSDP_OFFLOAD_PARAMS", "true", "--accelerator.fsdp.cpu_offload"),
        ("FSDP_RESHARD_AFTER_FORWARD", "false", "--accelerator.fsdp.reshard_after_forward"),
        ("FSDP_IGNORED_MODULES", "head", "--accelerator.fsdp.ignored_modules"),
        ("FSDP_SHARDING_STRATEGY", "HYBRID_SHARD", "--parallelism.dp_shard / --parallelism.dp_replicate"),
        ("FSDP_STATE_DICT_TYPE", "SHARDED_STATE_DICT", "--checkpoint_format"),
        ("FSDP_VERSION", "2", FSDP_FAMILY),
        ("FSDP_ACTIVATION_CHECKPOINTING", "true", FSDP_FAMILY),
        ("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2", "--parallelism.dp_shard"),
        ("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "2", "--parallelism.dp_replicate"),
        ("PARALLELISM_CONFIG_TP_SIZE", "2", "--parallelism.dp_replicate / --parallelism.dp_shard (only data parallelism)"),
    ],
)
def test_each_engine_variable_is_refused_with_its_flag(name: str, value: str, flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_accelerate_env({**PLAIN, name: value})
    lines = str(err.value).splitlines()
    assert [line for line in lines if line.startswith("  ")] == [f"  {name}={value!r} -> {flag}"]
    assert "only as a launcher" in lines[0]
    assert lines[-1] == "(or set LEROBOT_ALLOW_ACCELERATE_ENV=1 to start anyway and ignore them)"


def test_every_offender_is_named_at_once() -> None:
    env = {**PLAIN, "ACCELERATE_MIXED_PRECISION": "fp16", "FSDP_VERSION": "2", "ACCELERATE_USE_FSDP": "true"}
    with pytest.raises(ConfigError) as err:
        check_accelerate_env(env)
    named = [line.split("=")[0].strip() for line in str(err.value).splitlines() if line.startswith("  ")]
    assert named == ["ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_FSDP", "FSDP_VERSION"]


@pytest.mark.parametrize(("value", "allowed"), [("1", True), ("true", True), ("YES", True), ("0", False),
                                                ("false", False), ("", False), ("no", False)])
def test_override(value: str, allowed: bool) -> None:
    refused = {**PLAIN, "ACCELERATE_USE_FSDP": "true"}
    with pytest.raises(ConfigError, match="ACCELERATE_USE_FSDP"):
        check_accelerate_env(refused)
    env = {**refused, OVERRIDE_ENV: value}
    if allowed:  # the same offender, now acknowledged
        assert [name for name, _, _ in accelerate_env_offenders(env)] == ["ACCELERATE_USE_FSDP"]
        check_accelerate_env(env)
    else:
        with pytest.raises(ConfigError, match="ACCELERATE_USE_FSDP"):
            check_accelerate_env(env)
