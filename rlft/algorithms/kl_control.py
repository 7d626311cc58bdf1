"""Controllers that adapt KL coefficients between updates (pure functions of scalars)."""

from __future__ import annotations


def penalty_beta_update(beta: float, kl: float, target: float) -> float:
    """PPO-Penalty: double beta when KL > 1.5 target, halve it when KL < target / 1.5."""
    if kl > 1.5 * target:
        return beta * 2.0
    if kl < target / 1.5:
        return beta / 2.0
    return beta


def adaptive_kl_coef(coef: float, kl: float, target: float, n_steps: int, horizon: int) -> float:
    """InstructGPT/Ziegler et al. controller: coef * (1 + clip(KL / target - 1, -0.2, 0.2) * n / horizon).

    Args:
        coef: Current in-reward KL coefficient.
        kl: Observed KL (per sequence, summed over tokens, mean over the batch).
        target: Target KL.
        n_steps: Samples in this batch.
        horizon: Controller horizon.
    """
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * n_steps / horizon)
