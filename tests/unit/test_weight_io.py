"""The weight readers and writers in one process: what they store, and that what a
checkpoint records, not which files exist, decides what is read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from plugin_dists import fresh_registry, make_distribution
from records import write_record
from safetensors.torch import load_file
from torch import nn

from lerobot_kit.core.checkpoint.pretrained import load_pretrained_weights
from lerobot_kit.core.checkpoint.weights import (
    ModelWeights,
    load_any_weights,
    write_gathered,
    write_shards,
    write_weights_file,
)
from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.stored_weights import StoredWeights
from lerobot_kit.core.model.peft import model_weights
from lerobot_kit.core.registry.registry import get_registry

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

# A plugin format whose file only its own load_weights reads right: every tensor negated.
NEGATED_HOOKS = """
from lerobot_kit.api import hookimpl

@hookimpl
def lerobot_register_checkpoint_formats(register):
    register("negated", "negplug_format:NegatedFormat")
"""
NEGATED_FORMAT = """
from lerobot_kit.api import CheckpointFormat, gathered_state, load_state, read_safetensors, write_weights_file

class NegatedFormat(CheckpointFormat):
    def save_weights(self, weights, pretrained_dir, *, sharded, is_main):
        state = gathered_state(weights, sharded=sharded, is_main=is_main)
        if is_main:
            write_weights_file(weights, {name: -t for name, t in state.items()}, pretrained_dir)
        return "gathered"

    def load_weights(self, weights, pretrained_dir, *, distributed, is_main):
        path = weights.file_in(pretrained_dir)
        saved = {name: -t for name, t in read_safetensors(path).items()} if is_main or not distributed else {}
        load_state(weights, saved, source=path, distributed=distributed, is_main=is_main)
"""


def _model(seed: int, hidden: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, 2))


def _loaded(pretrained: Path) -> dict[str, torch.Tensor]:
    fresh = _model(seed=99)
    load_any_weights(model_weights(fresh), pretrained, distributed=False, is_main=True)
    return fresh.state_dict()


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def both(tmp_path: Path) -> tuple[Path, nn.Module, nn.Module]:
    """A step folder whose shards hold model ``a`` and whose gathered file holds model ``b``."""
    pretrained = tmp_path / "000006" / paths.PRETRAINED_DIR
    pretrained.mkdir(parents=True)
    a, b = _model(1), _model(2)
    write_shards(model_weights(a), pretrained)
    write_gathered(model_weights(b), pretrained, sharded=False, is_main=True)
    return pretrained, a, b


def test_a_plain_model_stores_its_whole_state_under_its_own_names(tmp_path: Path) -> None:
    model = _model(0)
    weights = model_weights(model)
    assert (weights.naming.file_name, weights.naming.include_frozen) == (paths.MODEL_WEIGHTS, True)
    write_gathered(weights, tmp_path, sharded=False, is_main=True)
    assert _equal(load_file(tmp_path / paths.MODEL_WEIGHTS), model.state_dict())
    assert _equal(_loaded(tmp_path), model.state_dict())


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [("dcp", "a"), ("gathered+dcp", "b"), ("gathered", "b"), (None, "b")],
    ids=["shards-recorded", "both-recorded-one-process-reads-the-file", "file-recorded", "no-record"],
)
def test_the_record_decides_what_is_read(both, recorded: str | None, expected: str) -> None:
    pretrained, a, b = both
    if recorded is not None:
        write_record(pretrained.parent, recorded)
    assert _equal(_loaded(pretrained), {"a": a, "b": b}[expected].state_dict())


def test_where_one_file_is_needed_recorded_shards_ask_for_convert_dcp(both) -> None:
    pretrained, _, _ = both
    write_record(pretrained.parent, "dcp")
    assert pretrained.joinpath(paths.MODEL_WEIGHTS).is_file()  # present, but not what the checkpoint holds
    with pytest.raises(CheckpointError) as err:
        StoredWeights.of(pretrained).gathered_file()
    assert str(err.value) == (
        f"{pretrained} holds only DCP weight shards ({paths.DCP_MODEL_DIR}/), no {paths.MODEL_WEIGHTS}; "
        f"merge them first: lerobot convert-dcp --checkpoint_dir={pretrained.parent}"
    )


def test_a_file_of_another_model_names_what_does_not_fit(tmp_path: Path) -> None:
    write_gathered(model_weights(_model(0, hidden=5)), tmp_path, sharded=False, is_main=True)
    with pytest.raises(CheckpointError, match=r"does not fit this Sequential .*size mismatch for 0.weight"):
        _loaded(tmp_path)
    renamed = {f"policy.{k}": v for k, v in _model(0).state_dict().items()}
    write_weights_file(model_weights(_model(0)), renamed, tmp_path)
    with pytest.raises(CheckpointError, match=r"missing \['0.bias', '0.weight', '2.bias'\], unexpected \['policy.0.bias'"):
        _loaded(tmp_path)


def test_recorded_full_weights_are_not_loaded_as_an_adapter(tmp_path: Path) -> None:
    (tmp_path / paths.ADAPTER_CONFIG).write_text("{}")
    write_gathered(model_weights(_model(0)), tmp_path, sharded=False, is_main=True)
    assert not StoredWeights.of(tmp_path).adapter  # full weights beside an adapter config: a merged folder
    (tmp_path / paths.MODEL_WEIGHTS).unlink()
    stored = StoredWeights.of(tmp_path)
    assert stored.adapter and stored.file_name == paths.ADAPTER_WEIGHTS
    with pytest.raises(CheckpointError, match="holds a PEFT adapter, not full weights"):
        _loaded(tmp_path)


def test_views_and_shared_tensors_are_stored_as_copies(tmp_path: Path) -> None:
    big = torch.arange(12.0)
    tied = torch.randn(3, 2)
    tensors = {"view": big[2:5], "transposed": tied.t(), "tied": tied, "tied_again": tied, "empty": torch.empty(0)}
    write_weights_file(ModelWeights(_model(0), model_weights(_model(0)).naming), tensors, tmp_path)
    stored = load_file(tmp_path / paths.MODEL_WEIGHTS)
    assert _equal(stored, {k: v.contiguous() for k, v in tensors.items()})
    assert tensors["tied"] is tied and big.shape == (12,)  # the caller's tensors are left alone


@pytest.fixture
def negated_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    site = make_distribution(tmp_path / "site", "negplug", NEGATED_HOOKS)
    (site / "negplug_format.py").write_text(NEGATED_FORMAT)
    monkeypatch.syspath_prepend(str(site))
    fresh_registry(monkeypatch)
    yield get_registry().checkpoint_format("negated")


def test_policy_path_reads_with_the_format_the_checkpoint_records(tmp_path: Path, negated_format) -> None:
    model = _model(0)
    pretrained = tmp_path / "000006" / paths.PRETRAINED_DIR
    pretrained.mkdir(parents=True)
    assert negated_format.save_weights(model_weights(model), pretrained, sharded=False, is_main=True) == "gathered"
    write_record(pretrained.parent, "gathered", checkpoint_format="negated")
    fresh = _model(9)
    load_pretrained_weights(fresh, pretrained.parent)
    assert _equal(fresh.state_dict(), model.state_dict())

    (pretrained.parent / paths.TRAINING_STATE_DIR / paths.TRAINING_STEP).unlink()  # now read as save_pretrained's
    load_pretrained_weights(fresh, pretrained.parent)
    assert _equal(fresh.state_dict(), {name: -t for name, t in model.state_dict().items()})
