"""A mixture of LeRobot datasets as one dataset: the union a policy sees, the statistics, and
every way a mixture can be wrong, on members written in LeRobot's v3.0 layout that differ as
robots do (camera names and counts, state and action widths, fps, tasks)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import built_once
from lerobot_kit.api import MEMBER_KEY, build_dataset, missing_key, pad_key
from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.data.mixture import MixtureDataset
from lerobot_kit.core.errors import ConfigError, LerobotError
from mixture_datasets import write_member

HIGH, WRIST, TOP = "observation.images.high", "observation.images.wrist", "observation.images.top"
STATE, ACTION = "observation.state", "action"


def _write(folder: Path) -> None:
    # a: one camera "high", 4/2 wide, 10 fps; b: cameras "cam_low" (video) renamed onto high... see MEMBERS.
    write_member(folder / "a", [12, 9], camera="high", fps=10, tasks=("pick the cube",))
    write_member(folder / "b", [8, 11, 6], camera="wrist", state_extra=2, action_extra=3, fps=15, seed=1,
                 tasks=("stack the blocks",))
    write_member(folder / "c", [10], camera="side", fps=10, seed=2, tasks=("open the drawer",))
    write_member(folder / "big", [10], camera="high", fps=10, seed=3, image_size=24)
    write_member(folder / "d", [7, 5], camera="high", fps=20, seed=4, tasks=("wipe the table",))


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, "mixture_members", _write)


def mixture_flags(root: Path, *entries: dict) -> list[str]:
    listed = [{"root": str(root / e["repo_id"].split("/")[1]), **e} for e in entries]
    return [f"--dataset.mixture={json.dumps(listed)}"]


def build(flags: list[str], policy: str = "act") -> MixtureDataset:
    config = parse_train_config([f"--policy.type={policy}", "--policy.chunk_size=4", "--policy.n_action_steps=4",
                                 *flags])
    dataset = build_dataset(config)
    assert isinstance(dataset, MixtureDataset)
    return dataset


def test_the_policy_sees_the_union_padded_and_flagged(members: Path) -> None:
    """b's wrist camera lands on a's "high" by rename; c's "side" camera is missing from a and b
    (a black, flagged placeholder); b's wider vectors set the width, a's and c's are zero-padded."""
    flags = mixture_flags(members, {"repo_id": "t/a"},
                          {"repo_id": "t/b", "rename_map": {WRIST: HIGH}}, {"repo_id": "t/c"})
    dataset = build_with_padding(flags)
    features = dataset.meta.features
    assert sorted(k for k, f in features.items() if f.is_image) == [HIGH, "observation.images.side"]
    assert features[STATE].shape == (6,) and features[ACTION].shape == (5,)
    assert dataset.member_names() == ["t/a", "t/b", "t/c"]
    assert dataset.member_frames().tolist() == [21, 25, 10] and len(dataset) == 56
    items = dataset.items([0, 21, 46], uint8_cameras=True)
    a, b, c = items
    assert [int(item[MEMBER_KEY]) for item in items] == [0, 1, 2]
    assert [int(item["index"]) for item in items] == [0, 21, 46]
    assert a[STATE][4:].abs().sum() == 0 and a[ACTION].shape == (4, 5) and a[ACTION][:, 2:].abs().sum() == 0
    assert b[STATE][4:].abs().sum() > 0 and b[ACTION][:, 2:].abs().sum() > 0
    side = missing_key("observation.images.side")
    assert [bool(item[side]) for item in items] == [True, True, False]
    assert a["observation.images.side"].dtype == torch.uint8 and int(a["observation.images.side"].sum()) == 0
    assert not bool(a[missing_key(HIGH)]) and bool(c[missing_key(HIGH)]) and int(c[HIGH].sum()) == 0
    assert a[HIGH].shape == b[HIGH].shape == c["observation.images.side"].shape
    assert (a["task"], b["task"], c["task"]) == ("pick the cube", "stack the blocks", "open the drawer")
    batch = torch.utils.data.default_collate([{k: v for k, v in item.items() if k != "task"} for item in items])
    assert batch[ACTION].shape == (3, 4, 5)


