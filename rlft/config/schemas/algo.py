"""``algo``: the algorithm's advantages, loss and coefficients; ``rlft train --help algo`` shows them by section."""

from __future__ import annotations

from dataclasses import dataclass

from rlft.config.schemas.fields import ALGORITHM, LABEL, knob

# `rlft train --help algo` sections: which algorithm each AlgoConfig knob belongs to. The override
# paths stay flat: algo.ppo_epochs, algo.tis_cap.
ADVANTAGES = "Advantages (GRPO, Dr. GRPO, RLOO, REINFORCE++)"
POLICY_LOSS = "Policy loss (all)"
KL_REFERENCE = "KL to the reference (GRPO)"
EPOCHS = "Several updates per rollout (PPO; any algorithm)"
PENALTY = "PPO-Penalty (policy_loss=kl_penalty)"
PPO = "KL in the reward (PPO, RLOO, REINFORCE++), GAE and the critic (adv_estimator=gae)"
DAPO = "DAPO: dynamic sampling and overlong handling"
MISMATCH = "Sampler mismatch correction (sampler=vllm)"


# Advantage estimators that read per-token rewards, where kl_reward_coef's KL penalty sits (verl's
# token_level_rewards with use_kl_in_reward); the others read the sequence score alone.
TOKEN_REWARD_ESTIMATORS = ("gae", "rloo", "reinforce_pp", "reinforce_pp_baseline")


