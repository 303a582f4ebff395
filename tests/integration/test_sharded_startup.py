"""Sharded start-up: the main process builds the model, the others never hold all of it.

A 124 MB ACT is started as `lerobot train` starts it (``prepare_run``) on three FSDP
ranks, and each rank reports the growth of its peak resident memory (the kernel's count)
over start-up. A full copy of the model on another rank, however briefly, would show
there. Three ranks, because a non-main rank's start-up peaks at about twice its shard
(measured): with two ranks that is the size of the whole model, and a full copy could
not be told apart from it; with three it is 2/3.
"""

from __future__ import annotations

from pathlib import Path

from _dist_util import run_ranks

PROBE = Path(__file__).resolve().parents[1] / "probes" / "startup_memory.py"
# 31M parameters: a model much larger than everything else a rank allocates at start-up.
LARGE_ACT = ["--policy.dim_model=512", "--policy.dim_feedforward=3200", "--policy.n_encoder_layers=4", "--policy.chunk_size=10",
             "--policy.n_action_steps=10", "--dataset.num_episodes=2", "--dataset.episode_length=20",
             "--batch_size=2", "--parallelism.dp_shard=3", "--save_checkpoint=false", "--num_workers=0"]


def test_no_rank_but_the_main_one_ever_holds_the_whole_model(tmp_path: Path) -> None:
    main, *others = run_ranks([str(PROBE), str(tmp_path), f"--output_dir={tmp_path / 'run'}", *LARGE_ACT], 3,
                              tmp_path, timeout=300)
    model = main["model_bytes"]
    assert model > 100e6 and all(r["model_bytes"] == model and r["all_sharded"] for r in [main, *others])
    # The main process built the whole model (the measure sees a full copy when there is one) ...
    assert main["after"] - main["before"] >= model, main
    # ... the others built it on the meta device and received only their third.
    for other in others:
        assert model / 3 <= other["after"] - other["before"] < model, other
