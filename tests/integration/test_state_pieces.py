"""A piece of training state added from outside the product: saved, resumed bit for bit, listed.

The piece is declared by a plugin module (``register_state_piece``: its name and file, in
the torch-free layout table) and added to a run's ``TrainingState`` as a ``Stateful`` with
the ``JsonFile`` store: no file of lerobot-kit changes. The real writer saves it with the
run's other pieces, a run built afresh restores every piece from the step folder (the toy
one, the weights, the optimizer, the random state and the data position, bit for bit),
and the ``inspect-checkpoint`` console script, which sees the plugin, lists the piece,
reports the folder resumable, and refuses it without the piece's file or with contents
the piece's rule refuses.

The synthetic checkpoints the layout tests damage (``tests/checkpoint_files.py``) are held
here to what the real saver writes, for every kind of checkpoint that writer offers.
"""

from __future__ import annotations

import importlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_files import write_checkpoint
from conftest import TINY_ACT, pool_train, run_cli
from plugin_dists import env_with, make_distribution

from lerobot_kit.core.checkpoint.save_restore import restore_checkpoint, save_checkpoint
from lerobot_kit.core.checkpoint.state import Piece
from lerobot_kit.core.checkpoint.stores import JsonFile
from lerobot_kit.core.checkpoint.training_state import load_per_rank
from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.data.sampler import DataPosition
from lerobot_kit.core.distributed.process_group import init_distributed, shutdown
from lerobot_kit.core.layout import files, state_pieces
from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout.dcp_metadata import read_dcp_metadata
from lerobot_kit.core.run.prepare import PreparedRun, prepare_run

PLUGIN = "toy_state_plugin"
TOY_FILE = f"{L.TRAINING_STATE_DIR}/toy_counter.json"
PLUGIN_MODULE = f'''
from lerobot_kit.core.layout.layout_file import LayoutFile
from lerobot_kit.core.layout.state_pieces import StatePiece, register_state_piece

def count_problems(value):
    ok = isinstance(value, dict) and type(value.get("count")) is int
    return [] if ok else ["count must be an integer"]

register_state_piece(StatePiece("toy_counter", (LayoutFile("{TOY_FILE}", rule=count_problems),)))
'''
STEP = 3
DATA = ["--dataset.num_episodes=2", "--dataset.episode_length=20", "--batch_size=4", "--num_workers=0"]
FLAGS = [*TINY_ACT, *DATA, "--steps=6"]