def test_a_batch_across_members_is_read_per_layout_and_equals_each_member_read_alone(
    members: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """a and d share a layout (features, shapes, offsets) but not fps, episodes or tasks: a
    shuffled batch over a, b and d reads a's and d's items as one request and b's as another,
    and every item equals its member's item read from the member alone, renamed and padded."""
    from lerobot_kit.plugins.datasets.lerobot import reader

    flags = mixture_flags(members, {"repo_id": "t/a"}, {"repo_id": "t/b", "rename_map": {WRIST: HIGH}},
                          {"repo_id": "t/d"})
    dataset = build_with_padding(flags)
    alone = [build_dataset(parse_train_config(["--policy.chunk_size=4", "--policy.n_action_steps=4",
                                               f"--dataset.repo_id=t/{name}", f"--dataset.root={members / name}"]))
             for name in ("a", "b", "d")]
    requests = []
    read_items = reader.read_items
    monkeypatch.setattr(reader, "read_items", lambda layout, asked, uint8: (
        requests.append(len(asked)), read_items(layout, asked, uint8))[1])
    batch = np.random.default_rng(0).permutation(len(dataset))[:16].tolist()
    together = dataset.items(batch, uint8_cameras=True)
    assert sorted(requests) == [1, 2]
    for i, item in zip(batch, together):
        member, local = dataset.locate(i)
        own = alone[member].item(local, uint8_cameras=True)
        assert int(item[MEMBER_KEY]) == member and int(item["index"]) == i and item["task"] == own["task"]
        for key, value in own.items():
            if key in ("task", "index"):  # the item's index is the mixture's (asserted above)
                continue
            mixed = item[{WRIST: HIGH, pad_key(WRIST): pad_key(HIGH)}.get(key, key) if member == 1 else key]
            assert torch.equal(mixed[..., : value.shape[-1]] if key in (STATE, ACTION) else mixed, value), (i, key)


def build_with_padding(flags: list[str]) -> MixtureDataset:
    """The mixture as a policy that pads vectors and accepts missing cameras would get it
    (the LeRobot bridge's VLAs; the core policies refuse it, tested below)."""
    config = parse_train_config(["--policy.chunk_size=4", "--policy.n_action_steps=4", *flags])
    from lerobot_kit.core.registry.registry import get_registry

    dataset = get_registry().dataset("lerobot").build(config.dataset, config.policy.delta_indices())
    assert isinstance(dataset, MixtureDataset)
    dataset.check_policy("a_vla", accepts_missing_cameras=True, pads_vectors=True)
    return dataset


def test_each_member_keeps_its_own_frames_and_episodes(members: Path) -> None:
    """Frame offsets are frames of the member's own clock, and a chunk never leaves the member's
    episode: b's first episode (8 frames at 15 fps) pads its chunk at its own end."""
    dataset = build(mixture_flags(members, {"repo_id": "t/a"}, {"repo_id": "t/c", "rename_map": {
        "observation.images.side": HIGH}}))
    single = build_dataset(parse_train_config(["--policy.chunk_size=4", "--policy.n_action_steps=4",
                                               "--dataset.repo_id=t/c", f"--dataset.root={members / 'c'}"]))
    for local in (0, 7, 9):
        mixed, alone = dataset.item(21 + local), single.item(local)
        assert torch.equal(mixed[ACTION], alone[ACTION]) and torch.equal(mixed[HIGH], alone["observation.images.side"])
        assert torch.equal(mixed[pad_key(ACTION)], alone[pad_key(ACTION)])
    assert dataset.episode_lengths().tolist() == [12, 9, 10]


def test_statistics_are_those_of_the_padded_concatenation(members: Path) -> None:
    """Means, stds, mins and maxes equal numpy's over the members' frames laid end to end, the
    narrower member zero-padded; cameras count only the members that have them."""
    dataset = build_with_padding(mixture_flags(members, {"repo_id": "t/a"}, {"repo_id": "t/b"}))
    frames = {name: [] for name in (STATE, ACTION)}
    for i in range(len(dataset)):
        item = dataset.item(i)
        frames[STATE].append(item[STATE].numpy())
        frames[ACTION].append(item[ACTION][0].numpy())  # the chunk's first entry is the frame's own action
    for key, rows in frames.items():
        data = np.stack(rows).astype(np.float64)
        stats = dataset.meta.stats[key]
        np.testing.assert_allclose(stats["mean"], data.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stats["std"], data.std(0), rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(stats["min"], data.min(0).astype(np.float32))
        np.testing.assert_array_equal(stats["max"], data.max(0).astype(np.float32))
        assert {"q01", "q99"} <= set(stats)
    high, wrist = dataset.meta.stats[HIGH], dataset.meta.stats[WRIST]
    a_alone = build_dataset(parse_train_config(["--dataset.repo_id=t/a", f"--dataset.root={members / 'a'}"]))
    np.testing.assert_array_equal(high["mean"], a_alone.meta.stats[HIGH]["mean"])
    assert wrist["mean"].shape == (3, 1, 1)


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([{"repo_id": "t/a"}, {"repo_id": "t/nothere"}], "mixture member t/nothere: "),
        # Members open on threads; the first bad one in the list is named, whichever failed first.
        ([{"repo_id": "t/a"}, {"repo_id": "t/first"}, {"repo_id": "t/second"}], "mixture member t/first: "),
        ([{"repo_id": "t/a"}, {"repo_id": "t/a"}], "mixture member 1 (t/a) repeats member 0"),
        ([{"repo_id": "t/a", "weight": -1}, {"repo_id": "t/c", "weight": 1}], "weight -1.0 is negative"),
        ([{"repo_id": "t/a", "weight": 0}, {"repo_id": "t/c", "weight": 0}], "weights sum to 0"),
        ([{"repo_id": "t/a", "weight": "much"}, {"repo_id": "t/c", "weight": 1}], "mixture member 0 (t/a): weight"),
        ([{"repo_id": "t/a", "weight": 1}, {"repo_id": "t/c"}], "some members have a weight and others not"),
        ([{"repo_id": "t/a", "rename_map": {STATE: ACTION}}], "onto 'action', which the member already has"),
        ([{"repo_id": "t/a", "rename_map": {WRIST: HIGH}}], "renames 'observation.images.wrist', which the member lacks"),
        ([{"repo_id": "t/a", "rename_map": {HIGH: ""}}], "both names must be non-empty"),
        ([{"repo_id": "t/a"}, {"repo_id": "t/big"}], "of shapes [3, 16, 16] and [3, 24, 24]"),
        ([{"repo_id": "t/a"}, {"repo_id": "t/c"}], "mixture member t/a has no camera 'observation.images.side'"),
        ([{"repo_id": "t/a"}, {"repo_id": "t/b", "rename_map": {WRIST: HIGH}}], "differ in the width of"),
        ([{"repo_id": "t/a", "episodes": []}], "episodes is an empty list"),
        ([{"repo_id": "t/a", "colour": "red"}], "unknown field 'colour'"),
    ],
)
def test_a_bad_mixture_is_one_line_naming_the_member(members: Path, entries: list[dict], expected: str) -> None:
    with pytest.raises(LerobotError) as info:
        build(mixture_flags(members, *entries))
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_two_members_reading_one_folder_are_refused_as_a_repeated_member(members: Path) -> None:
    entries = [{"repo_id": "t/a"}, {"repo_id": "t/c"}, {"repo_id": "t/other", "root": f"{members / 'a'}/."}]
    with pytest.raises(ConfigError) as info:
        build(mixture_flags(members, *entries))
    assert str(info.value) == (
        f"mixture member 2 (t/other) reads the folder {(members / 'a').resolve()} that member 0 (t/a) reads; each "
        "dataset is listed once (raise its weight to sample it more)"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('{"repo_id": "t/a"}', "must be a JSON list of members, got an object"),
        ("[]", "the mixture is an empty list"),
        ('[{"repo_id": "t/a", "weight": NaN}]', "NaN is not a JSON number"),
        ("[3]", "mixture member 0 is a number, not an object"),
    ],
)
def test_mixture_json_that_is_not_a_list_of_members(value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_train_config([f"--dataset.mixture={value}"])
    assert expected in str(info.value)


def test_a_mixture_file_and_its_record(members: Path, tmp_path: Path) -> None:
    """A path works as the list does; the run records the list itself, and with --dataset.repo_id
    or --dataset.root beside it the mixture is refused."""
    listed = [{"repo_id": "t/a", "root": str(members / "a"), "weight": 2}, {"repo_id": "t/c", "root": str(members / "c"),
                                                                          "weight": 1}]
    file = tmp_path / "mixture.json"
    file.write_text(json.dumps(listed))
    config = parse_train_config([f"--dataset.mixture={file}"])
    assert config.dataset.type == "lerobot"
    recorded = config.to_json_dict()["dataset"]["mixture"]
    assert [m["repo_id"] for m in recorded] == ["t/a", "t/c"] and recorded[0]["weight"] == 2.0
    assert parse_train_config([f"--config_path={_saved(config, tmp_path)}"]).dataset.mixture == config.dataset.mixture
    for extra in ("--dataset.repo_id=t/a", f"--dataset.root={members}"):
        with pytest.raises(ConfigError, match="--dataset.mixture replaces"):
            parse_train_config([f"--dataset.mixture={file}", extra])


def _saved(config, folder: Path) -> Path:
    path = folder / "train_config.json"
    path.write_text(json.dumps(config.to_json_dict()))
    return path


def test_shares_follow_weights_or_frames(members: Path) -> None:
    by_frames = build(mixture_flags(members, {"repo_id": "t/a"}, {"repo_id": "t/c", "rename_map": {
        "observation.images.side": HIGH}}))
    np.testing.assert_allclose(by_frames.member_shares(), [21 / 31, 10 / 31])
    tempered = build([*mixture_flags(members, {"repo_id": "t/a"}, {"repo_id": "t/c", "rename_map": {
        "observation.images.side": HIGH}}), "--dataset.mixture_alpha=0"])
    np.testing.assert_allclose(tempered.member_shares(), [0.5, 0.5])
    weighted = build(mixture_flags(members, {"repo_id": "t/a", "weight": 1}, {"repo_id": "t/c", "weight": 3,
                                                                             "rename_map": {"observation.images.side": HIGH}}))
    np.testing.assert_allclose(weighted.member_shares(), [0.25, 0.75])
