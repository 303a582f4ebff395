"""``lerobot-train``'s flags that lerobot-kit does not take, and what does their job here.

LeRobot users arrive with LeRobot's commands (``--policy.device=cuda --wandb.enable=true``).
A bare "unknown flag", or a suggestion that only looks alike (``--policy.use_amp``: "did
you mean --policy.use_vae?"), leaves them guessing; the flag's line says instead what
lerobot-kit does in its place. Keys are dotted flag paths; a key also covers its sub-flags.
"""

from __future__ import annotations

_REMOVE = "remove it"
_HELD_OUT = f"lerobot-kit evaluates in an environment (--eval_freq), not on held-out batches; {_REMOVE}"
_LOADER = (
    f"lerobot-kit's DataLoader keeps its workers and prefetches 2 batches each; --num_workers sets how many; {_REMOVE}"
)
INSTEAD: dict[str, str] = {
    "policy.device": "each rank runs on its launcher's device (cuda:LOCAL_RANK where CUDA is present, else cpu); "
    "remove it (CUDA_VISIBLE_DEVICES= runs on cpu)",
    "policy.use_amp": "use --accelerator.mixed_precision=bf16 (or fp16)",
    "policy.use_peft": "use --peft.method_type=LORA",
    "policy.pretrained_path": "use --policy.path (a checkpoint folder or a Hub id)",
    "wandb": "lerobot-kit logs to trackio (--trackio.enable=true --trackio.project=NAME), and always to "
    "<output_dir>/logs/metrics.jsonl",
    "use_policy_training_preset": "lerobot-kit trains with --optimizer.* and --scheduler.* (their defaults are in "
    f"`lerobot train --help`); {_REMOVE}",
    "env_eval_freq": "use --eval_freq=N (it evaluates in --env.type's environment)",
    "eval_steps": _HELD_OUT,
    "max_eval_samples": _HELD_OUT,
    "cudnn_deterministic": f"lerobot-kit leaves cuDNN's choice of kernels to torch; {_REMOVE}",
    "prefetch_factor": _LOADER,
    "persistent_workers": _LOADER,
    "dataloader_multiprocessing_context": _LOADER,
    "tolerance_s": f"lerobot-kit's LeRobot reader takes the frame nearest each timestamp, within 0.4 frame; {_REMOVE}",
    "save_checkpoint_to_hub": "use --policy.repo_id=USER/NAME (the final pretrained_model/ is pushed)",
    "job": "lerobot-kit submits no Hugging Face Jobs: run it where it trains (torchrun, accelerate launch, SLURM)",
    "rename_map": f"lerobot-kit reads the dataset's features by their recorded names; {_REMOVE}",
    "sample_weighting": f"lerobot-kit weights every sample alike; {_REMOVE}",
    "reward_model": f"lerobot-kit trains policies only; {_REMOVE}",
}


def lerobot_flag_advice(path: str) -> str | None:
    """What to do instead of ``--<path>``, when it is one of LeRobot's flags."""
    for key, advice in INSTEAD.items():
        if path == key or path.startswith(f"{key}."):
            return f"a LeRobot flag that lerobot-kit does not take: {advice}"
    return None
