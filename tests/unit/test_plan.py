"""``lerobot plan`` in one process: the plan's arithmetic and its one-line errors.

The errors go through the same click command the console script runs (``CliRunner``),
to skip a torch import per case; the console script itself is tested in
``integration/test_plan_ranks.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from lerobot_kit.cli.main import cli as cli_group
from lerobot_kit.cli.plan import format_plan
from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.config.schema import AcceleratorConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.plan.memory_plan import plan_model, plan_run, shard_numel
from lerobot_kit.core.parallel.wrap_units import resolve_wrap_units
from lerobot_kit.plugins.policies.act.modeling import ACTPolicy


def _plan(flags: list[str], world_size: int) -> dict[str, Any]:
    return plan_run(parse_train_config(flags), world_size).to_json()


def test_unsharded_layouts_hold_everything() -> None:
    single, ddp = _plan([], 1), _plan([], 8)
    assert (single["layout"], ddp["layout"]) == ("single", "ddp")
    for plan in (single, ddp):
        assert plan["units"] == [] and plan["per_rank"] == plan["ddp_per_rank"]
        assert plan["largest_gather_bytes"] is None
        assert plan["device_bytes"] == plan["per_rank"]["total_bytes"]
    # Activations do not depend on the number of replicas: each rank steps on --batch_size samples.
    assert single["activations"] == ddp["activations"]


def test_activations_are_planned_with_and_without_checkpointing() -> None:
    sizes = ["--batch_size=6", "--policy.chunk_size=20", "--policy.n_action_steps=20", "--policy.n_encoder_layers=4"]
    acts = _plan(sizes, 1)["activations"]
    assert acts["batch_size"] == 6 and acts["activation_checkpointing"] is False
    assert acts["batch"]["action"] == {"shape": [6, 20, 2], "dtype": "float32"}
    assert acts["batch"]["action_is_pad"] == {"shape": [6, 20], "dtype": "bool"}
    # ACT declares 4 encoder layers, 1 decoder layer and 2 CVAE encoder layers as its units.
    assert acts["checkpoint_units"] == 7 and acts["no_checkpointing"] is None
    assert 0 < acts["checkpointed_peak_bytes"] < acts["peak_bytes"]
    assert acts["batch_fit"] is None
    # The flag changes which figure is the run's, not the figures.
    on = _plan([*sizes, "--accelerator.activation_checkpointing=true"], 1)["activations"]
    assert on["activation_checkpointing"] is True
    assert (on["peak_bytes"], on["checkpointed_peak_bytes"]) == (acts["peak_bytes"], acts["checkpointed_peak_bytes"])
    # The model's FLOPs, not the recomputing run's: checkpointing leaves them as they are.
    assert on["step_flops"] == acts["step_flops"] > 0


def test_a_policy_without_wrap_units_has_no_checkpointed_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ACTPolicy, "_fsdp_wrap_modules", None)  # as a plugin policy that declares none
    acts = _plan([], 1)["activations"]
    assert acts["peak_bytes"] > 0 and acts["checkpointed_peak_bytes"] is None and acts["checkpoint_units"] == 0
    assert "--accelerator.fsdp.wrap_modules" in acts["no_checkpointing"]


def test_a_step_that_reads_tensor_values_is_planned_without_activations(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a plugin policy whose forward branches on a value: the sharding plan stands, the
    activation rows say why they are missing, and the exit code is 0."""
    forward = ACTPolicy.forward

    def branching(self: ACTPolicy, batch: dict[str, torch.Tensor]) -> Any:
        loss, logs = forward(self, batch)
        return (loss if loss > 0 else -loss), logs

    monkeypatch.setattr(ACTPolicy, "forward", branching)
    result = CliRunner().invoke(cli_group, ["plan", "--world_size=1", "--plan.device_memory_gb=1"])
    assert result.exit_code == 0, result.output
    assert "  not traced: the policy's step depends on tensor values" in result.stdout
    assert "largest --batch_size in 1 GiB per rank: unknown, the step was not traced" in result.stdout
    assert "total" in result.stdout  # the parameter, gradient and AdamW rows are there


