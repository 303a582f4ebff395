"""trackio tracking, read back through trackio's own storage API.

trackio fixes its data folder (``TRACKIO_DIR``) when imported, so everything that
imports it runs in a child process pointed at a temporary folder: the user's real
trackio folder is never touched, and no test leaks its folder into another.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _dist_util import clean_env
from conftest import TINY_ACT, read_metrics, torchrun_train

# Prints, as JSON, what trackio's own API holds for a project: runs, their configs and logs.
READ_BACK = """
def read_back(project):
    import trackio
    from trackio.sqlite_storage import SQLiteStorage
    runs = list(trackio.Api().runs(project))
    return [{"name": r.name, "config": r.config, "logs": SQLiteStorage.get_logs(project, r.name, run_id=r.id)}
            for r in runs]
"""


def _python(code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


# ------------------------------------------------------------------ a real 2-process job


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> tuple[Path, list[dict], subprocess.CompletedProcess[str]]:
    """The run folder, what trackio holds for the project afterwards, and the job's output."""
    tmp = tmp_path_factory.mktemp("ddp_trackio")
    out, trackio_dir = tmp / "run", tmp / "trackio"
    proc = torchrun_train(
        2, "--trackio.enable=true", "--trackio.project=kit-tests", "--job_name=ddp-job", f"--output_dir={out}",
        "--steps=4", "--log_freq=2", *TINY_ACT, "--eval_freq=4", "--eval.n_episodes=2", "--eval.max_episodes_rendered=0",
        "--env.episode_length=10", "--accelerator.peak_tflops=1", workdir=tmp,
        env={"TRACKIO_DIR": str(trackio_dir)}, timeout=180,
    )
    code = READ_BACK + "import json; print(json.dumps(read_back('kit-tests')))"
    runs = json.loads(_python(code, {**os.environ, "TRACKIO_DIR": str(trackio_dir)}).stdout.splitlines()[-1])
    return out, runs, proc


def test_two_process_job_is_one_trackio_run_with_the_logged_metrics(ddp_run):
    out, runs, proc = ddp_run
    assert [run["name"] for run in runs] == ["ddp-job"]
    logs = runs[0]["logs"]
    written = read_metrics(out)
    assert [row["step"] for row in logs] == [row["step"] for row in written] == [2, 4, 4]  # the last: evaluation
    for tracked, row in zip(logs, written):
        assert {k: v for k, v in tracked.items() if k not in ("step", "timestamp")} == {
            k: v for k, v in row.items() if k != "step"
        }
    assert {"loss", "lr", "grad_norm", "samples_per_s"} <= set(logs[0])
    assert {"eval/pc_success", "eval/avg_sum_reward", "eval/avg_max_reward", "eval/n_episodes"} <= set(logs[2])
    # The main process announced the run once; the other rank stayed silent.
    assert (proc.stdout + proc.stderr).count("trackio: project kit-tests | run ddp-job") == 1


def test_rows_carry_model_tflops_per_device_and_mfu_over_the_given_peak(ddp_run):
    """MFU (``core.run.reporting.mfu``), checked on this job's rows rather than on a run of its own: two
    processes share out the throughput, and a given peak puts ``mfu`` in every training row."""
    out, _, proc = ddp_run
    banner = re.search(r"model FLOPs ([0-9.]+) ([KMG])FLOP per sample \(forward and backward\) \| peak 1 TFLOP/s "
                       r"per device \(--accelerator.peak_tflops\)", proc.stderr)
    assert banner, proc.stderr[-3000:]
    flops_per_sample = float(banner.group(1)) * {"K": 1e3, "M": 1e6, "G": 1e9}[banner.group(2)]  # 3 digits, as printed
    training = [row for row in read_metrics(out) if "loss" in row]
    assert len(training) == 2
    for row in training:
        # The two processes share the whole run's samples/s; a peak of 1 TFLOP/s makes mfu the same number.
        assert row["model_tflops"] == pytest.approx(flops_per_sample * row["samples_per_s"] / 2 / 1e12, rel=0.01)
        assert row["mfu"] == row["model_tflops"]
    lines = [line for line in proc.stderr.splitlines() if " | samples/s " in line]
    figures = re.compile(r" \| model_tflops [0-9.e-]+ \| mfu [0-9.e-]+% \| ")
    assert len(lines) == 2 and all(figures.search(line) for line in lines)


