"""Non-finite values: the training step's guard (fold, decision, policies, weights before a save),
the test-only NaN fault's parsing, and the LeRobot reader's check of a dataset's float columns."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_dataset_factory import write_lerobot_dataset
from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.run.reliability.fault_injection import Fault
from lerobot_kit.core.run.reliability.nonfinite import NonFiniteError, NonFiniteGuard, weights_finite
from lerobot_kit.plugins.datasets.lerobot.columns import is_cached
from lerobot_kit.plugins.datasets.lerobot.files import LeRobotDatasetError
from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig
from lerobot_kit.plugins.datasets.lerobot.reader import make_lerobot_dataset

CTX = DistContext(0, 0, 1, torch.device("cpu"), "single", None)
NAN, INF = float("nan"), float("inf")


def guard(scaled: bool = False, **fields: object) -> NonFiniteGuard:
    return NonFiniteGuard(TrainConfig(**fields), CTX, scaled)


def step(g: NonFiniteGuard, number: int, loss: float, grad_norm: float) -> bool:
    """One update as the trainer runs it: the loss folded before backward, then the decision."""
    g.fold(torch.tensor(loss), torch.tensor(loss))
    return g.check(number, grad_norm)


def gradients(loss_of: torch.nn.Module, fold: NonFiniteGuard | None, poison: float = 0.0) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    out = model(torch.randn(5, 3)).mean() + poison
    loss = out if fold is None else fold.fold(out, out / 2) * 2
    loss.backward()
    return [p.grad for p in model.parameters()]


def test_fold_leaves_a_finite_loss_and_its_gradients_bit_identical_and_spreads_a_nan_into_every_gradient():
    plain = gradients(torch.nn.Identity(), None)
    folded = gradients(torch.nn.Identity(), guard())
    assert all(torch.equal(a, b) for a, b in zip(plain, folded))
    poisoned = gradients(torch.nn.Identity(), guard(), poison=NAN)  # the loss alone is NaN, not the model
    assert all(torch.isnan(g).all() for g in poisoned)


def test_stop_names_the_step_and_the_first_non_finite_value():
    g = guard()
    assert step(g, 1, 0.5, 2.0)
    with pytest.raises(NonFiniteError) as error:
        step(g, 2, NAN, NAN)
    message = str(error.value)
    assert message.startswith("step 2: loss is nan (grad_norm nan); stopped before updating the weights")
    assert "--nonfinite=skip" in message and "\n" not in message
    with pytest.raises(NonFiniteError, match=r"^step 7: grad_norm is inf; stopped"):
        step(guard(), 7, 0.5, INF)  # a finite loss with an overflowing gradient
    with pytest.raises(NonFiniteError, match=r"^step 3: loss is inf \(grad_norm nan\)"):
        step(guard(), 3, INF, NAN)


def test_skip_counts_skips_and_stops_at_the_limit_of_skips_in_a_row():
    g = guard(nonfinite="skip", nonfinite_max_consecutive=3)
    decisions = [step(g, n, loss, norm) for n, loss, norm in
                 [(1, 0.5, 1.0), (2, NAN, NAN), (3, NAN, NAN), (4, 0.4, 1.0), (5, 0.3, INF), (6, NAN, NAN)]]
    assert decisions == [True, False, False, True, False, False] and g.skipped == 4 and g.consecutive == 2
    with pytest.raises(NonFiniteError) as error:
        step(g, 7, NAN, NAN)
    assert str(error.value).startswith("step 7: loss is nan (grad_norm nan), 3 updates in a row skipped "
                                       "(--nonfinite_max_consecutive=3); stopped")
    assert "--nonfinite=skip" not in str(error.value)


def test_under_the_fp16_loss_scaler_only_a_non_finite_loss_counts():
    g = guard(scaled=True)
    assert step(g, 1, 0.5, INF) and step(g, 2, 0.5, NAN)  # the scaler's overflows: it skips them itself
    with pytest.raises(NonFiniteError, match="^step 3: loss is nan"):
        step(g, 3, NAN, NAN)


def test_a_non_finite_loss_in_any_micro_batch_of_an_update_is_named():
    g = guard()
    g.fold(torch.tensor(INF), torch.tensor(INF))
    g.fold(torch.tensor(0.5), torch.tensor(0.5))  # the update's last micro-batch is finite
    with pytest.raises(NonFiniteError, match=r"^step 4: loss is inf \(grad_norm nan\)"):
        g.check(4, NAN)


def test_weights_are_checked_with_max_abs_so_huge_finite_weights_pass():
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(3e38)  # its squared norm would overflow float32
    assert weights_finite(model, CTX, sharded=False)
    with torch.no_grad():
        model.bias[1] = NAN
    assert not weights_finite(model, CTX, sharded=False)
    model.bias.requires_grad_(False)  # frozen weights are not trained, so not checked
    assert weights_finite(model, CTX, sharded=False)


def test_the_nan_fault_parses_with_a_step_count_and_not_at_a_save():
    assert Fault.parse("point=forward,step=3,action=nan,count=2") == Fault("forward", 3, action="nan", count=2)
    assert Fault.parse("point=backward,step=2,rank=1,action=nan").count == 1
    with pytest.raises(ConfigError, match="a save point only supports action=kill"):
        Fault.parse("point=sync_save,step=2,action=nan")


# ----------------------------------------------------------------------------- the LeRobot reader

LENGTHS = [7, 12, 5]  # one data file: episode 1 starts at row 7, episode 2 at row 19


@pytest.fixture
def dataset_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user_cache"))
    write_lerobot_dataset(tmp_path / "data", LENGTHS)
    return tmp_path / "data"


def load(root: Path):
    return make_lerobot_dataset(LeRobotDatasetConfig(repo_id="user/x", root=str(root)), {})


def put(root: Path, key: str, values: dict[int, float]) -> Path:
    """Rewrite the data file with ``values`` (row -> value) in the first element of ``key``."""
    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    column = table.column(key).combine_chunks()
    rows = column.flatten().to_numpy().reshape(len(column), -1).copy()
    for row, value in values.items():
        rows[row, 0] = value
    rebuilt = pa.array(rows.tolist(), type=column.type)
    pq.write_table(table.set_column(table.schema.get_field_index(key), key, rebuilt), path)
    return path


def test_a_nan_action_is_reported_at_load_by_file_column_episode_and_frame(dataset_root: Path):
    path = put(dataset_root, "action", {7 + 3: NAN})
    with pytest.raises(LeRobotDatasetError) as error:
        load(dataset_root)
    assert str(error.value).startswith(f"{path}: column 'action' episode 1 frame 3 holds nan; ")
    assert "fix: clean the dataset" in str(error.value) and "\n" not in str(error.value)
    assert not (dataset_root / ".lerobot_kit_cache").exists()  # nothing cached from a bad file


def test_every_bad_frame_is_counted_and_a_cleaned_file_loads_and_is_not_read_again(dataset_root: Path):
    put(dataset_root, "observation.state", {2: INF, 19 + 1: -INF})
    with pytest.raises(LeRobotDatasetError, match=r"column 'observation.state' episode 0 frame 2 holds inf "
                                                  r"\(2 frames of episode\(s\) \[0, 2\] hold non-finite values\)"):
        load(dataset_root)
    put(dataset_root, "observation.state", {2: 0.0, 20: 0.0})
    dataset = load(dataset_root)
    assert math.isfinite(float(dataset[2]["observation.state"][0]))
    assert is_cached(dataset.info, (0, 0))  # checked once: the next start reads the cache, not the parquet
