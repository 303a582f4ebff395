"""Which LeRobot policies can be built here without downloading anything: the evidence
behind the status table in the README.

For every policy type LeRobot registers, a child process (offline, memory-capped, with
a time limit) builds what a training run needs — LeRobot's pre/post processors from
the dataset's stats, then the policy with LeRobot's ``make_policy`` — for the toy video
dataset, and reports the parameter count or the first line of the error:

    python tools/survey_policies.py /tmp/survey
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toy_dataset import make_dataset  # noqa: E402 - tools/ is not a package

REPO_ID = "survey/reach"
MEMORY_CAP = 8 * 2**30
TIME_LIMIT_S = 300
BUILD = """
import json, sys
from lerobot.configs.policies import PreTrainedConfig
from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
from lerobot.policies import ACTConfig
from lerobot.policies.factory import make_policy, make_pre_post_processors
name, root = sys.argv[1], sys.argv[2]
meta = LeRobotDatasetMetadata("survey/reach", root=root)
config = PreTrainedConfig.get_choice_class(name)(device="cpu")
if hasattr(config, "pretrained_backbone_weights"):
    config.pretrained_backbone_weights = None
policy = make_policy(config, ds_meta=meta)
make_pre_post_processors(config, dataset_stats=meta.stats)
print(json.dumps({"parameters": sum(p.numel() for p in policy.parameters())}))
"""


def cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def survey(name: str, root: Path) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(root.parent / "hf")}
    try:
        result = subprocess.run([sys.executable, "-c", BUILD, name, str(root)], capture_output=True, text=True,
                                timeout=TIME_LIMIT_S, env=env, preexec_fn=cap_memory)
    except subprocess.TimeoutExpired:
        return f"not built within {TIME_LIMIT_S} s"
    if result.returncode == 0:
        parameters = json.loads(result.stdout.strip().splitlines()[-1])["parameters"]
        return f"builds offline, {parameters / 1e6:.1f} M parameters"
    errors = [line for line in result.stderr.splitlines() if line and not line.startswith((" ", "Traceback"))]
    return "fails: " + (errors[-1] if errors else f"exit {result.returncode}")[:200]


def main() -> None:
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies import ACTConfig  # noqa: F401 - registers every policy type

    workdir = Path(sys.argv[1])
    root = workdir / "data"
    if not (root / "meta" / "info.json").is_file():
        make_dataset(root, REPO_ID, episodes=2, length=20, image_hw=(96, 128))
    for name in sorted(PreTrainedConfig.get_known_choices()):
        print(f"| {name} | {survey(name, root)} |", flush=True)


if __name__ == "__main__":
    main()
