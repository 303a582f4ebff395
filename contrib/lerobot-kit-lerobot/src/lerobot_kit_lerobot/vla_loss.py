"""The training loss of LeRobot's π0, π0.5 and SmolVLA, from their own preparation methods
and model, without the metrics their ``forward`` reads back to the host.

LeRobot's ``PI05Policy.forward`` (and π0's, SmolVLA's) returns the loss together with a
dict of floats — ``loss.item()``, per-dimension losses through ``.cpu().numpy()`` — so
every training step waits for the device to finish before the next can be queued, and a
shape-only trace (``lerobot plan`` on fake tensors) cannot run it at all. The bridge
computes the same loss from the same LeRobot calls the policy's ``forward`` makes —
``_preprocess_images`` / ``prepare_images``, ``prepare_state``, ``prepare_action``, the
model's ``sample_noise`` / ``sample_time`` and ``forward`` — and the same reduction, and
returns it as a tensor (the bridge's tests check it equals LeRobot's ``forward``), with
each sample's loss as LeRobot's ``forward(batch, reduction="none")`` computes it (a
mixture's per-member losses are their means). A mixture sample's missing camera is masked
inside ``_preprocess_images`` / ``prepare_images`` (``camera_masks``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

TOKENS = "observation.language.tokens"
TOKEN_MASK = "observation.language.attention_mask"
ACTION = "action"
ACTION_PAD = "action_is_pad"


def pi_loss(policy: Any, batch: dict[str, Tensor], *, with_state: bool) -> tuple[Tensor, Tensor]:
    """π0 (``with_state``: the state is an input of its expert) and π0.5 (the state is in
    the prompt): the mean flow-matching error over every action entry of the real action
    size, and each sample's mean over its own (the loss is their mean)."""
    images, image_masks = policy._preprocess_images(batch)
    actions = policy.prepare_action(batch)
    noise = policy.model.sample_noise(actions.shape, actions.device)
    time = policy.model.sample_time(actions.shape[0], actions.device)
    inputs = [images, image_masks, batch[TOKENS], batch[TOKEN_MASK]]
    if with_state:
        inputs.append(policy.prepare_state(batch))
    losses = policy.model.forward(*inputs, actions, noise, time)
    losses = losses[:, :, : policy.config.output_features[ACTION].shape[0]]
    return losses.mean(), losses.mean(dim=(1, 2))


def smolvla_loss(policy: Any, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """SmolVLA: the flow-matching error over the valid (not padded) action entries, and each
    sample's over its own (the loss is their mean weighted by valid entries)."""
    if policy.config.adapt_to_pi_aloha:
        batch = {**batch, "observation.state": policy._pi_aloha_decode_state(batch["observation.state"]),
                 ACTION: policy._pi_aloha_encode_actions_inv(batch[ACTION])}
    images, image_masks = policy.prepare_images(batch)
    state = policy.prepare_state(batch)
    actions = policy.prepare_action(batch)
    losses = policy.model.forward(images, image_masks, batch[TOKENS], batch[TOKEN_MASK], state, actions)
    losses = losses[:, :, : policy.config.action_feature.shape[0]]
    padded = batch.get(ACTION_PAD)
    if padded is None:
        return losses.mean(), losses.mean(dim=(1, 2))
    valid = (~padded).unsqueeze(-1)
    losses = losses * valid
    per_sample = losses.sum(dim=(1, 2)) / (valid.sum(dim=(1, 2)) * losses.shape[-1]).clamp_min(1)
    return losses.sum() / (valid.sum() * losses.shape[-1]).clamp_min(1), per_sample


def flow_matching_loss(policy: Any, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The batch's loss and each sample's (``[B]``)."""
    kind = policy.config.type
    if kind == "smolvla":
        return smolvla_loss(policy, batch)
    return pi_loss(policy, batch, with_state=kind == "pi0")