def test_the_run_config_is_logged_once_with_the_run(ddp_run):
    out, [run], _ = ddp_run
    config = {k: v for k, v in run["config"].items() if not k.startswith("_")}  # trackio adds _Created etc.
    # The whole config, as the checkpoint records it.
    assert config == json.loads((out / "checkpoints" / "last" / "pretrained_model" / "train_config.json").read_text())
    assert config["job_name"] == "ddp-job" and config["steps"] == 4 and config["output_dir"] == str(out)
    assert config["policy"]["dim_model"] == 32 and config["trackio"] == {"enable": True, "project": "kit-tests"}


# ------------------------------------------------------------------ one process, without torchrun


def test_disabled_tracking_never_imports_trackio(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys
        import torch
        from pathlib import Path
        from lerobot_kit.core.config.schema import TrainConfig
        from lerobot_kit.core.distributed.process_group import DistContext
        import lerobot_kit.core.run.prepare
        from lerobot_kit.core.parallel.dims import ParallelDims
        from lerobot_kit.core.run.spec import RunSpec
        from lerobot_kit.core.run.reporting.tracking import make_tracker
        spec = RunSpec(TrainConfig(), ParallelDims(1, 1, 1), Path("x"), None, None)
        tracker = make_tracker(spec, DistContext(0, 0, 1, torch.device("cpu"), "single", None))
        tracker.log({{"loss": 1.0}}, 1)
        tracker.finish()
        print(type(tracker).__name__, "trackio" in sys.modules)
        """
    )
    proc = _python(code, {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")})
    assert proc.stdout.split() == ["NullTracker", "False"]
    assert not (tmp_path / "trackio").exists()


# A token in the environment would make trackio ask the Hub who the user is: every name
# lookup and connection the process attempts is recorded through Python's audit hooks.
SCENARIOS = READ_BACK + textwrap.dedent(
    """
    import json, sys
    attempts = []
    sys.addaudithook(lambda event, args: attempts.append(f"{event} {args[:2]!r}")
                     if event in ("socket.getaddrinfo", "socket.connect") else None)

    import torch
    from huggingface_hub import constants
    from lerobot_kit.core.config.schema import TrainConfig
    from lerobot_kit.core.distributed.process_group import DistContext
    from lerobot_kit.core.errors import ConfigError
    from lerobot_kit.core.parallel.dims import ParallelDims
    from lerobot_kit.core.run.spec import RunSpec
    from lerobot_kit.core.run.reporting.tracking import make_tracker

    ctx = DistContext(0, 0, 1, torch.device("cpu"), "single", None)

    def spec(config, resume=False):
        return RunSpec(config, ParallelDims(1, 1, 1), OUT, OUT / "checkpoints" / "000004" if resume else None, None)

    def train(name, steps, resume):
        config = TrainConfig(job_name=name, trackio={"enable": True, "project": "p"})
        tracker = make_tracker(spec(config, resume), ctx)
        for step in steps:
            tracker.log({"loss": 1.0 / step, "step": step}, step)
        tracker.finish()

    train("first", [2, 4], resume=False)
    train("first", [6], resume=True)  # --resume=true continues the run
    train(None, [2], resume=False)  # unnamed job: the output folder names the run
    try:
        make_tracker(spec(TrainConfig(trackio={"enable": True, "project": "registry-x"})), ctx)
        refused = None
    except ConfigError as exc:
        refused = str(exc)
    print(json.dumps({"runs": read_back("p"), "attempts": attempts, "refused": refused,
                      "hub_offline_after": constants.HF_HUB_OFFLINE}))
    """
)


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("trackio_scenarios")
    env = {**clean_env(tmp), "TRACKIO_DIR": str(tmp / "trackio"), "HF_TOKEN": "hf_not_a_real_token"}
    env.pop("HF_HUB_OFFLINE", None)
    code = f"from pathlib import Path\nOUT = Path({str(tmp / '2026-01-01' / 'out_folder')!r})\n" + SCENARIOS
    return json.loads(_python(code, env).stdout.splitlines()[-1])


def test_logging_stays_local_and_off_the_network(scenarios):
    assert scenarios["attempts"] == []
    assert scenarios["hub_offline_after"] is False  # the end-of-run push may still reach the Hub


def test_resume_continues_the_run_and_the_output_folder_names_unnamed_jobs(scenarios):
    runs = {run["name"]: [(row["step"], row["loss"]) for row in run["logs"]] for run in scenarios["runs"]}
    assert runs == {"first": [(2, 0.5), (4, 0.25), (6, 1 / 6)], "out_folder": [(2, 0.5)]}
    assert all("__step" not in row for run in scenarios["runs"] for row in run["logs"])  # not a metric


def test_a_refused_project_is_one_config_error(scenarios):
    assert scenarios["refused"].startswith("--trackio.project=registry-x: trackio could not start run")
    assert "--trackio.enable=false" in scenarios["refused"]
