"""Pure tensor math of the RL algorithms: no I/O, no models.

Every function works on ``(batch, tokens)`` tensors with a response mask and is registered
by name, so a preset in conf/algo/ picks it with a string.
"""

from rlft.algorithms import reinforce  # noqa: F401  (registers rloo, reinforce_pp, reinforce_pp_baseline)
from rlft.algorithms.advantages import ADV_ESTIMATORS, AdvantageInputs
from rlft.algorithms.aggregation import LOSS_AGGREGATIONS, LossNorm
from rlft.algorithms.correction import ROLLOUT_CORRECTIONS
from rlft.algorithms.kl import KL_ESTIMATORS
from rlft.algorithms.losses import POLICY_LOSSES
from rlft.algorithms.masked import masked_mean, masked_sum
from rlft.algorithms.preference import PREFERENCE_LOSSES, bradley_terry_loss, pairwise_accuracy

__all__ = [
    "ADV_ESTIMATORS",
    "AdvantageInputs",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "LossNorm",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "ROLLOUT_CORRECTIONS",
    "bradley_terry_loss",
    "masked_mean",
    "masked_sum",
    "pairwise_accuracy",
]
