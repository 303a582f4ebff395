"""Everything a run or ``convert-dcp`` sends to the Hugging Face Hub: the upload of a
``pretrained_model/`` folder (``push_pretrained_dir``, the public entry) and the trainer's
end-of-run push.

Fetching a policy from the Hub (``--policy.path=<user>/<model>``) is not here: config,
model, evaluation and the checkpoint checks all read it, so it sits at the bottom, in
``core.layout.hub_snapshot``.
"""

from lerobot_kit.core.run.publishing.hub_upload import PUSH_IGNORE_PATTERNS, push_pretrained_dir

__all__ = ["PUSH_IGNORE_PATTERNS", "push_pretrained_dir"]
