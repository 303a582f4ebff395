"""SPEC S1.4: Accelerate engine settings in the environment stop the run, with the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dist_util import check_probe, clean_env, free_port  # noqa: E402

from lerobot_kit.core.distributed.accelerate_guard import OVERRIDE_ENV, check_accelerate_env  # noqa: E402
from lerobot_kit.core.errors import ConfigError  # noqa: E402

DIST_UTIL = str(Path(__file__).resolve().parent / "_dist_util.py")
ACCELERATE = Path(sys.executable).parent / "accelerate"

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


FSDP_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: bf16
num_machines: 1
num_processes: 2
machine_rank: 0
gpu_ids: all
main_process_port: {port}
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_reshard_after_forward: true
  fsdp_offload_params: false
  fsdp_state_dict_type: SHARDED_STATE_DICT
parallelism_config:
  parallelism_config_dp_replicate_size: 1
  parallelism_config_dp_shard_size: 2
"""


def accelerate_launch(args: list[str], tmp_path: Path) -> list[dict]:
    assert ACCELERATE.exists(), "accelerate is part of the test extras: pip install -e '.[test]'"
    proc = subprocess.run(
        [str(ACCELERATE), "launch", *args, DIST_UTIL, "probe", str(tmp_path)],
        capture_output=True, text=True, timeout=100, env=clean_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(120)
def test_plain_accelerate_launch_starts_two_ranks(tmp_path: Path) -> None:
    results = accelerate_launch(["--multi_gpu", "--num_processes=2", f"--main_process_port={free_port()}"], tmp_path)
    check_probe(results, "accelerate")


@pytest.mark.timeout(120)
def test_accelerate_config_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "fsdp.yaml"
    config.write_text(FSDP_CONFIG.format(port=free_port()))
    results = accelerate_launch(["--config_file", str(config)], tmp_path)
    for result in results:
        error = result["guard_error"]
        assert error is not None
        for expected in (
            "ACCELERATE_MIXED_PRECISION='bf16' -> --accelerator.mixed_precision",
            "ACCELERATE_USE_FSDP='true' -> --parallelism.dp_shard=N (FSDP2)",
            "ACCELERATE_USE_PARALLELISM_CONFIG='true'",
            "FSDP_TRANSFORMER_CLS_TO_WRAP='Block' -> --accelerator.fsdp.wrap_modules",
            "FSDP_RESHARD_AFTER_FORWARD='true' -> --accelerator.fsdp.reshard_after_forward",
            "PARALLELISM_CONFIG_DP_SHARD_SIZE='2' -> --parallelism.dp_shard",
        ):
            assert expected in error
        assert "DYNAMO" not in error  # the plain launch's defaults are not reported
