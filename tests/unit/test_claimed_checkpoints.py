"""``--policy.path`` without ``--policy.type``: a registered policy config that claims the
checkpoint's ``config.json`` (``claims_pretrained``) is picked, and reads the folder itself;
an unclaimed file is read as a lerobot-kit config, as before."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugin_dists import fresh_registry, make_distribution

from lerobot_kit.core.config.flags import parse_train_config

CLAIMING_PLUGIN = """
from typing import Any
from pydantic import model_validator
from lerobot_kit.api import PolicyConfig, hookimpl

class ForeignConfig(PolicyConfig):
    type: str = "foreign_bridge"
    width: int = 1

    @classmethod
    def claims_pretrained(cls, saved: dict) -> bool:
        return saved.get("type") == "foreign" and "input_features" in saved

    @model_validator(mode="before")
    @classmethod
    def _width_from_path(cls, data: Any) -> Any:
        import json, pathlib
        if isinstance(data, dict) and data.get("path") and "width" not in data:
            data = {**data, "width": json.loads((pathlib.Path(data["path"]) / "config.json").read_text())["width"]}
        return data

@hookimpl
def lerobot_register_policies(register):
    register("foreign_bridge", ForeignConfig, "collections:OrderedDict")
"""


@pytest.fixture
def claiming_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    site = make_distribution(tmp_path / "site", "claimplug", CLAIMING_PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    fresh_registry(monkeypatch)
    yield
    sys.modules.pop("claimplug", None)


def _checkpoint(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_claimed_checkpoint_picks_the_claiming_type(claiming_plugin: None, tmp_path: Path) -> None:
    # Written by another library: its own fields, which lerobot-kit's types do not have.
    path = _checkpoint(tmp_path / "foreign", {"type": "foreign", "width": 7, "input_features": {}, "use_peft": False})
    config = parse_train_config([f"--policy.path={path}"])
    assert config.policy.type == "foreign_bridge" and config.policy.width == 7


def test_an_unclaimed_checkpoint_is_read_as_its_own_type(claiming_plugin: None, tmp_path: Path) -> None:
    path = _checkpoint(tmp_path / "native", {"type": "act", "dim_model": 48})
    config = parse_train_config([f"--policy.path={path}"])
    assert config.policy.type == "act" and config.policy.dim_model == 48


def test_a_claimed_config_is_validated_by_its_claiming_type_alike_everywhere(
    claiming_plugin: None, tmp_path: Path
) -> None:
    """The one check inspect-checkpoint, the loaders and --policy.path share validates a claimed
    config.json as --policy.path hands it over: the folder, read by the claiming type."""
    from lerobot_kit.core.errors import CheckpointError
    from lerobot_kit.core.layout.validate import check_pretrained_folder
    from lerobot_kit.core.offline.inspect import inspect_checkpoint

    path = _checkpoint(tmp_path / "foreign", {"type": "foreign", "width": "four", "input_features": {}})
    problem = ("foreign/config.json: not a valid 'foreign_bridge' config: width: Input should be a valid integer, "
               "unable to parse string as an integer (got 'four')")
    assert [p.line for p in check_pretrained_folder(path).problems] == [problem]
    report = inspect_checkpoint(path)
    assert report.problems == [problem] and report.loadable.why == problem and not report.loadable.ok
    with pytest.raises(CheckpointError) as refused:
        parse_train_config([f"--policy.path={path}"])
    assert str(refused.value) == (
        f"{tmp_path}/{problem}; the checkpoint is damaged: load an earlier step folder of the run")
