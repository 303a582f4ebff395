"""Local stand-ins for the hub files LeRobot's VLA policies load, written with transformers'
own ``save_pretrained`` so the runs and LeRobot read them as they would the real ones.

* ``write_tokenizer``: a byte-level BPE tokenizer trained here on a few prompts, in the
  place of PaliGemma's (π0/π0.5 take it through ``--policy.tokenizer_name``);
* ``write_smolvlm``: a SmolVLM config (Llama text model, SmolVLM vision encoder) at a
  tiny size and its processor (image processor, video processor, this tokenizer with
  SmolVLM's image tokens), in the place of ``HuggingFaceTB/SmolVLM2-500M-Video-Instruct``
  (SmolVLA takes it through its own ``--policy.vlm_model_name``);
* ``write_shipped_smolvlm``: the full-size architecture the bridge ships for that VLM, as a
  local folder LeRobot reads itself (the tests count LeRobot's own construction from it).

No weights: SmolVLA builds its VLM from the config (``load_vlm_weights=false``, LeRobot's
default) and π0/π0.5 start from random weights.

Also the reduced sizes the tests and ``tools/benchmark.py --size=reduced`` train at: flags
of LeRobot's own config fields (so ``lerobot-train`` takes them too), and the
``--policy.sizes`` JSON of the bridge's π0/π0.5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# π0.5 and π0 built by LeRobot's own classes at a size two CPU processes train in seconds
# (--policy.sizes; LeRobot's joint attention needs 8 heads per tower, and one head_dim).
# Depth 6, so that each joint layer pair is a small part of the model, as at full size.
PI_SIZES = (
    '{"vocab_size": 320, '
    '"gemma_2b": {"width": 64, "depth": 6, "mlp_dim": 256, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8}, '
    '"gemma_300m": {"width": 32, "depth": 6, "mlp_dim": 128, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8}, '
    '"vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, '
    '"patch_size": 16}}'
)
REDUCED_VLA = [
    "--policy.chunk_size=4", "--policy.n_action_steps=4", "--policy.max_state_dim=8", "--policy.max_action_dim=8",
    "--policy.tokenizer_max_length=24",
]
REDUCED_PI = [*REDUCED_VLA, "--policy.image_resolution=[64,64]"]
# With the tiny VLM of write_smolvlm, whose 4 text layers it keeps.
REDUCED_SMOLVLA = [*REDUCED_VLA, "--policy.num_vlm_layers=4", "--policy.resize_imgs_with_padding=[64,64]",
                   "--policy.expert_width_multiplier=0.5"]

SPECIAL_TOKENS = ["<pad>", "<unk>", "<bos>", "<eos>", "<image>", "<fake_token_around_image>", "<global-img>",
                  "<end_of_utterance>"]
# Prompts shaped like the ones LeRobot's processors build (π0.5 writes the state as bin numbers).
CORPUS = [
    "Task: reach the target, State: 12 128 255 3 77 190;\nAction: ",
    "Task: reach the target slowly, State: 0 64 32 200 99 17;\nAction: ",
    "reach the target\n",
]


def make_tokenizer(vocab_size: int = 320) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 10, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>",
        extra_special_tokens={
            "image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>",
        },
    )


def write_tokenizer(folder: Path) -> Path:
    make_tokenizer().save_pretrained(folder)
    return folder


def write_smolvlm(folder: Path, *, text_layers: int = 4, width: int = 64, vision_layers: int = 2) -> Path:
    from transformers import SmolVLMConfig

    tokenizer = make_tokenizer()
    config = SmolVLMConfig(
        text_config={
            "model_type": "llama", "hidden_size": width, "intermediate_size": 2 * width,
            "num_hidden_layers": text_layers, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": width // 4, "vocab_size": len(tokenizer), "max_position_embeddings": 512,
        },
        vision_config={
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": vision_layers,
            "num_attention_heads": 2, "image_size": 64, "patch_size": 16,
        },
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    config.save_pretrained(folder)
    write_smolvlm_processor(folder, tokenizer)
    return folder


def write_smolvlm_processor(folder: Path, tokenizer: Any = None) -> Path:
    """A SmolVLM processor (image and video processors, ``tokenizer`` with SmolVLM's image tokens)."""
    from transformers import SmolVLMImageProcessor, SmolVLMProcessor
    from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor

    processor = SmolVLMProcessor(image_processor=SmolVLMImageProcessor(), tokenizer=tokenizer or make_tokenizer(),
                                 video_processor=SmolVLMVideoProcessor(), image_seq_len=4)
    processor.save_pretrained(folder)
    return folder


def write_shipped_smolvlm(folder: Path) -> Path:
    """The architecture the bridge ships for SmolVLA's default VLM as a local ``config.json``
    (with a stand-in processor): what LeRobot reads from a folder, for its own construction."""
    from lerobot_kit_lerobot.smolvlm_shipped import shipped_config

    shipped_config().save_pretrained(folder)
    return write_smolvlm_processor(folder)
