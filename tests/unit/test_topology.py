"""Declared data-parallel degrees resolved against the world size, and the named mesh axes."""

from __future__ import annotations

import pytest

from lerobot_kit.core.config.schema import ParallelismConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.layout.training_step import Topology
from lerobot_kit.core.parallel.dims import ParallelDims


@pytest.mark.parametrize(
    ("replicate", "shard", "world", "expected", "layout"),
    [
        (None, None, 1, (1, 1), "single"),
        (None, None, 4, (4, 1), "ddp"),
        (None, 4, 4, (1, 4), "fsdp"),
        (None, -1, 8, (1, 8), "fsdp"),
        (2, -1, 8, (2, 4), "hsdp"),
        (2, 2, 4, (2, 2), "hsdp"),
        (4, None, 4, (4, 1), "ddp"),
        (1, 1, 1, (1, 1), "single"),
        (None, -1, 1, (1, 1), "single"),
    ],
)
def test_resolve(replicate, shard, world, expected, layout) -> None:
    dims = ParallelDims.resolve(ParallelismConfig(dp_replicate=replicate, dp_shard=shard), world)
    assert (dims.dp_replicate, dims.dp_shard) == expected
    assert dims.layout == layout
    assert dims.sharded == (expected[1] > 1)
    assert dims.dp_world_size == world
    assert dims.topology == Topology(world_size=world, dp_replicate=expected[0], dp_shard=expected[1], layout=layout)
    assert dims.topology.sharded == dims.sharded


def test_product_mismatch_names_degrees_world_and_fix() -> None:
    with pytest.raises(ConfigError) as err:
        ParallelDims.resolve(ParallelismConfig(dp_replicate=2, dp_shard=3), 4)
    message = str(err.value)
    assert "--parallelism.dp_replicate=2 × --parallelism.dp_shard=3 = 6" in message
    assert "world size of 4" in message and "dp_replicate × dp_shard = 4" in message and "dp_shard=-1" in message
    # Only dp_shard set: dp_replicate is 1, not guessed.
    with pytest.raises(ConfigError, match="dp_replicate=1 × --parallelism.dp_shard=2 = 2 does not match the world size of 4"):
        ParallelDims.resolve(ParallelismConfig(dp_shard=2), 4)


@pytest.mark.parametrize(
    ("replicate", "shard", "world", "match"),
    [
        (0, None, 2, "dp_replicate=0 is invalid"),
        (-1, 2, 2, "dp_replicate=-1 is invalid"),
        (None, 0, 2, "dp_shard=0 is invalid"),
        (None, -2, 2, "dp_shard=-2 is invalid"),
        (3, -1, 4, "needs a world size divisible by 3, but 4 processes"),
        (None, None, 0, "world size must be at least 1"),
    ],
)
def test_invalid_degrees(replicate, shard, world, match) -> None:
    with pytest.raises(ConfigError, match=match):
        ParallelDims.resolve(ParallelismConfig(dp_replicate=replicate, dp_shard=shard), world)


def test_unsharded_layouts_have_no_mesh() -> None:
    assert ParallelDims(1, 1, 1).build_mesh("cpu") is None
    assert ParallelDims(4, 1, 4).build_mesh("cpu") is None


def test_data_parallel_rank_reads_the_named_axes_row_major() -> None:
    """Ranks fill the mesh row-major over (dp_replicate, dp_shard), as init_device_mesh does;
    both axes are data-parallel, so each rank reads its own slice of every batch."""
    hsdp = ParallelDims(dp_replicate=2, dp_shard=2, world_size=4)
    assert hsdp.degrees() == {"dp_replicate": 2, "dp_shard": 2}
    assert [hsdp.dp_rank(r) for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="rank 4 is outside a world of 4"):
        hsdp.dp_rank(4)
