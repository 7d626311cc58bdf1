"""Preference losses for reward-model training: fn(r_chosen, r_rejected, margin) -> scalar loss.

``r_chosen`` and ``r_rejected`` are the model's scalar scores of the two replies of each pair, (P,);
``margin`` (P,) or None is how much better the chosen reply is (Llama 2's margin loss): the chosen
score must exceed the rejected one by at least that before the loss stops pushing.
"""

from __future__ import annotations

import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from rlft.registry import Registry

PREFERENCE_LOSSES = Registry("preference loss")


@PREFERENCE_LOSSES.register("bradley_terry")
def bradley_terry_loss(r_chosen: Tensor, r_rejected: Tensor, margin: Tensor | None = None) -> Tensor:
    """Bradley-Terry negative log-likelihood: mean over pairs of -log sigmoid(r_c - r_r - margin).

    P(chosen preferred) = sigmoid(r_c - r_r) under the Bradley-Terry model (InstructGPT's reward
    model loss); ``logsigmoid`` keeps it finite for large score gaps.
    """
    diff = r_chosen.float() - r_rejected.float()
    if margin is not None:
        diff = diff - margin.float()
    return -F.logsigmoid(diff).mean()


def pairwise_accuracy(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    """Share of pairs whose chosen reply scores strictly higher (a tie counts as wrong)."""
    return (r_chosen > r_rejected).float().mean()