class ToyCounter:
    """A piece of state no library provides: a count and some floats (JSON keeps them exactly)."""

    def __init__(self, count: int = 0, values: list[float] | None = None) -> None:
        self.count = count
        self.values = values or []

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "values": list(self.values)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.count = state_dict["count"]
        self.values = list(state_dict["values"])


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The plugin installed for the console scripts, and imported here; the layout table this
    process had comes back when the test ends."""
    site = make_distribution(tmp_path / "site", PLUGIN, PLUGIN_MODULE)
    monkeypatch.setattr(state_pieces, "_PIECES", dict(state_pieces._PIECES))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(__import__("sys").modules, PLUGIN, raising=False)
    importlib.import_module(PLUGIN)
    return site


def _run(output_dir: Path, seed: int) -> PreparedRun:
    config = parse_train_config([f"--output_dir={output_dir}", f"--seed={seed}", *FLAGS])
    return prepare_run(config, init_distributed(60))


def test_a_piece_added_from_outside_is_saved_resumed_and_listed(tmp_path: Path, plugin: Path) -> None:
    saved_run = _run(tmp_path / "a", seed=5)
    state = saved_run.run.checkpoint_state
    toy = ToyCounter(7, [random.random() for _ in range(5)])
    state.training.add("toy_counter", Piece(toy, JsonFile()))
    saved_run.run.cursor.position = DataPosition(epoch=1, offset=8, samples_seen=48)
    step_dir = save_checkpoint(state, STEP)
    assert step_dir is not None and (step_dir / TOY_FILE).is_file()
    assert json.loads((step_dir / TOY_FILE).read_text()) == toy.state_dict()

    fresh = _run(tmp_path / "b", seed=9)
    other = fresh.run.checkpoint_state
    restored_toy = ToyCounter()
    other.training.add("toy_counter", Piece(restored_toy, JsonFile()))
    assert not torch.equal(next(iter(other.model.parameters())), next(iter(state.model.parameters())))
    restored = restore_checkpoint(other, step_dir)
    assert restored.step == STEP
    assert restored_toy.state_dict() == toy.state_dict()
    assert fresh.run.cursor.position == DataPosition(epoch=1, offset=8, samples_seen=48)
    for (name, a), b in zip(state.model.state_dict().items(), other.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"weight {name} differs"
    saved_optim, restored_optim = state.optimizer.state_dict(), other.optimizer.state_dict()
    for index, entry in saved_optim["state"].items():
        for key, value in entry.items():
            assert torch.equal(value, restored_optim["state"][index][key]), f"optimizer {index}.{key} differs"
    saved_rng = load_per_rank(step_dir / L.TRAINING_STATE_DIR / L.RNG_STATE, 0)
    assert saved_rng is not None and torch.equal(torch.get_rng_state(), saved_rng["torch"])
    shutdown(saved_run.run.ctx)

    listed = run_cli("inspect-checkpoint", "--json", str(step_dir), env=env_with(plugin))
    assert listed.returncode == 0, listed.stdout + listed.stderr
    report = json.loads(listed.stdout)
    pieces = {piece["name"]: piece["held_in"] for piece in report["state"]}
    assert pieces["toy_counter"] == [TOY_FILE]
    assert set(pieces) == {"model", "optimizer", "rng", "scheduler", "data_position", "toy_counter"}
    assert report["resumable"]["ok"] is True
    text = run_cli("inspect-checkpoint", str(step_dir), env=env_with(plugin))
    assert f"toy_counter ({TOY_FILE})" in text.stdout

    (step_dir / L.MANIFEST).unlink()  # so that what is wrong is the table's finding alone
    (step_dir / TOY_FILE).write_text(json.dumps({"count": "seven", "values": []}))
    damaged = run_cli("inspect-checkpoint", "--json", str(step_dir), env=env_with(plugin))
    assert json.loads(damaged.stdout)["problems"] == [f"{TOY_FILE}: count must be an integer"]
    (step_dir / TOY_FILE).unlink()
    lacking = run_cli("inspect-checkpoint", "--json", str(step_dir), env=env_with(plugin))
    assert lacking.returncode == 1
    assert json.loads(lacking.stdout)["problems"] == [f"{TOY_FILE}: missing (every checkpoint holds it)"]


# Each kind of checkpoint ``write_checkpoint`` writes: its options, and the flags of a real run
# whose saver writes the same kind, on how many ranks (a sharded run, for shards, needs two).
WRITER_KINDS = {
    "full, gathered, one optimizer file": ({}, [], 1),
    "fp16 with its loss scaler": ({"mixed_precision": "fp16"}, ["--accelerator.mixed_precision=fp16"], 1),
    "PEFT adapter": ({"peft": True}, ["--peft.method_type=LORA", "--peft.r=2"], 1),
    "DCP shards": ({"weights": "dcp", "optimizer": "dcp", "dp_shard": 2},
                   ["--parallelism.dp_shard=2", "--checkpoint_format=dcp"], 2),
    "gathered and DCP shards": ({"weights": "gathered+dcp", "optimizer": "dcp", "dp_shard": 2},
                                ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors_dcp"], 2),
}


@pytest.fixture(scope="module")
def full_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the real saver writes for a full model, gathered, with one optimizer file: compared
    as it is, and the pretrained policy the PEFT run adapts."""
    run = _run(tmp_path_factory.mktemp("full"), seed=5)
    step_dir = save_checkpoint(run.run.checkpoint_state, STEP)
    shutdown(run.run.ctx)
    assert step_dir is not None
    return step_dir


