"""Publishing a ``pretrained_model/`` folder as a Hugging Face Hub model repo.

Shared by ``convert-dcp --push_to_hub`` and the trainer's end-of-run push. The upload
runs after the files are safely on disk, so a failed push (no network, no token, no
permission) never costs the local checkpoint: it becomes one error line saying so.
``huggingface_hub`` is an optional extra, imported only here and only when pushing.
"""

from __future__ import annotations

from pathlib import Path

from lerobot_kit.core.errors import ConfigError, LerobotError, first_line
from lerobot_kit.core.layout.paths import DCP_MODEL_DIR, TMP_SUFFIX

# DCP shards are a training artefact (reloadable only with torch.distributed.checkpoint
# and the same key layout); a published model carries the merged safetensors instead.
PUSH_IGNORE_PATTERNS = [f"{DCP_MODEL_DIR}/*", f"*{TMP_SUFFIX}"]


def push_pretrained_dir(pretrained_dir: Path, repo_id: str, private: bool) -> str:
    """Create ``repo_id`` if needed and upload the folder without its DCP shards.

    Returns the URL of the commit. Raises LerobotError (one line) when huggingface_hub is
    missing or the Hub refuses or cannot be reached.
    """
    pretrained_dir = Path(pretrained_dir)
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ConfigError(f"--push_to_hub={repo_id}: expected a repo id of the form user/name")
    try:
        from huggingface_hub import HfApi
    except ImportError as exc:
        raise LerobotError(
            "pushing to the Hugging Face Hub needs huggingface_hub: pip install 'lerobot-kit[hub]'"
        ) from exc

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(pretrained_dir),
            repo_id=repo_id,
            repo_type="model",
            ignore_patterns=PUSH_IGNORE_PATTERNS,
            commit_message=f"Upload {pretrained_dir.resolve().parent.name}/{pretrained_dir.name} with lerobot-kit",
        )
    except Exception as exc:  # network, auth and HTTP errors all mean "not published"
        raise LerobotError(
            f"push of {pretrained_dir} to the Hub repo {repo_id} failed ({type(exc).__name__}: {first_line(exc)}); "
            "the local files are intact, retry when the Hub is reachable and `hf auth login` has a write token"
        ) from exc
    return str(commit.commit_url)
