"""``load_dcp``, the one way the toolkit reads DCP shards: torch's metadata rebuilt from
checked stand-ins, bytes entries read as data only, damaged or mis-shaped shards named
in one line. Real ``dcp.save`` folders in one process; the payloads are live (torch's
own reader runs them) and must not run here."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from lerobot_kit.core.checkpoint.safe_dcp import UnsafeShardEntryError, load_dcp, torch_metadata
from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.dcp_metadata import UnsafeMetadataError, read_dcp_metadata

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(4, 3, generator=g), "b": torch.randn(4, generator=g)},
        "optim": {"state": {"w": {"step": torch.tensor(float(seed)), "count": seed}}, "groups": [{"lr": 0.1 * seed}]},
    }


def _save(folder: Path, state: dict) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(folder))
    return folder


def test_loads_tensors_and_plain_values_as_torch_would(tmp_path: Path) -> None:
    folder = _save(tmp_path / "c", _state(3))
    target = _state(0)
    load_dcp(target, folder, what="shards", fix="fix it")
    expected = _state(3)
    assert torch.equal(target["model"]["w"], expected["model"]["w"])
    assert torch.equal(target["optim"]["state"]["w"]["step"], expected["optim"]["state"]["w"]["step"])
    assert target["optim"]["state"]["w"]["count"] == 3 and target["optim"]["groups"] == [{"lr": 0.1 * 3}]


def test_metadata_rebuilt_from_stand_ins_equals_torchs_own(tmp_path: Path) -> None:
    folder = _save(tmp_path / "c", _state(1))
    theirs = pickle.loads((folder / ".metadata").read_bytes())  # our own file, written just now
    ours = torch_metadata(read_dcp_metadata(folder), folder)
    assert ours.state_dict_metadata == theirs.state_dict_metadata
    assert ours.storage_data == theirs.storage_data
    assert ours.planner_data == theirs.planner_data and ours.version == theirs.version


def test_metadata_pickle_calling_os_system_is_refused(tmp_path: Path) -> None:
    folder = _save(tmp_path / "c", _state(1))
    marker = tmp_path / "pwned"
    (folder / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(UnsafeMetadataError, match=r"refusing to load posix.system from .metadata"):
        load_dcp(_state(0), folder, what="shards", fix="")
    assert not marker.exists()


def test_bytes_entry_pickled_with_a_payload_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    state = _state(1)
    state["optim"]["state"]["w"]["count"] = _Payload(marker)  # written by torch.save into the shard
    folder = _save(tmp_path / "c", state)
    assert not marker.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(_state(0), checkpoint_id=str(folder))  # torch's own planner runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(UnsafeShardEntryError) as err:
        load_dcp(_state(0), folder, what="optimizer shards", fix="")
    assert f"{folder / '__0_0.distcp'}: refusing to load entry 'optim.state.w.count'" in str(err.value)
    assert "\n" not in str(err.value) and not marker.exists()


def test_missing_and_truncated_shards_are_named(tmp_path: Path) -> None:
    folder = _save(tmp_path / "c", _state(1))
    shard = folder / "__0_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"__0_0.distcp: truncated shard: .*the optimizer shards are incomplete"):
        load_dcp(_state(0), folder, what="optimizer shards", fix="")
    shard.unlink()
    with pytest.raises(CheckpointError, match=r"__0_0.distcp: missing shard .*the checkpoint is damaged"):
        load_dcp(_state(0), folder, what="optimizer shards", fix="")
    with pytest.raises(CheckpointError, match=r"nowhere: missing, though the checkpoint records DCP weight shards"):
        load_dcp(_state(0), tmp_path / "nowhere", what="weight shards", fix="")


def test_another_shape_names_the_tensor_and_the_fix(tmp_path: Path) -> None:
    folder = _save(tmp_path / "c", _state(1))
    target = _state(0)
    target["model"]["w"] = torch.zeros(5, 3)
    with pytest.raises(CheckpointError) as err:
        load_dcp(target, folder, what="weight shards", fix="pass the same --policy flags")
    assert str(err.value) == (
        f"{folder} does not fit this run's model (saved with other settings): size mismatch for model.w: "
        "[4, 3] in the checkpoint, [5, 3] in the model; pass the same --policy flags"
    )
    assert torch.equal(target["model"]["w"], torch.zeros(5, 3))  # nothing half-loaded
