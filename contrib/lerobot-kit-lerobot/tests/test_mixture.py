"""Mixtures of LeRobot datasets (``--dataset.mixture``) with the bridge's policies.

In one process, on LeRobot's classes at reduced sizes: a sample's missing camera is what
LeRobot makes of a camera the whole batch lacks, whatever its placeholder holds; each
sample's loss is LeRobot's ``reduction="none"`` (π0, π0.5, SmolVLA) or the same reduction of
ACT's and Diffusion's own tensors, and the batch's loss their mean; LeRobot's pipelines
hand the mixture's keys to the policy. Through the console script, under FSDP(2): π0, π0.5
and SmolVLA on two robots that differ in cameras and widths, ACT and Diffusion on two
recordings of one layout under other camera names, fps and tasks; each checkpoint is then
used by LeRobot alone, and each run logs every member's samples and loss. ACT and Diffusion
refuse, in one line, a member without a camera or with narrower vectors.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot.datasets.lerobot_dataset import LeRobotDataset

from conftest import TINY_ACT, TINY_DIFFUSION, run, tiny_pi, tiny_smolvla
from lerobot_dataset_factory import write_lerobot_dataset
from lerobot_kit.api import (MEMBER_KEY, PER_SAMPLE_LOSS, ConfigError, DatasetMeta, FeatureSpec, build_dataset,
                             missing_key, parse_train_config)
from lerobot_kit_lerobot import camera_masks
from lerobot_kit_lerobot.vla_loss import flow_matching_loss
from lerobot_side import act_on, load_with_lerobot
from mixture_datasets import write_member
from test_vla_joint import BATCH, TOP, batch, lerobot_policy

WRIST = "observation.images.wrist"
FRONT = "observation.images.front"
# The members' task texts (LeRobot's dataset class reads the test writer's as indices).
TASKS = {"lab/a": "pick the cube", "lab/b": "stack the blocks", "lab/c": "pick the cube", "lab/d": "stack the blocks"}


@pytest.mark.parametrize("kind", ["pi0", "pi05", "smolvla"])
def test_a_samples_missing_camera_is_lerobots_empty_camera(kind: str, vla_assets: Path) -> None:
    """Samples flagged missing get what LeRobot's own forward gives them without the
    camera (π0/π0.5: its -1 image, masked; SmolVLA: no image), the others what it gives them
    with it, whether the placeholder is black or noise; the loss is the per-sample losses'
    mean (SmolVLA: weighted by each sample's valid action entries)."""
    policy = lerobot_policy(kind, vla_assets, cameras=(TOP, WRIST))
    full = batch(cameras=(TOP, WRIST))
    torch.manual_seed(7)  # the same noise and time for every forward
    with_camera, _ = policy.forward(full, reduction="none")
    torch.manual_seed(7)
    without_camera, _ = policy.forward({k: v for k, v in full.items() if k != WRIST}, reduction="none")
    assert not torch.allclose(with_camera, without_camera, rtol=1e-3)  # the camera matters

    camera_masks.install(policy)
    missing = torch.tensor([True, False, True])
    noise = {**full, missing_key(WRIST): missing}  # the flagged samples' wrist frames: random, not black
    black = {**noise, WRIST: full[WRIST].masked_fill(missing.view(-1, 1, 1, 1), 0.0)}
    results = []
    for flagged in (noise, black):
        torch.manual_seed(7)
        results.append(flow_matching_loss(policy, flagged))
    (loss, per_sample), (black_loss, black_per_sample) = results
    torch.testing.assert_close(per_sample, torch.where(missing, without_camera, with_camera), rtol=1e-5, atol=1e-6)
    assert torch.equal(black_per_sample, per_sample) and torch.equal(black_loss, loss)
    valid = (~full["action_is_pad"]).sum(1) if kind == "smolvla" else torch.ones(BATCH)
    torch.testing.assert_close(loss, (per_sample * valid).sum() / valid.sum())


def meta(cameras: tuple[str, ...] = (TOP,), state: int = 3, action: int = 3) -> DatasetMeta:
    """A dataset description with LeRobot-style stats (quantiles too, for π0.5)."""
    def stats(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        return {name: np.full(shape, value, np.float32) for name, value in
                (("mean", 0.0), ("std", 1.0), ("min", -1.0), ("max", 1.0), ("q01", -1.0), ("q99", 1.0))}

    features = {**{camera: FeatureSpec("image", (3, 48, 64)) for camera in cameras},
                "observation.state": FeatureSpec("float32", (state,)), "action": FeatureSpec("float32", (action,))}
    return DatasetMeta(features=features, stats={key: stats((3, 1, 1) if spec.is_image else spec.shape)
                                                  for key, spec in features.items()},
                       fps=10, num_episodes=2, num_frames=40)


ACT = {"pretrained_backbone_weights": None, "dim_model": 32, "n_heads": 2, "dim_feedforward": 64,
       "n_encoder_layers": 1, "n_decoder_layers": 1, "n_vae_encoder_layers": 1, "latent_dim": 8, "chunk_size": 4,
       "n_action_steps": 4, "dropout": 0.0}
DIFFUSION = {"pretrained_backbone_weights": None, "horizon": 8, "n_action_steps": 4, "down_dims": (16, 32),
             "kernel_size": 3, "n_groups": 4, "diffusion_step_embed_dim": 16, "spatial_softmax_num_keypoints": 8,
             "use_group_norm": True, "crop_shape": (40, 56), "drop_n_last_frames": 0}


def training_batch(chunk: int, observation_steps: int | None = None) -> dict[str, torch.Tensor]:
    """Normalised inputs (with ``observation_steps`` frames each, else one) and a padded chunk."""
    gen = torch.Generator().manual_seed(2)
    frames = () if observation_steps is None else (observation_steps,)
    pad = torch.zeros(BATCH, chunk, dtype=torch.bool)
    pad[1, chunk // 2:] = True
    return {TOP: torch.rand(BATCH, *frames, 3, 48, 64, generator=gen),
            "observation.state": torch.randn(BATCH, *frames, 3, generator=gen),
            "action": torch.randn(BATCH, chunk, 3, generator=gen), "action_is_pad": pad}


@pytest.mark.parametrize(("kind", "flags"), [("act", {**ACT, "use_vae": False}), ("act", ACT),
                                             ("diffusion", {**DIFFUSION, "prediction_type": "sample"}),
                                             ("diffusion", {**DIFFUSION, "do_mask_loss_for_padding": True})])
def test_act_and_diffusion_report_each_samples_loss(kind: str, flags: dict) -> None:
    """From the tensors LeRobot's own forward computes: the loss is the per-sample losses' mean,
    weighted by valid action entries where LeRobot masks padding (with ACT's VAE, whose KL
    term is a plain mean, on a batch without padding); without the VAE's random latent,
    ACT's sample loss is its loss in a batch of its own."""
    from lerobot_kit_lerobot.configuration import CONFIG_CLASSES
    from lerobot_kit_lerobot.modeling import LerobotACT, LerobotDiffusion

    torch.manual_seed(0)
    policy = {"act": LerobotACT, "diffusion": LerobotDiffusion}[kind](CONFIG_CLASSES[kind](**flags), meta()).train()
    config = policy.lerobot_config
    data = training_batch(4) if kind == "act" else training_batch(8, config.n_obs_steps)
    if kind == "act" and config.use_vae:
        data["action_is_pad"][:] = False
    loss, metrics = policy(data)
    per_sample = metrics[PER_SAMPLE_LOSS]
    assert per_sample.shape == (BATCH,) and not per_sample.requires_grad
    masked = kind == "act" or config.do_mask_loss_for_padding
    valid = (~data["action_is_pad"]).sum(1).float() if masked else torch.ones(BATCH)
    torch.testing.assert_close(loss.detach(), (per_sample * valid).sum() / valid.sum())
    if kind == "act" and not config.use_vae:
        alone = [policy({key: value[i:i + 1] for key, value in data.items()})[0] for i in range(BATCH)]
        torch.testing.assert_close(torch.stack(alone).detach(), per_sample)


def test_the_pipeline_hands_the_mixtures_keys_to_the_policy(vla_assets: Path) -> None:
    """π0.5's preprocessor (LeRobot's pipeline: normalising, state prompt, tokenizer) passes
    each sample's member and missing-camera flags to the batch the policy sees; LeRobot's
    pipeline alone keeps the flags (observations) but drops the member."""
    from lerobot_kit_lerobot.configuration import CONFIG_CLASSES
    from lerobot_kit_lerobot.modeling import LerobotPI05

    config = CONFIG_CLASSES["pi05"](tokenizer_name=str(vla_assets / "tokenizer"), tokenizer_max_length=24)
    preprocessor, _ = LerobotPI05.make_processors(config, meta(cameras=(TOP, WRIST), state=6))
    raw = {**training_batch(4), WRIST: torch.zeros(BATCH, 3, 48, 64), "observation.state": torch.randn(BATCH, 6),
           "task": ["pick the cube"] * BATCH, MEMBER_KEY: torch.tensor([0, 1, 0]),
           missing_key(WRIST): torch.tensor([False, True, False]), "index": torch.arange(BATCH),
           "epoch": torch.zeros(BATCH, dtype=torch.int64)}
    seen = preprocessor(raw)
    assert MEMBER_KEY not in preprocessor.pipeline(raw)
    assert "observation.language.tokens" in seen  # LeRobot's pipeline ran
    assert torch.equal(seen[MEMBER_KEY], raw[MEMBER_KEY])
    assert torch.equal(seen[missing_key(WRIST)], raw[missing_key(WRIST)])


@pytest.fixture(scope="session")
def two_robots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mixture file over two robots: ``lab/a`` with cameras top and wrist, a 4-wide state and
    2-wide action; ``lab/b`` with the wrist camera only, 6 and 3 wide."""
    root = tmp_path_factory.mktemp("two_robots")
    write_lerobot_dataset(root / "a", [12, 10], image=True, video=True, tasks=(TASKS["lab/a"],))
    write_member(root / "b", [11, 9], camera="wrist", seed=1, state_extra=2, action_extra=1,
                 tasks=(TASKS["lab/b"],))
    return mixture_file(root, ["lab/a", "lab/b"])


@pytest.fixture(scope="session")
def renamed_cameras(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mixture file over two recordings of one robot layout (one camera of one size, a 4-wide
    state and 2-wide action) that differ in all else: ``lab/c`` films with ``front`` at 10 fps,
    ``lab/d`` with ``cam_high`` at 15 fps, mapped onto ``front`` by its rename_map, on
    another task."""
    root = tmp_path_factory.mktemp("renamed_cameras")
    write_member(root / "c", [12, 10], camera="front", seed=2, tasks=(TASKS["lab/c"],))
    write_member(root / "d", [14], camera="cam_high", fps=15, seed=3, tasks=(TASKS["lab/d"],))
    return mixture_file(root, ["lab/c", "lab/d"], {"lab/d": {"observation.images.cam_high": FRONT}})


def mixture_file(root: Path, repo_ids: list[str], rename_maps: dict[str, dict[str, str]] | None = None) -> Path:
    file = root / "mixture.json"
    members = [{"repo_id": repo_id, "root": str(root / repo_id.split("/")[1])} for repo_id in repo_ids]
    for member in members:
        if member["repo_id"] in (rename_maps or {}):
            member["rename_map"] = rename_maps[member["repo_id"]]
    file.write_text(json.dumps(members))
    return file


def member_rows(output_dir: Path, names: list[str], batch_size: int) -> list[dict]:
    """The run's metrics rows, checked to count every member's samples (adding up to the
    global batch) and to give a finite loss for each member with samples."""
    rows = [json.loads(line) for line in (output_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "loss" in row]
    for row in rows:
        counts = {name: row[f"member/{name}/samples"] for name in names}
        assert sum(counts.values()) == batch_size, row
        for name, count in counts.items():
            assert (f"member/{name}/loss" in row) == (count > 0), row
            assert count == 0 or math.isfinite(row[f"member/{name}/loss"]), row
        assert math.isfinite(row["loss"]), row
    return rows


def member_observation(member: dict, index: int) -> dict[str, object]:
    """A member's frame as LeRobot's dataset class reads it, its cameras under the policy's
    names (the member's rename_map), with its task text: what a robot of that member hands
    LeRobot's inference path. The text is given by hand: LeRobot reads the test writer's
    meta/tasks.parquet as task indices."""
    frame = LeRobotDataset(member["repo_id"], root=member["root"], video_backend="pyav")[index]
    rename = member.get("rename_map", {})
    return {**{rename.get(key, key): value for key, value in frame.items() if key.startswith("observation.")},
            "task": TASKS[member["repo_id"]]}


VLAS = ("pi05", "pi0", "smolvla")
MIXTURE_STEPS = 2
# ACT and Diffusion at the tests' sizes, Diffusion's crop fitting the members' 16-pixel frames.
MIXTURE_FLAGS: dict[str, Callable[[Path], list[str]]] = {
    "pi05": tiny_pi,
    "pi0": functools.partial(tiny_pi, lerobot_type="pi0"),
    "smolvla": tiny_smolvla,
    "act": lambda _: TINY_ACT,
    "diffusion": lambda _: [*(flag for flag in TINY_DIFFUSION if not flag.startswith("--policy.crop_shape=")),
                            "--policy.crop_shape=[14,14]"],
}
LEROBOT_CLASSES = {"pi05": "PI05Policy", "pi0": "PI0Policy", "smolvla": "SmolVLAPolicy", "act": "ACTPolicy",
                   "diffusion": "DiffusionPolicy"}


@pytest.mark.parametrize("kind", [*VLAS, "act", "diffusion"])
def test_trains_under_fsdp2_on_a_mixture_and_lerobot_loads_it_and_acts(
    kind: str, work: Path, two_robots: Path, renamed_cameras: Path, vla_assets: Path
) -> None:
    """π0, π0.5 and SmolVLA on two robots: ``lab/b`` lacks the top camera (masked in its
    samples) and has wider vectors (``lab/a``'s zero-padded); the checkpoint is LeRobot's
    policy over the union (both cameras, the widest vectors), which acts on ``lab/b``'s
    observation through LeRobot's own missing-camera path. ACT and Diffusion, which need
    every camera and one width, on one layout recorded under other camera names, fps and
    tasks: their checkpoint has the policy's camera name, and acts on ``lab/d``'s
    observation under it. Every run logs each member's samples and loss."""
    mixture = two_robots if kind in VLAS else renamed_cameras
    members = json.loads(mixture.read_text())
    names = [member["repo_id"] for member in members]
    out = work / f"{kind}_mixture_fsdp2"
    result = run(["train", f"--dataset.mixture={mixture}", "--num_workers=0", *MIXTURE_FLAGS[kind](vla_assets),
                  "--parallelism.dp_shard=2", "--batch_size=4", f"--steps={MIXTURE_STEPS}", "--log_freq=1",
                  "--optimizer.lr=3e-3", f"--output_dir={out}"], work, nproc=2)
    assert "layout fsdp" in result.stderr and "mixture of 2 members" in result.stderr, result.stderr
    rows = member_rows(out, names, batch_size=8)
    assert len(rows) == MIXTURE_STEPS
    assert all(sum(row[f"member/{name}/samples"] for row in rows) > 0 for name in names)

    pretrained = out / "checkpoints" / f"{MIXTURE_STEPS:06d}" / "pretrained_model"
    policy, preprocessor, postprocessor = load_with_lerobot(pretrained, kind)
    assert type(policy).__name__ == LEROBOT_CLASSES[kind]
    cameras, state, action = ([TOP, WRIST], 6, 3) if kind in VLAS else ([FRONT], 4, 2)
    assert list(policy.config.image_features) == cameras
    assert policy.config.input_features["observation.state"].shape == (state,)
    assert policy.config.output_features["action"].shape == (action,)
    observed = member_observation(members[1], 3)
    assert set(cameras) - set(observed) == ({TOP} if kind in VLAS else set())
    acted = act_on(policy, preprocessor, postprocessor, observed)
    assert acted.shape == (1, action) and acted.isfinite().all()
    if kind in VLAS:
        assert_masked_placeholder_is_lerobots_missing_camera(policy, preprocessor, observed)


def assert_masked_placeholder_is_lerobots_missing_camera(policy: torch.nn.Module, preprocessor: Callable,
                                                         observed: dict) -> None:
    """With the bridge's masks, LeRobot's VLA gives an observation whose top camera is a
    flagged placeholder (noise here) the actions it gives without that camera; without the
    masks the noise would be a camera image."""
    flagged = {**observed, TOP: torch.rand(3, *observed[WRIST].shape[-2:]), missing_key(TOP): torch.tensor(True)}
    chunks = []
    for masks, raw in ((False, observed), (False, flagged), (True, flagged)):
        if masks:
            camera_masks.install(policy)
        torch.manual_seed(0)
        with torch.no_grad():
            chunks.append(policy.predict_action_chunk(preprocessor(raw)))
    lerobots, unmasked, masked = chunks
    assert not torch.allclose(unmasked, lerobots, rtol=1e-3)
    torch.testing.assert_close(masked, lerobots, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["act", "diffusion"])
def test_act_and_diffusion_refuse_a_member_without_a_camera_or_with_narrower_vectors(
    kind: str, two_robots: Path, renamed_cameras: Path
) -> None:
    """The bridge's ACT and Diffusion declare neither missing cameras nor padding: the mixture
    is refused before anything is built, in one line naming the member."""
    def refusal(*members: dict) -> str:
        config = parse_train_config([f"--policy.type=lerobot_{kind}", f"--dataset.mixture={json.dumps(members)}"])
        with pytest.raises(ConfigError) as refused:
            build_dataset(config)
        return str(refused.value)

    a, b = json.loads(two_robots.read_text())
    c = json.loads(renamed_cameras.read_text())[0]
    assert refusal(a, b) == (
        "mixture member lab/b has no camera 'observation.images.top', which other members have, and "
        f"policy.type=lerobot_{kind} needs every camera in every sample: map one of its cameras onto it with "
        '"rename_map", leave the camera out of the other members, or train a policy that accepts missing cameras '
        "(lerobot_pi0, lerobot_pi05, lerobot_smolvla)")
    assert refusal(b, {**c, "rename_map": {FRONT: WRIST}}) == (
        "mixture members differ in the width of 'observation.state' (lab/b: 6, lab/c: 4), and "
        f"policy.type=lerobot_{kind} does not pad vectors: mix datasets of one robot layout, or train a policy that "
        "pads them (lerobot_pi0, lerobot_pi05, lerobot_smolvla)")