def _real_checkpoint(kind: str, full: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """The step folder the real saver writes for ``kind``: saved in this process without a
    step for one rank; for two, a one-step run on the rank pool's two ranks."""
    options, flags, ranks = WRITER_KINDS[kind]
    if not flags:
        return full
    if ranks > 1:
        output = tmp_path / "real"
        pool_train(request.getfixturevalue("rank_pools"), ranks, f"--output_dir={output}", *TINY_ACT, *DATA,
                   *flags, "--steps=1", workdir=tmp_path)
        return output / L.CHECKPOINTS_DIR / L.step_dir_name(1)
    # An adapter needs a pretrained policy to adapt: the full checkpoint's.
    policy = [f"--policy.path={full / L.PRETRAINED_DIR}"] if options.get("peft") else TINY_ACT
    config = parse_train_config([f"--output_dir={tmp_path / 'real'}", "--seed=5", *policy, *DATA, *flags, "--steps=6"])
    run = prepare_run(config, init_distributed(60))
    step_dir = save_checkpoint(run.run.checkpoint_state, STEP)
    shutdown(run.run.ctx)
    assert step_dir is not None
    return step_dir


@pytest.mark.parametrize("kind", WRITER_KINDS)
def test_the_tests_checkpoint_writer_writes_what_the_trainer_writes(
    full_checkpoint: Path, tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """``tests/checkpoint_files.py`` stands in for the trainer's writer in the layout tests: for
    every kind of checkpoint it writes, the step folder holds the same files, tensor names and
    JSON fields as one the real saver wrote for the same kind."""
    real = _real_checkpoint(kind, full_checkpoint, tmp_path, request)
    synthetic = write_checkpoint(tmp_path / "synthetic", step=int(real.name), **WRITER_KINDS[kind][0])

    assert _listing(synthetic / L.TRAINING_STATE_DIR) == _listing(real / L.TRAINING_STATE_DIR)
    held = [file.path for file in files.layout_files()]
    assert [p for p in held if (synthetic / p).exists()] == [p for p in held if (real / p).exists()]
    for folder in (real, synthetic):  # every other file of pretrained_model/ is a processor's state file
        named = {step["state_file"] for proc in (L.PREPROCESSOR, L.POSTPROCESSOR)
                 for step in _json(folder / L.PRETRAINED_DIR / f"{proc}.json")["steps"] if "state_file" in step}
        others = _listing(folder / L.PRETRAINED_DIR) - {p.removeprefix(f"{L.PRETRAINED_DIR}/") for p in held}
        assert others == named, folder
    _same_training_state(synthetic, real)
    _same_pretrained_files(synthetic, real)


def _same_training_state(synthetic: Path, real: Path) -> None:
    """The record, the schedule, the loss scaler, the random state and the optimizer state: the same
    fields and tensor kinds (the optimizer's as one file, or as shards)."""
    T = L.TRAINING_STATE_DIR
    for name in (L.TRAINING_STEP, L.SCHEDULER_STATE, L.SCALER_STATE):
        if (real / T / name).exists():
            assert _shape(_json(synthetic / T / name)) == _shape(_json(real / T / name)), name
    assert _tensor_kinds(synthetic / T / L.RNG_STATE) == _tensor_kinds(real / T / L.RNG_STATE)
    if (real / T / L.OPTIMIZER_STATE).exists():
        groups = [_shape(_json(folder / T / L.OPTIMIZER_PARAM_GROUPS)[0]) for folder in (synthetic, real)]
        assert groups[0].keys() == groups[1].keys()
        assert _tensor_kinds(synthetic / T / L.OPTIMIZER_STATE) == _tensor_kinds(real / T / L.OPTIMIZER_STATE)
    if (real / T / L.DCP_OPTIMIZER_DIR).exists():
        shards = [_dcp_kinds(folder / T / L.DCP_OPTIMIZER_DIR) for folder in (synthetic, real)]
        assert shards[0] == shards[1]


def _same_pretrained_files(synthetic: Path, real: Path) -> None:
    """The configs and the processors: the fields the real ones have (the synthetic may write fewer);
    the model's shards: the same kinds of entries."""
    P = L.PRETRAINED_DIR
    assert _json(synthetic / P / L.DATASET_META).keys() == _json(real / P / L.DATASET_META).keys()
    assert _json(synthetic / P / L.TRAIN_CONFIG).keys() <= _json(real / P / L.TRAIN_CONFIG).keys()
    if (real / P / L.ADAPTER_CONFIG).exists():
        assert _json(synthetic / P / L.ADAPTER_CONFIG).keys() <= _json(real / P / L.ADAPTER_CONFIG).keys()
    for proc in (L.PREPROCESSOR, L.POSTPROCESSOR):
        ours, theirs = _json(synthetic / P / f"{proc}.json"), _json(real / P / f"{proc}.json")
        assert ours.keys() == theirs.keys()
        assert {key for step in ours["steps"] for key in step} <= {key for step in theirs["steps"] for key in step}
    if (real / P / L.DCP_MODEL_DIR).exists():
        shards = [_dcp_kinds(folder / P / L.DCP_MODEL_DIR) for folder in (synthetic, real)]
        assert shards[0] <= shards[1]


def _listing(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir()}


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _shape(value: Any) -> Any:
    """A JSON value's keys and types, recursively (values themselves dropped)."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    return type(value).__name__


def _tensor_kinds(path: Path) -> set[tuple[str, str, tuple[int, ...] | None]]:
    """Each tensor's name past its rank or parameter (``rank<r>.``, ``state.<param>.``), with its
    dtype, and its shape for the per-rank state (a parameter's state has that parameter's shape)."""
    from safetensors import safe_open

    kinds = set()
    with safe_open(str(path), "pt") as file:
        for name in file.keys():
            tensor = file.get_tensor(name)
            if name.startswith("rank"):
                kinds.add((name.split(".", 1)[1], str(tensor.dtype), tuple(tensor.shape)))
            else:
                kinds.add((name.rsplit(".", 1)[1], str(tensor.dtype), None))
    return kinds


def _dcp_kinds(folder: Path) -> set[tuple[str, str]]:
    """Each entry of a DCP folder's metadata past its parameter (``state.<param>.exp_avg`` ->
    ``exp_avg``), with its dtype, or what kind of entry it is if it holds no tensor."""
    metadata = read_dcp_metadata(folder, label=folder.name)
    kinds = set()
    for name, entry in metadata.state_dict_metadata.items():
        dtype = getattr(getattr(entry, "properties", None), "dtype", None)
        kinds.add((name.rsplit(".", 1)[-1], dtype.name if dtype is not None else type(entry).__name__))
    return kinds
