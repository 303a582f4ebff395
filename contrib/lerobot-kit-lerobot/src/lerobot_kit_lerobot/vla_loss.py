"""The training loss of LeRobot's π0, π0.5 and SmolVLA, from their own preparation methods
and model, without the metrics their ``forward`` reads back to the host.

LeRobot's ``PI05Policy.forward`` (and π0's, SmolVLA's) returns the loss together with a
dict of floats — ``loss.item()``, per-dimension losses through ``.cpu().numpy()`` — so
every training step waits for the device to finish before the next can be queued, and a
shape-only trace (``lerobot plan`` on fake tensors) cannot run it at all. The bridge
computes the same loss from the same LeRobot calls the policy's ``forward`` makes —
``_preprocess_images`` / ``prepare_images``, ``prepare_state``, ``prepare_action``, the
model's ``sample_noise`` / ``sample_time`` and ``forward`` — and the same reduction, and
returns it as a tensor (the bridge's tests check it equals LeRobot's ``forward``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

TOKENS = "observation.language.tokens"
TOKEN_MASK = "observation.language.attention_mask"
ACTION = "action"
ACTION_PAD = "action_is_pad"


def pi_loss(policy: Any, batch: dict[str, Tensor], *, with_state: bool) -> Tensor:
    """π0 (``with_state``: the state is an input of its expert) and π0.5 (the state is in
    the prompt): the mean flow-matching error over every action entry of the real action size."""
    images, image_masks = policy._preprocess_images(batch)
    actions = policy.prepare_action(batch)
    noise = policy.model.sample_noise(actions.shape, actions.device)
    time = policy.model.sample_time(actions.shape[0], actions.device)
    inputs = [images, image_masks, batch[TOKENS], batch[TOKEN_MASK]]
    if with_state:
        inputs.append(policy.prepare_state(batch))
    losses = policy.model.forward(*inputs, actions, noise, time)
    return losses[:, :, : policy.config.output_features[ACTION].shape[0]].mean()


def smolvla_loss(policy: Any, batch: dict[str, Tensor]) -> Tensor:
    """SmolVLA: the flow-matching error over the valid (not padded) action entries."""
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
        return losses.mean()
    valid = (~padded).unsqueeze(-1)
    return (losses * valid).sum() / (valid.sum() * losses.shape[-1]).clamp_min(1)


def flow_matching_loss(policy: Any, batch: dict[str, Tensor]) -> Tensor:
    kind = policy.config.type
    if kind == "smolvla":
        return smolvla_loss(policy, batch)
    return pi_loss(policy, batch, with_state=kind == "pi0")
