"""End-of-run push of the final ``pretrained_model/``, from real training runs.

The network is unreachable here, so the remote end is ``fake_hub``: a local HTTP server
answering as the Hub does, which the real ``huggingface_hub`` client talks to through
``HF_ENDPOINT``. Training runs are the installed console script, as a user runs it.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from _dist_util import clean_env
from conftest import TINY_ACT, run_cli, torchrun_train
from fake_hub import hub_env, serve_fake_hub
from lerobot_kit.core.layout.paths import DCP_MODEL_DIR, MODEL_WEIGHTS, PRETRAINED_DIR


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_fsdp_run_pushes_exactly_the_final_pretrained_model(tmp_path):
    out = tmp_path / "run"
    with serve_fake_hub() as hub:
        proc = torchrun_train(
            2, f"--output_dir={out}", "--steps=4", "--log_freq=2", "--save_freq=2", *TINY_ACT,
            "--parallelism.dp_shard=2", "--checkpoint_format=safetensors_dcp",
            "--policy.repo_id=user/tiny-act", "--policy.private=true",
            workdir=tmp_path, env=hub_env(tmp_path, hub.endpoint), timeout=180,
        )

    final = out / "checkpoints" / "000004" / PRETRAINED_DIR
    on_disk = _files(final)
    shards = {name for name in on_disk if name.startswith(DCP_MODEL_DIR + "/")}
    assert shards and MODEL_WEIGHTS in on_disk  # the checkpoint has both, the Hub gets one
    assert hub.uploaded("user/tiny-act") == {name: data for name, data in on_disk.items() if name not in shards}
    assert len(hub.commits("user/tiny-act")) == 1  # once, from the main process, of the final step only
    created = hub.created_repo()
    assert (created["organization"], created["name"], created["visibility"]) == ("user", "tiny-act", "private")
    assert "pushed" in proc.stderr and "user/tiny-act" in proc.stderr
    assert _files(final) == on_disk and (out / "checkpoints" / "000002").is_dir()


def test_a_refused_push_warns_once_and_keeps_the_checkpoint(tmp_path):
    """The Hub refuses the commit (a token without write access): the push was really
    attempted with the final model's files, the run still succeeds with one warning, and
    the files on disk are exactly those it tried to upload."""
    out = tmp_path / "run"
    with serve_fake_hub(refuse_commits=True) as hub:
        proc = run_cli("train", f"--output_dir={out}", "--steps=2", "--log_freq=2", *TINY_ACT,
                       "--policy.repo_id=user/tiny", env={**clean_env(tmp_path), **hub_env(tmp_path, hub.endpoint)})

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 1, proc.stderr
    assert "final model not pushed to the Hub" in warnings[0] and "local files are intact" in warnings[0]
    pretrained = out / "checkpoints" / "000002" / PRETRAINED_DIR
    assert f"hf upload user/tiny {pretrained}" in warnings[0]
    assert len(hub.commits("user/tiny")) == 1
    attempted = hub.uploaded("user/tiny")
    assert MODEL_WEIGHTS in attempted and attempted == _files(pretrained)
    assert load_file(pretrained / MODEL_WEIGHTS) and (out / "checkpoints" / "last").resolve() == pretrained.parent
    inspected = run_cli("inspect-checkpoint", str(pretrained.parent))
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
