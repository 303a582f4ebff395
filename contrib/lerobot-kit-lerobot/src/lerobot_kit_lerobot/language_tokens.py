"""The prompt's token ids against the model's vocabulary, checked once, on real data.

π0/π0.5 take their tokenizer (``--policy.tokenizer_name``) and their vocabulary size
(257,152, or ``--policy.sizes``' ``vocab_size``) from two places, and SmolVLA its VLM's
config and tokenizer from files a user may assemble: a tokenizer with more tokens than
the embedding has rows fails deep in the first step with torch's bare "index out of range
in self". Comparing the tokenizer's length with the vocabulary instead would refuse
tokenizers whose unused added tokens lie past it, so the check reads the ids the first
batch really holds (one read-back to the host, once per run). A fake tensor (``lerobot
plan``'s shape-only trace) holds no ids and is passed.
"""

from __future__ import annotations

from torch import Tensor, nn
from torch._subclasses.fake_tensor import is_fake

from lerobot_kit.api import ConfigError
from lerobot_kit_lerobot.vla_loss import TOKENS


def check_token_ids(batch: dict[str, Tensor], vocab_size: int, tokenizer_flag: str) -> None:
    """Refuse, in one line naming ``tokenizer_flag``, token ids the embedding has no row for."""
    tokens = batch.get(TOKENS)
    if tokens is None or tokens.numel() == 0 or is_fake(tokens):
        return
    largest = int(tokens.max())
    if largest >= vocab_size:
        raise ConfigError(
            f"{tokenizer_flag}: the tokenizer gives token id {largest}, and the model's vocabulary has "
            f"{vocab_size} entries (ids 0..{vocab_size - 1}): give a tokenizer whose ids fit the vocabulary, "
            "or a vocabulary that holds the tokenizer's (for π0/π0.5, --policy.sizes' vocab_size)"
        )


def vocabulary_size(embedding: nn.Module) -> int:
    """The rows of the token embedding, also under a LoRA on it (``--peft.target_modules``
    naming ``embed_tokens``): peft then puts its own layer in the embedding's place, which
    holds LeRobot's ``nn.Embedding`` as its base layer and has no ``num_embeddings``."""
    base = embedding.get_base_layer() if hasattr(embedding, "get_base_layer") else embedding
    return int(base.num_embeddings)