def test_json_stdout_is_one_object_when_the_policy_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    """As LeRobot's SmolVLA, whose constructor prints a line: with --json it goes to stderr."""
    init = ACTPolicy.__init__

    def announcing(self: ACTPolicy, *args: Any, **kwargs: Any) -> None:
        print("building ACT ...")
        init(self, *args, **kwargs)

    monkeypatch.setattr(ACTPolicy, "__init__", announcing)
    result = CliRunner().invoke(cli_group, ["plan", "--world_size=2", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["world_size"] == 2
    assert "building ACT ..." in result.stderr


def test_the_plan_traces_the_preprocessor_the_policy_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a plugin policy that brings its own processors (the LeRobot bridge's do): the plan
    runs that preprocessor, not the default normalisation, so it measures what the run feeds
    the model. Here it feeds every sample twice, which doubles the activations."""
    default = ACTPolicy.make_processors.__func__  # type: ignore[attr-defined]
    calls: list[str] = []

    def upscaling(cls: type[ACTPolicy], config: Any, meta: Any) -> Any:
        pre, post = default(cls, config, meta)

        def twice(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            calls.append("pre")
            return {key: torch.cat([value, value]) for key, value in pre(batch).items()}

        return twice, post

    before = _plan([], 1)["activations"]["peak_bytes"]
    monkeypatch.setattr(ACTPolicy, "make_processors", classmethod(upscaling))
    after = _plan([], 1)["activations"]["peak_bytes"]
    assert calls and 1.8 * before < after < 2.2 * before, (before, after)


def test_sharded_bf16_computes_activations_in_bf16() -> None:
    """FSDP2's param_dtype makes the units compute (and save) bf16 tensors: about half the float32 figure."""
    fp32 = _plan(["--parallelism.dp_shard=2"], 2)["activations"]["peak_bytes"]
    bf16 = _plan(["--parallelism.dp_shard=2", "--accelerator.mixed_precision=bf16"], 2)["activations"]["peak_bytes"]
    assert 0.4 * fp32 < bf16 < 0.75 * fp32, (bf16, fp32)


FIT_FLAGS = ["--batch_size=4", "--policy.dim_model=64", "--policy.n_encoder_layers=1", "--policy.n_vae_encoder_layers=1"]


def test_device_memory_gb_finds_the_largest_batch_the_run_fits() -> None:
    flags = [*FIT_FLAGS, "--accelerator.activation_checkpointing=true"]
    plan = plan_run(parse_train_config(flags), 1, 0.01)
    fit = plan.to_json()["activations"]["batch_fit"]
    largest, traced = fit["largest_batch_size"], {int(b): a for b, a in fit["traced_activation_bytes"].items()}
    assert fit["budget_bytes"] == 2**30 // 100 and fit["fixed_bytes"] == plan.sharding.device_bytes
    assert fit["fixed_bytes"] + traced[largest] <= fit["budget_bytes"] < fit["fixed_bytes"] + traced[largest + 1]
    assert len(traced) < 10
    # The fit traces the run as its flags set it: with checkpointing, as the plan at that batch size says.
    at_largest = _plan([*flags, f"--batch_size={largest}"], 1)["activations"]
    assert traced[largest] == at_largest["checkpointed_peak_bytes"]
    assert (
        f"largest --batch_size in 0.01 GiB per rank (with activation checkpointing, as the flags set): {largest},"
        in "\n".join(format_plan(plan, 0.01))
    )


def test_a_device_too_small_for_one_sample_is_one_line() -> None:
    result = CliRunner().invoke(cli_group, ["plan", "--world_size=1", "--plan.device_memory_gb", "0.001", *FIT_FLAGS])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if "fit" in line]
    assert len(lines) == 1, result.stdout
    assert lines[0].startswith("does not fit in 0.001 GiB per rank: --batch_size=1 needs "), lines[0]


PLAN_ERRORS = [
    (["--parallelism.dp_shard=2"], "needs --world_size=N"),
    (["--world_size=zero"], "--world_size=zero: expected a positive number"),
    (["--world_size=2", "--parallelism.dp_shard=2", '--accelerator.fsdp.wrap_modules=["Blok"]'],
     "'Blok', which is not a module class of this model"),
    (["--world_size=2", "--policy.dim_modl=8"], "did you mean --policy.dim_model?"),
    (["--world_size=1", "--plan.device_memory_gb=lots"], "--plan.device_memory_gb=lots: expected a positive number"),
    (["--world_size=1", "--plan.device_memory_gb=0"], "--plan.device_memory_gb=0: expected a positive number"),
    (["--world_size=1", "--plan.device_memory_gb=nan"], "--plan.device_memory_gb=nan: expected a positive number"),
    (["--world_size=1", "--plan.device_memory_gb"], "--plan.device_memory_gb has no value"),
]


@pytest.mark.parametrize(("args", "message"), PLAN_ERRORS)
def test_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    """In-process (the same click command the console script runs), to skip a torch import per case."""
    result = CliRunner().invoke(cli_group, ["plan", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert result.stdout == ""


def test_shard_numel_is_rank_zeros_chunk() -> None:
    for shape, shards in [((10, 3), 4), ((1, 128), 8), ((8,), 4), ((), 4), ((3, 2, 2), 5)]:
        chunks = torch.chunk(torch.empty(shape), shards) if shape else [torch.empty(shape)]
        assert shard_numel(torch.Size(shape), shards) == chunks[0].numel(), (shape, shards)


def test_missing_wrap_units_fail_like_train() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    dims = ParallelDims(dp_replicate=1, dp_shard=2, world_size=2)
    with pytest.raises(ConfigError, match="needs FSDP wrap units"):
        resolve_wrap_units(model, dims, AcceleratorConfig(), None)
    # DDP needs no units, so the same model plans fine.
    ddp = ParallelDims(2, 1, 2)
    assert plan_model(model, ddp, AcceleratorConfig(), resolve_wrap_units(model, ddp, AcceleratorConfig(), None)).units == []


def test_tied_weights_across_units_fail_like_train() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    accel = AcceleratorConfig.model_validate({"fsdp": {"wrap_modules": ["Linear"]}})
    with pytest.raises(ConfigError, match="tied weights cannot be split across FSDP units"):
        resolve_wrap_units(model, ParallelDims(1, 2, 2), accel, None)
