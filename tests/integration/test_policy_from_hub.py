"""``--policy.path=<user>/<model>``: fine-tuning from a policy on the Hugging Face Hub, as
LeRobot users start (``--policy.path=lerobot/smolvla_base``).

The network is unreachable here, so the Hub is ``fake_hub`` (a local HTTP server answering
as the Hub does) and the client is the real ``huggingface_hub``, through ``HF_ENDPOINT``;
the runs are the installed console script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY_ACT, launch_env, run_cli, tmpfs
from fake_hub import hub_env, serve_fake_hub
from lerobot_kit.core.layout.paths import PRETRAINED_DIR, TRAIN_CONFIG


def test_a_hub_policy_is_fetched_trained_from_and_then_read_offline_from_the_cache(tmp_path: Path) -> None:
    base = tmp_path / "base"
    result = run_cli("train", f"--output_dir={base}", "--steps=1", *TINY_ACT, env=launch_env(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    pretrained = base / "checkpoints/last" / PRETRAINED_DIR
    files = {p.name: p.read_bytes() for p in pretrained.iterdir() if p.is_file()}
    # Not part of a policy, and one is code: neither is fetched.
    extras = {"README.md": b"# a model card", "modeling_evil.py": b"import os; os.system('touch /tmp/pwned')"}

    with serve_fake_hub() as hub:
        hub.models["someone/act-reach"] = {**files, **extras}
        env = launch_env(tmp_path, hub_env(tmp_path, hub.endpoint))
        first = run_cli("train", "--policy.path=someone/act-reach", f"--output_dir={tmp_path / 'a'}", "--steps=2",
                        "--log_freq=1", env=env)
        assert first.returncode == 0, first.stderr[-2000:]
        fetched = {path.rsplit("/", 1)[1] for method, path, _ in hub.requests
                   if method == "GET" and "/resolve/" in path}
        assert fetched == set(files)
        missing = run_cli("train", "--policy.path=someone/no-such-model", f"--output_dir={tmp_path / 'b'}", env=env)
        not_inspected = run_cli("inspect-checkpoint", "someone/no-such-model", env=env)

    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr
    assert missing.stderr.strip().splitlines()[-1].startswith(
        "error: --policy.path=someone/no-such-model: no such folder here, and the Hugging Face Hub did not give it "
        "(RepositoryNotFoundError"), missing.stderr
    assert not (tmp_path / "b").exists()
    assert not_inspected.returncode == 2 and not_inspected.stderr.strip().splitlines()[-1].startswith(
        "error: inspect-checkpoint someone/no-such-model: no such folder here, and the Hugging Face Hub did not "
        "give it (RepositoryNotFoundError"), not_inspected.stderr

    # The run records the snapshot folder (its path names the commit), in the Hub's cache.
    recorded = json.loads((tmp_path / "a/checkpoints/last" / PRETRAINED_DIR / TRAIN_CONFIG).read_text())
    snapshot = Path(recorded["policy"]["path"])
    assert snapshot.parent.name == "snapshots" and snapshot.name == hub.commit
    assert snapshot.is_relative_to(tmp_path / "hf_home") and (snapshot / "config.json").is_symlink()

    # The Hub gone: the cache serves the same id (here to eval, which takes hub ids too).
    offline = launch_env(tmp_path, {**hub_env(tmp_path, hub.endpoint), "HF_HUB_OFFLINE": "1"})
    evaluated = run_cli("eval", "--policy.path=someone/act-reach", "--eval.n_episodes=1",
                        f"--output_dir={tmp_path / 'eval'}", env=offline)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert json.loads((tmp_path / "eval/eval_info.json").read_text())["setup"]["policy_path"] == str(snapshot)
    # And to inspect-checkpoint: the snapshot is a policy folder, its shapes those config.json builds.
    inspected = run_cli("inspect-checkpoint", "someone/act-reach", "--json", env=offline)
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    report = json.loads(inspected.stdout)
    assert report["kind"] == "policy_folder" and report["path"] == str(snapshot), report
    assert report["loadable"]["ok"] and "its shapes as config.json builds the model" in report["loadable"]["why"]


@pytest.mark.fast
def test_a_hub_policy_that_does_not_fit_the_cache_disk_is_one_line_with_the_fix(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "size=64k") as disk, serve_fake_hub() as hub:
        hub.models["someone/big"] = {"config.json": b'{"type": "act"}', "model.safetensors": bytes(200_000)}
        env = launch_env(tmp_path, {**hub_env(tmp_path, hub.endpoint), "HF_HOME": str(disk / "hf_home")})
        result = run_cli("train", "--policy.path=someone/big", f"--output_dir={tmp_path / 'run'}", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --policy.path=someone/big: no such folder here, and the Hugging Face Hub did not give it (OSError: "
        "[Errno 28] No space left on device): free space where the Hub's cache lives ($HF_HOME/hub, or point "
        "HF_HUB_CACHE at a larger disk), or give a local checkpoint folder"), result.stderr
    assert not (tmp_path / "run").exists()
