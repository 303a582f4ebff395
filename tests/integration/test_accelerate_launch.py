"""`accelerate launch` as the launcher: a plain launch starts the ranks, an Accelerate
engine config in the environment is refused on every rank with the flag to use instead."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _dist_util import DIST_UTIL, check_probe, clean_env, free_port

ACCELERATE = Path(sys.executable).parent / "accelerate"


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
