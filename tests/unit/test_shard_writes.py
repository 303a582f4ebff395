"""Deferred DCP shard writes: a save stages a copy of the state and writes it later."""

from __future__ import annotations

import torch


def test_deferred_shard_writes_stage_a_copy_and_write_later(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from lerobot_kit.core.checkpoint.shard_writes import deferred_shard_writes, save_shards, write_deferred

    state = {"w": torch.zeros(4096)}
    stager = DefaultStager(StagingOptions(
        use_pinned_memory=False, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=False
    ))
    with deferred_shard_writes(stager) as deferred:
        save_shards(state, tmp_path / "shards")
    assert not (tmp_path / "shards").exists()  # staged only
    state["w"].add_(1.0)  # training changes the live tensor before the write
    write_deferred(deferred.writes, None)
    loaded = {"w": torch.ones(4096)}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "shards"))
    assert torch.equal(loaded["w"], torch.zeros(4096))
    stager.close()
