"""``lerobot plan`` in one process: the plan's arithmetic and its one-line errors.

The errors go through the same click command the console script runs (``CliRunner``),
to skip a torch import per case; the console script itself is tested in
``integration/test_plan_ranks.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from lerobot_kit.cli.main import cli as cli_group
from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.config.schema import AcceleratorConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.parallel.memory_plan import plan_model, plan_run, shard_numel
from lerobot_kit.core.parallel.wrap_units import resolve_wrap_units


def _plan(flags: list[str], world_size: int) -> dict[str, Any]:
    return plan_run(parse_train_config(flags), world_size).to_json()


def test_unsharded_layouts_hold_everything() -> None:
    single, ddp = _plan([], 1), _plan([], 8)
    assert (single["layout"], ddp["layout"]) == ("single", "ddp")
    for plan in (single, ddp):
        assert plan["units"] == [] and plan["per_rank"] == plan["ddp_per_rank"]
        assert plan["largest_gather_bytes"] is None


PLAN_ERRORS = [
    (["--parallelism.dp_shard=2"], "needs --world_size=N"),
    (["--world_size=zero"], "--world_size=zero: expected a positive number"),
    (["--world_size=2", "--parallelism.dp_shard=2", '--accelerator.fsdp.wrap_modules=["Blok"]'],
     "'Blok', which is not a module class of this model"),
    (["--world_size=2", "--policy.dim_modl=8"], "did you mean --policy.dim_model?"),
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