@dataclass
class AlgoConfig:
    name: str = knob("grpo", LABEL)
    """Preset name, for display."""
    adv_estimator: str = knob("grpo", ALGORITHM, section=ADVANTAGES)
    """Advantage estimator registered in rlft.algorithms (grpo, gae, rloo, reinforce_pp, reinforce_pp_baseline)."""
    norm_adv_by_std: bool = knob(True, ALGORITHM, section=ADVANTAGES)
    """GRPO: divide group-centred rewards by the group's std (False: Dr. GRPO)."""
    adv_eps: float = knob(1e-6, ALGORITHM, section=ADVANTAGES, range="(0, inf)")
    """Added to the group std before dividing."""
    policy_loss: str = knob("clip", ALGORITHM, section=POLICY_LOSS)
    """Policy loss registered in rlft.algorithms.losses (clip, kl_penalty, gspo, cispo, gmpo)."""
    clip_eps_low: float = knob(0.2, ALGORITHM, section=POLICY_LOSS, range="[0, inf)")
    """Ratio clipped below at 1 - clip_eps_low (cispo: >= 1 leaves its weight unbounded below; gmpo: the
    log-ratio is clipped at -clip_eps_low)."""
    clip_eps_high: float = knob(0.2, ALGORITHM, section=POLICY_LOSS, range="[0, inf)")
    """Ratio clipped above at 1 + clip_eps_high (DAPO's clip-higher uses 0.28; gmpo: the log-ratio at +clip_eps_high)."""
    kl_estimator: str = knob("k3", ALGORITHM, section=KL_REFERENCE)
    """Estimator of KL(pi_theta || pi_ref) per token: k1, k2 or k3."""
    beta: float = knob(0.04, ALGORITHM, section=KL_REFERENCE, range="[0, inf)")
    """Weight of the KL-to-reference term in the loss; 0 skips the reference pass."""
    loss_agg: str = knob("seq-mean-token-mean", ALGORITHM, section=POLICY_LOSS)
    """How per-token losses become one scalar (see rlft.algorithms.aggregation)."""
    ppo_epochs: int = knob(1, ALGORITHM, section=EPOCHS, range="[1, inf)")
    """Passes over each rollout batch."""
    num_mini_batches: int = knob(2, ALGORITHM, section=EPOCHS, range="[1, inf)")
    """Optimizer steps per epoch; the rollout batch is split into this many mini-batches."""
    early_stop_kl: float = knob(0.0, ALGORITHM, section=EPOCHS, range="[0, inf)")
    """Stop the remaining epochs on a rollout once mean approx KL(old || new) exceeds this (0: off)."""
    penalty_beta: float = knob(1.0, ALGORITHM, section=PENALTY, range="[0, inf)")
    """PPO-Penalty (policy_loss=kl_penalty): initial coefficient of KL(old || new) in the loss."""
    penalty_target_kl: float = knob(0.01, ALGORITHM, section=PENALTY, range="(0, inf)")
    """PPO-Penalty: beta doubles when KL > 1.5x this, halves when KL < this / 1.5."""
    kl_reward_coef: float = knob(0.0, ALGORITHM, section=PPO, range="[0, inf)")
    """Coefficient of the per-token KL penalty -coef * (logp_old - logp_ref) in the reward, read by the
    estimators of per-token rewards (gae, rloo, reinforce_pp, reinforce_pp_baseline)."""
    kl_ctrl: str = knob("fixed", ALGORITHM, section=PPO)
    """PPO: fixed or adaptive (InstructGPT controller) kl_reward_coef."""
    kl_target: float = knob(6.0, ALGORITHM, section=PPO, range="(0, inf)")
    """Adaptive controller: target KL per sequence."""
    kl_horizon: int = knob(10000, ALGORITHM, section=PPO, range="[1, inf)")
    """Adaptive controller: horizon in samples."""
    gamma: float = knob(1.0, ALGORITHM, section=PPO, range="[0, 1]")
    """Discount (GAE, REINFORCE++'s returns-to-go)."""
    lam: float = knob(0.95, ALGORITHM, section=PPO, range="[0, 1]")
    """GAE lambda."""
    whiten_advantages: bool = knob(True, ALGORITHM, section=PPO)
    """GAE: normalize advantages to mean 0, std 1 over the batch's response tokens."""
    vf_coef: float = knob(0.5, ALGORITHM, section=PPO, range="[0, inf)")
    """Value loss coefficient."""
    value_clip: float = knob(0.2, ALGORITHM, section=PPO, range="[0, inf)")
    """Value clipping range around the rollout-time values (0: off)."""
    critic_lr: float = knob(1e-4, ALGORITHM, section=PPO, range="(0, inf)")
    """Critic learning rate (value head and critic adapter)."""
    dynamic_sampling: bool = knob(False, ALGORITHM, section=DAPO)
    """DAPO: drop groups whose rewards are all equal and sample more until the batch is full."""
    max_sampling_rounds: int = knob(4, ALGORITHM, section=DAPO, range="[1, inf)")
    """DAPO: cap on sampling rounds per step; at the cap, train on what was gathered."""
    overlong_filter: bool = knob(False, ALGORITHM, section=DAPO)
    """DAPO: mask truncated completions out of the loss."""
    overlong_penalty: bool = knob(False, ALGORITHM, section=DAPO)
    """DAPO: add the soft overlong punishment to the reward (L_max = sampler.max_new_tokens)."""
    overlong_cache: int = knob(8, ALGORITHM, section=DAPO, range="[1, inf)")
    """DAPO: L_cache, the length band before L_max where the punishment ramps from 0 to -1."""
    overlong_penalty_factor: float = knob(1.0, ALGORITHM, section=DAPO, range="[0, inf)")
    """DAPO: weight of the overlong punishment in the reward."""
    rollout_correction: str = knob("none", ALGORITHM, section=MISMATCH)
    """Correction for the sampler's numerics from rho = exp(logp_learner_old - logp_sampler), a detached weight
    on each token's policy loss: none, token_tis / seq_tis / seq_geo_tis (rho per token / its product per
    sequence / its geometric mean per sequence, clamped to [rollout_is_low, rollout_is_high]), token_mask
    (IcePop) / seq_mask (TRL's sequence_mask): rho where it lies in that band, else 0, or seq_geo_mask
    (OpenRLHF's seq-mask-tis, recommended with rollout_is_low=0.5: a sequence whose geometric-mean rho leaves the band is dropped, the
    others weighted as token_tis; the product's band drops more of the longer sequences, the mean's does not).
    Needs a sampler that reports log-probs (vllm) and untruncated sampling."""
    rollout_is_low: float = knob(0.0, ALGORITHM, section=MISMATCH, range="[0, inf)")
    """Lower end of rollout_correction's band (0: no lower bound; IcePop uses 0.5)."""
    rollout_is_high: float = knob(2.0, ALGORITHM, section=MISMATCH, range="(0, inf)")
    """Upper end of rollout_correction's band (verl's rollout_is_threshold 2.0; TRL's clip_max 3.0; IcePop 5)."""
    tis_cap: float = knob(0.0, ALGORITHM, section=MISMATCH, range="[0, inf)")
    """Shorthand kept from earlier versions: tis_cap=C > 0 is rollout_correction=token_tis with the band [0, C],
    i.e. each token's loss weighted by min(exp(logp_learner - logp_sampler), C) (0: off)."""
    entropy_coef: float = knob(0.0, ALGORITHM, section=POLICY_LOSS, range="[0, inf)")
    """Entropy bonus: coef x the policy's token entropy (at the sampling temperature, aggregated as the policy
    loss) is subtracted from the loss; its gradient is computed chunk by chunk (0: off, no extra work)."""

    @property
    def correction(self) -> tuple[str, float, float]:
        """``(mode, low, high)`` of the sampler-mismatch correction, ``tis_cap`` resolved."""
        if self.tis_cap > 0:
            return "token_tis", 0.0, self.tis_cap
        return self.rollout_correction, self.rollout_is_low, self.rollout_is_high

    @property
    def uses_critic(self) -> bool:
        return self.adv_estimator == "gae"

    @property
    def uses_token_rewards(self) -> bool:
        """The estimator reads per-token rewards (score on the last token, kl_reward_coef's KL on each)."""
        return self.adv_estimator in TOKEN_REWARD_ESTIMATORS

    @property
    def kl_in_reward(self) -> bool:
        """A KL penalty in the per-token reward (the adaptive coefficient only scales kl_reward_coef,
        so it stays 0 when it starts at 0)."""
        return self.uses_token_rewards and self.kl_reward_coef > 0

    @property
    def needs_reference(self) -> bool:
        """A KL term to the reference in the loss, or in the reward."""
        return self.beta > 0 or self.kl_in_reward

    @property
    def needs_old_logprobs(self) -> bool:
        """A pass for the rollout policy's log-probs before the update: several steps per rollout
        move the policy away from it, and the in-reward KL (and PPO's critic step) reads them (otherwise
        the ratio is exp(logp - logp.detach()))."""
        return self.ppo_epochs > 1 or self.num_mini_batches > 1 or self.uses_critic or self.kl_in_reward

    @property
    def uses_ppo_penalty(self) -> bool:
        """PPO-Penalty: KL(old || new) in the loss, its beta adapted after each update."""
        return self.policy_loss == "kl_penalty"

    @property
    def adapts_kl_coef(self) -> bool:
        """The in-reward KL coefficient follows the adaptive (InstructGPT) controller."""
        return self.uses_token_rewards and self.kl_ctrl == "adaptive"

    @property
    def learns_from_zero_advantages(self) -> bool:
        """A loss term that is not 0 where every advantage is: the KL to the reference, PPO-Penalty's
        pull back to the old policy, the value loss, or the entropy bonus."""
        return self.uses_critic or self.beta > 0 or self.uses_ppo_penalty or self.entropy_coef > 0
