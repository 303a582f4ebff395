"""Each sample's loss of LeRobot's ACT and Diffusion Policy, from the tensors their own
``forward`` computes, for a mixture's per-member losses.

LeRobot 0.6.1's ACT and Diffusion return only the batch's loss (π0, π0.5 and SmolVLA have
``reduction="none"``; see ``vla_loss``). Their forward runs unchanged; what it computed is
read as it passes — ACT's model output (predicted chunk, VAE latent), Diffusion's noising
(``add_noise``: the clean trajectory and the noise) and its denoiser's prediction — and
only LeRobot's final reduction is restated, per sample:

- ACT: the L1 error over the sample's valid (not padded) action entries, plus ``kl_weight``
  times its KL divergence (with the VAE); the loss is the mean of the L1 terms weighted by
  valid entries, plus the mean of the KL terms;
- Diffusion: the MSE over the sample's entries (valid ones, with
  ``do_mask_loss_for_padding``); the loss is their mean (weighted by valid entries).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

ACTION = "action"
ACTION_PAD = "action_is_pad"


@contextlib.contextmanager
def outputs_of(module: nn.Module) -> Iterator[list[Any]]:
    """The outputs of ``module``'s calls inside the block, in order."""
    seen: list[Any] = []
    handle = module.register_forward_hook(lambda _module, _args, output: seen.append(output))
    try:
        yield seen
    finally:
        handle.remove()


@contextlib.contextmanager
def calls_of(owner: Any, name: str) -> Iterator[list[dict[str, Any]]]:
    """The arguments, by parameter name, of ``owner.name(...)``'s calls inside the block (the
    method runs as before)."""
    seen: list[dict[str, Any]] = []
    method: Callable[..., Any] = getattr(owner, name)
    signature = inspect.signature(method)
    own = vars(owner).get(name)  # an attribute of the object itself, restored after

    def recorded(*args: Any, **kwargs: Any) -> Any:
        seen.append(signature.bind(*args, **kwargs).arguments)
        return method(*args, **kwargs)

    setattr(owner, name, recorded)
    try:
        yield seen
    finally:
        if own is None:
            delattr(owner, name)  # the class's method again
        else:
            setattr(owner, name, own)


def valid_mean(errors: Tensor, batch: dict[str, Tensor], masked: bool) -> Tensor:
    """Each sample's mean of ``errors`` ``[B, T, D]``, over its valid entries when ``masked``."""
    if not masked or ACTION_PAD not in batch:
        return errors.mean(dim=(1, 2))
    valid = (~batch[ACTION_PAD]).unsqueeze(-1)
    return (errors * valid).sum(dim=(1, 2)) / (valid.sum(dim=(1, 2)) * errors.shape[-1]).clamp_min(1)


def act_forward(policy: Any, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Any], Tensor]:
    """LeRobot's ``ACTPolicy.forward`` on ``batch`` and each sample's loss."""
    with outputs_of(policy.model) as outputs:
        loss, logs = policy.forward(batch)
    actions, (mu, log_sigma_x2) = outputs[-1]
    per_sample = valid_mean(F.l1_loss(batch[ACTION], actions, reduction="none"), batch, masked=True)
    if policy.config.use_vae and log_sigma_x2 is not None:
        kld = (-0.5 * (1 + log_sigma_x2 - mu.pow(2) - log_sigma_x2.exp())).sum(-1)
        per_sample = per_sample + policy.config.kl_weight * kld
    return loss, logs, per_sample


def diffusion_forward(policy: Any, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Any], Tensor]:
    """LeRobot's ``DiffusionPolicy.forward`` on ``batch`` and each sample's loss."""
    model = policy.diffusion
    with calls_of(model.noise_scheduler, "add_noise") as noising, outputs_of(model.unet) as predictions:
        loss, logs = policy.forward(batch)
    # diffusers' add_noise(original_samples, noise, timesteps): the trajectory and the noise drawn for it.
    drawn = noising[-1]
    target = drawn["noise"] if policy.config.prediction_type == "epsilon" else drawn["original_samples"]
    errors = F.mse_loss(predictions[-1], target, reduction="none")
    return loss, logs or {}, valid_mean(errors, batch, masked=policy.config.do_mask_loss_for_padding)
