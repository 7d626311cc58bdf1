"""Config schemas: one dataclass per section, a short docstring per field.

This is the one place a default is written. The YAML files under ``conf/`` are merged onto these
schemas, so a key missing from YAML takes the default below and a key missing here is a typo; a
group option in conf/ sets only the keys that make it that option (tests/test_config_defaults.py).

Each field also says what changing it between a checkpoint and its resumption does to the run
(``resume``, collected into :data:`rlft.run_state.KEY_CLASSES`) and, in algo, which algorithm it
belongs to (``section``, collected into :data:`ALGO_SECTIONS` for ``rlft train --help algo``). Every
numeric field says its valid values (``range``, a :class:`Range` in interval notation, e.g. ``"[0, 1]"``),
which :func:`rlft.config.validation.check_ranges` enforces and ``rlft train --help SECTION`` prints.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import PurePath
from typing import Any

from rlft.errors import ConfigError  # noqa: F401  (re-exported: rlft.config.schemas.ConfigError)

GROUPS = ("algo", "model", "sampler", "reward", "data", "logger")


# Resume classes: HARMLESS and NUMERICS changes are allowed and reported; HARMFUL ones refuse the resume.
# A (class, why) given to a section field covers every key under it (a row "section." in KEY_CLASSES).
HARMLESS, NUMERICS, HARMFUL = "harmless", "numerics only", "harmful"
LABEL = (HARMLESS, "a display label")
EVAL_ONLY = (HARMLESS, "evaluation only, greedy and outside the update")
CHECKPOINTING = (HARMLESS, "checkpointing only")
SYNC_CHECK = (HARMLESS, "a check of each weight sync; the steps run are unchanged")
WAITING = (HARMLESS, "how long a stop or a lost rank is waited for; the steps run are unchanged")
ALGORITHM = (HARMFUL, "the algorithm's advantages, loss or coefficients")
MODEL = (HARMFUL, "the model being trained")
ADAPTER = (HARMFUL, "the trained adapter")
SAMPLING = (HARMFUL, "the sampling distribution or batch")
REWARD = (HARMFUL, "the reward")
TIMEOUT = (HARMFUL, "which calls score reward.on_timeout, and that score")
PROBLEMS = (HARMFUL, "the training problems")
EVAL_ROWS = (HARMFUL, "on data=jsonl/hf, whether the eval rows are carved out of the training file")
OPTIMIZER = (HARMFUL, "the optimizer's updates or LR schedule")

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


@dataclass(frozen=True)
class Range:
    """The valid values of a numeric key, parsed from interval notation: ``"[0, 1]"``, ``"(0, 1]"``, ``"[1, inf)"``,
    ``"(-inf, inf)"`` (any finite number). None is valid too where the field's type allows it (``float | None``);
    on a list field (``list[float]``) the range is each entry's."""

    low: str
    high: str
    low_open: bool
    high_open: bool

    @classmethod
    def parse(cls, text: str) -> Range:
        m = re.fullmatch(r"([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])", text)
        if m is None:
            raise ValueError(f"range {text!r}: expected interval notation such as '[0, 1]' or '(0, inf)'")
        r = cls(m[2], m[3], m[1] == "(", m[4] == ")")
        low, high = float(r.low), float(r.high)
        if not low < high or (math.isinf(low) and not r.low_open) or (math.isinf(high) and not r.high_open):
            raise ValueError(f"range {text!r}: needs low < high, and an open bracket at an infinite end")
        return r

    def __contains__(self, value: float) -> bool:
        low, high = float(self.low), float(self.high)
        above = value > low if self.low_open else value >= low
        below = value < high if self.high_open else value <= high
        return above and below  # NaN: neither

    def __str__(self) -> str:
        """What a value must be, as messages say it: ``in [0, 1]``, ``>= 1``, ``> 0``, ``a finite number``."""
        if math.isinf(float(self.low)) and math.isinf(float(self.high)):
            return "a finite number"
        if math.isinf(float(self.high)):
            return f"{'>' if self.low_open else '>='} {self.low}"
        if math.isinf(float(self.low)):
            return f"{'<' if self.high_open else '<='} {self.high}"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


def knob(default: Any = None, resume: tuple[str, str] | None = None, *, factory: Callable[[], Any] | None = None,
         section: str | None = None, range: str | None = None) -> Any:
    """A field: its default (or a factory for a mutable one), its resume class, its help section and, for a
    number, its valid values (``range``: interval notation, see :class:`Range`)."""
    valid = Range.parse(range) if range is not None else None
    metadata = {k: v for k, v in (("resume", resume), ("section", section), ("range", valid)) if v is not None}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@cache
def field_types(cls: type) -> dict[str, Any]:
    """Each field's resolved type annotation."""
    return typing.get_type_hints(cls)


def valid_values(cls: type, name: str) -> str | None:
    """What field ``name`` of ``cls`` accepts, as its errors and ``--help`` say it (``in [0, 1]``, ``> 0, or null``,
    ``each entry >= 0``); None for a field without a range."""
    valid = next(f for f in dataclasses.fields(cls) if f.name == name).metadata.get("range")
    if valid is None:
        return None
    kind = field_types(cls)[name]
    if typing.get_origin(kind) is list:
        return f"each entry {valid}"
    return f"{valid}, or null" if type(None) in typing.get_args(kind) else str(valid)


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


@dataclass
class LoraConfig:
    enabled: bool = knob(True, ADAPTER)
    """Train a LoRA adapter (False: full fine-tuning)."""
    r: int = knob(16, ADAPTER, range="[1, inf)")
    """Adapter rank."""
    alpha: float = knob(32.0, ADAPTER, range="(0, inf)")
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = knob(0.0, ADAPTER, range="[0, 1)")
    """Dropout on the adapter input."""
    target_modules: list[str] = knob(
        resume=ADAPTER, factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that get an adapter."""


@dataclass
class TinyModelConfig:
    hidden_size: int = knob(64, range="[1, inf)")
    """Hidden width (head_dim = hidden_size / num_heads must be >= 32 for vLLM on CPU)."""
    num_layers: int = knob(2, range="[1, inf)")
    """Decoder layers."""
    num_heads: int = knob(2, range="[1, inf)")
    """Attention heads."""
    num_kv_heads: int = knob(1, range="[1, inf)")
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = knob(128, range="[1, inf)")
    """MLP width."""


@dataclass
class ModelConfig:
    name: str = knob("smollm2_135m", LABEL)
    """Preset name, for display."""
    source: str = knob("smollm2_gguf", MODEL)
    """Where the weights come from: smollm2_gguf, path or tiny."""
    path: str | None = knob(None, MODEL)
    """Local Hugging Face model directory (source=path)."""
    dtype: str = knob("auto", (HARMFUL, "the frozen weights' dtype and the compute precision"))
    """Compute dtype: bf16 (autocast, frozen weights in bf16), fp32, or auto (bf16 on CUDA; on CPU
    whichever a start-up GEMM probe at the model's shapes measures faster, logged with its figures;
    a resumed run keeps the dtype its checkpoint was trained in)."""
    attn_implementation: str = knob("auto", (NUMERICS, "float rounding of another kernel for the same attention"))
    """Learner attention kernel: eager, sdpa, flash_attention_2 (CUDA, needs the flash-attn package), or
    auto (eager on CPU, where it trained ~15% faster than sdpa's flash kernel on short RL sequences;
    sdpa on CUDA)."""
    gradient_checkpointing: bool = knob(
        False, (NUMERICS, "recomputes the same activations, whole rows instead of a shared prompt pass"))
    """Recompute each layer's activations in backward instead of keeping them (long sequences on
    a GPU); the learner then runs each row whole, without sharing a prompt's pass across its group."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Adapter settings."""
    tiny: TinyModelConfig = knob(resume=MODEL, factory=TinyModelConfig)
    """Shape of the random model (source=tiny)."""


@dataclass
class VLLMConfig:
    dtype: str = "auto"
    """Engine dtype: auto (= model.dtype), bf16 or fp32."""
    max_model_len: int = knob(1024, range="[1, inf)")
    """Longest prompt + completion the engine accepts: prompts longer than max_model_len - sampler.max_new_tokens
    are dropped at start-up (counted, as data.max_prompt_tokens does), so no completion is cut short by it."""
    gpu_memory_utilization: float = knob(0.3, range="(0, 1]")
    """Share of accelerator memory for the engine (GPU; on CPU only when kv_cache_gb is 0)."""
    kv_cache_gb: float | None = knob(None, range="[0, inf)")
    """KV-cache size in GiB (0: the gpu_memory_utilization share; None: that on GPU, 2 GiB on CPU,
    where the share of all RAM would be reserved up front: ~90k tokens of SmolLM2-135M fit in 2 GiB)."""
    tensor_parallel_size: int = knob(1, range="[1, inf)")
    """GPUs the engine shards the model over."""
    prefix_caching: bool = True
    """Reuse the KV cache of shared prompt prefixes (the n samples of a prompt); reset at each sync."""
    sleep: bool = True
    """GPU only: put the engine to sleep while the learner runs, freeing its memory."""
    enforce_eager: bool | None = None
    """Skip vLLM's graph compilation (None: skip on CPU, where compiling took 80-110 s and decoded no faster)."""
    sync: str = "merged"
    """How each update reaches the engine: merged (LoRA merged into the base weights, pushed in place)
    or adapter (the engine serves the LoRA adapter itself; on CPU vLLM's LoRA kernels decode ~6-7x slower)."""


@dataclass
class SamplerConfig:
    name: str = knob("auto", (NUMERICS, "rounding and random draws of another backend for the same distribution"))
    """Rollout backend: vllm, hf (transformers), or auto (vllm when installed, else hf)."""
    n: int = knob(8, SAMPLING, range="[1, inf)")
    """Completions per prompt (the GRPO group size G)."""
    temperature: float = knob(1.0, SAMPLING, range="(0, inf)")
    """Sampling temperature; log-probs are computed on logits / temperature."""
    top_p: float = knob(1.0, SAMPLING, range="(0, 1]")
    """Nucleus sampling threshold (1.0: off)."""
    top_k: int = knob(0, SAMPLING, range="[0, inf)")
    """Top-k sampling (0: off)."""
    max_new_tokens: int = knob(32, SAMPLING, range="[1, inf)")
    """Completion length cap; longer completions are truncated."""
    sync_check: str = knob("error", SYNC_CHECK)
    """After each weight sync (and at start-up, after a resume, before `rlft eval`) the sampler scores a fixed
    probe and its log-probs must match the learner's: error (stop the run, exit 1), warn (say so and go on) or off."""
    sync_check_tol: float | None = knob(None, SYNC_CHECK, range="(0, inf)")
    """Largest mean |log-prob difference| on the probe that passes (None: by dtype, 1e-3 when learner and
    sampler both run fp32, else 0.25)."""
    sync_probe_every: int = knob(10, SYNC_CHECK, range="[1, inf)")
    """Where the sampler reads back every weight the learner trains (LoRA on linear layers), each check compares
    those weights and the probe's log-probs run at the first check and every N-th after (1: every check); else
    (full fine-tuning, LoRA on embeddings, vLLM tensor parallel) the probe runs at every check."""
    vllm: VLLMConfig = knob(resume=(NUMERICS, "rounding and random draws of the vLLM engine"), factory=VLLMConfig)
    """vLLM engine settings (sampler=vllm)."""


# Metric names the rollout logs itself under reward/: no reward model may take one as its name.
REWARD_METRICS = ("mean", "std", "raw_mean", "unscored_frac", "overlong_penalty", "model", "gold", "running_mean",
                  "running_std", "clipped_frac")


@dataclass
class RewardModelConfig:
    """One reward model of ``reward.models`` (a trained scorer: the reward is its scalar head's output)."""

    path: str = ""
    """Local Hugging Face sequence-classification directory (one label), e.g. from TRL's RewardTrainer or `rlft rm`;
    its own tokenizer and chat template render each reply as [user: prompt, assistant: completion], the way
    its rlft_rendering.json says `rlft rm` trained it (chat template, system prompt, max_length), else the
    defaults below."""
    weight: float = knob(1.0, range="(-inf, inf)")
    """Its weight in the reward's weighted sum (with reward.fns' weights)."""
    name: str | None = None
    """Its metric, reward/<name> (None: the directory's name)."""
    batch_size: int = knob(16, range="[1, inf)")
    """Replies scored per forward pass (sorted by length, so a batch holds similar lengths)."""
    max_length: int | None = knob(None, range="[1, inf)")
    """Longest rendered prompt + reply it reads, in its tokens (None: the record's, else 1024). A longer one keeps
    its whole prompt and its reply's end (where the score is read), the reply's beginning cut: counted in
    reward/<name>/truncated_frac; when even the prompt leaves no room, the reply is unscored (NaN) and counted
    in reward/<name>/too_long_frac."""
    chat_template: bool | None = None
    """Render through its chat template (None: as the record says, else when it has one; false: prompt text +
    reply text)."""
    system_prompt: str | None = None
    """System message before the prompt (None: the record's, else none; '': none)."""
    dtype: str = "auto"
    """Weights and compute dtype: bf16, fp32, or auto (the learner's compute dtype, model.dtype as resolved)."""

    @property
    def label(self) -> str:
        """Its metric's name: ``name``, else the directory's name."""
        return self.name or PurePath(self.path.rstrip("/")).name or self.path


@dataclass
class JudgeConfig:
    """A generative judge: a causal LM prompted with a rubric, its greedy reply parsed into a score
    (rlft/rewards/judges.py)."""

    name: str = knob("judge", LABEL)
    """Label of its scores in the metrics (reward/NAME, reward/NAME/unparsed_frac); unique among the scorers."""
    model: str = knob("smollm2_135m", REWARD)
    """The judge's causal LM: a local Hugging Face model directory, or a name: smollm2_135m (the
    bundled SmolLM2-135M-Instruct) or tiny (random weights, for tests). Runs in the policy's dtype."""
    template: str | None = knob(None, REWARD)
    """The rubric, sent as one user turn through the judge's chat template: str.format placeholders
    {prompt}, {reply} (required) and {answer}; literal braces doubled. None: the built-in rubric of
    ``kind`` (rlft.rewards.rubric.DEFAULT_TEMPLATES: the task, reference and reply between tags, then a
    short reason and the score in ``score_format`` or the verdict word on the last line). The
    fields' text is the data's and the policy's: special-token strings in it stay text, and tags
    <name>/</name> that the template writes are broken inside it (a reply cannot close its tag)."""
    kind: str = knob("score", REWARD)
    """score: the reply gives a number in [min_score, max_score], rescaled to [0, 1]; verdict: the reply
    gives one of the ``verdicts`` words, worth its value."""
    min_score: float = knob(0.0, REWARD, range="(-inf, inf)")
    """kind=score: the lowest score the rubric allows (maps to 0)."""
    max_score: float = knob(10.0, REWARD, range="(-inf, inf)")
    """kind=score: the highest score the rubric allows (maps to 1)."""
    score_format: str = knob("label", REWARD)
    """kind=score: what the judge's last non-empty line must end with (nothing else is read; without
    it the reply is unscored): label (Score: N), brackets ([[N]]), or number (any number, the loosest:
    it may read a number the judge quotes). N may be a fraction N/D of the scale (Score: 8/10)."""
    # None, not a default dict: OmegaConf would merge a user's {yes: 1, no: 0} into it.
    verdicts: dict[str, float] | None = knob(None, REWARD)
    """kind=verdict: each verdict word (a whole word, any case) and its score, e.g. {yes: 1, no: 0}
    (None: {correct: 1, incorrect: 0}); the last one on the judge's last non-empty line counts."""
    weight: float = knob(1.0, REWARD, range="(-inf, inf)")
    """Weight of its score in the reward's weighted sum (with reward.weights)."""
    max_new_tokens: int = knob(64, REWARD, range="[1, inf)")
    """Cap on the judge's reply; a reply cut before its score is unscored."""
    temperature: float = knob(0.0, REWARD, range="[0, inf)")
    """0: greedy (the default, deterministic); > 0 samples the judge."""
    batch_size: int = knob(32, (NUMERICS, "padding of the judge's batched decoding"), range="[1, inf)")
    """Replies judged per generate call."""
    sampler: str = knob("auto", (NUMERICS, "rounding of another backend for the same judge"))
    """The judge's generation backend: hf, vllm (an engine of its own, sampler.vllm's settings), or
    auto (sampler.name's backend)."""


@dataclass
class RewardConfig:
    fns: list[str] = knob(resume=REWARD, factory=lambda: ["math_correct"])
    """Built-in reward names or dotted paths 'pkg.module:function' (may be [] with reward.models or reward.judges)."""
    weights: list[float] = knob(resume=REWARD, factory=lambda: [1.0], range="(-inf, inf)")
    """One weight per function; the reward is the weighted sum (with reward.models' and reward.judges' weights)."""
    models: list[RewardModelConfig] = knob(resume=REWARD, factory=list)
    """Reward models scored on the learner's device without gradients, e.g.
    reward.models='[{path: /x/rm, weight: 1.0}]' (see RewardModelConfig: path, weight, name, batch_size,
    max_length, dtype); each rank scores its share of the replies."""
    normalize: bool = knob(False, REWARD)
    """Whiten the total reward with its running mean and std over every scored reply so far (all ranks;
    saved in checkpoints): (r - mean) / (std + 1e-6), the statistics updated with each batch first."""
    clip: float = knob(0.0, REWARD, range="[0, inf)")
    """Clip the total reward (after normalize) to [-clip, clip] (0: off)."""
    gold: str | None = knob("auto", EVAL_ONLY)
    """A rule-based reward logged beside the models and judges as reward/gold (weight 0: never in the loss) and
    used for evaluation accuracy: a reward function name; auto: with reward.models or reward.judges, the task's
    checker (arithmetic: math_correct, gsm8k: gsm8k_correct, countdown: countdown_correct), else none; null or
    none: off."""
    num_workers: int = knob(0, (HARMLESS, "where reward calls run, not what they return"), range="[0, inf)")
    """Score in this many worker processes (0: in the training process, unless timeout_s needs one)."""
    timeout_s: float = knob(0.0, TIMEOUT, range="[0, inf)")
    """Time limit of one reward call (a batched function: of the whole batch), in seconds; calls then
    run in worker processes that can be stopped (0: no limit)."""
    on_timeout: float | None = knob(None, TIMEOUT, range="(-inf, inf)")
    """Score of a call that ran past timeout_s or whose worker process died (os._exit, a signal, the
    OOM killer) (None: end the run with one line naming the function, the sample and what happened)."""
    judges: list[JudgeConfig] = knob(resume=REWARD, factory=list)
    """Generative judges whose parsed scores join the weighted sum, e.g.
    'reward.judges=[{model:/path/to/judge,weight:0.5}]' (each entry's keys: reward.judges[i].KEY)."""


@dataclass
class DataConfig:
    name: str = knob("arithmetic", PROBLEMS)
    """Task: arithmetic, countdown (generated), jsonl (a JSON/JSONL file), hf (a local data set), gsm8k (an hf preset)."""
    digits: int = knob(2, PROBLEMS, range="[1, inf)")
    """Arithmetic: digits per operand; countdown: numbers and targets lie in [1, 10**digits - 1]."""
    ops: list[str] = knob(resume=PROBLEMS, factory=lambda: ["+"])
    """Operators: arithmetic draws one per problem (+, -, *); countdown builds targets with them (+, -, *, /)."""
    num_numbers: list[int] = knob(resume=PROBLEMS, factory=lambda: [3, 4], range="[2, 6]")
    """Countdown: how many numbers a problem gives, drawn from this list (each used exactly once)."""
    template: str = knob("What is {a} {op} {b}? Reply with just the number.", PROBLEMS)
    """Prompt text; arithmetic fills {a} {op} {b}, countdown {numbers} {target}, jsonl/hf {prompt} (string prompts)."""
    num_eval: int = knob(200, (HARMFUL, "the held-out split, carved out of or rejected from the training problems"),
                         range="[0, inf)")
    """Held-out problems used for evaluation."""
    path: str | None = knob(None, PROBLEMS)
    """jsonl: training file; hf/gsm8k: a save_to_disk folder, a folder of data files, or a parquet/json/jsonl/csv file."""
    split: str = knob("train", PROBLEMS)
    """hf/gsm8k: the split of data.path to train on (a single file is the split train)."""
    eval_split: str | None = knob(None, EVAL_ROWS)
    """hf/gsm8k: the held-out split (of data.eval_path when given, else of data.path)."""
    eval_path: str | None = knob(None, EVAL_ROWS)
    """jsonl/hf: held-out file or folder (default: the last num_eval rows of path)."""
    prompt_field: str = knob("prompt", PROBLEMS)
    """jsonl/hf: column holding the prompt (a string, or a list of chat messages {role, content})."""
    answer_field: str | None = knob("answer", PROBLEMS)
    """jsonl/hf: column holding the reference answer (null: none, rewards get answer="")."""
    system_prompt: str | None = knob(None, PROBLEMS)
    """System message for the chat template (None: the model's default)."""
    chat_template: bool = knob(True, PROBLEMS)
    """Render prompts with the tokenizer's chat template (false: the raw text; message prompts are refused)."""
    max_prompt_tokens: int = knob(0, PROBLEMS, range="[0, inf)")
    """jsonl/hf: drop (never truncate) problems whose templated prompt is longer than this many tokens (0: no limit)."""


@dataclass
class WandbConfig:
    enabled: bool = False
    """Log to Weights & Biases."""
    project: str = "rlft"
    """wandb project."""
    mode: str = "offline"
    """online or offline (offline needs no network)."""
    entity: str | None = None
    """wandb entity (team)."""


@dataclass
class LoggerConfig:
    console: bool = True
    """Progress bar and one line per step on the console."""
    verbose: bool = False
    """Also show other libraries' log records, warnings and progress bars on the console (they always go to
    train.log; without it the console shows rlft's lines and the libraries' errors)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases settings."""
    rollouts: bool = False
    """Also write every kept rollout row (step, group, prompt and completion token ids, score) to rollouts.jsonl."""


STEPS = (HARMLESS, "where to stop; with optim.schedule=constant no LR depends on it")
MICRO_BATCH = (NUMERICS, "float summation order and padding of the gradient accumulation")


@dataclass
class LoopConfig:
    """The ``trainer`` keys that ``rlft train`` (:class:`TrainerConfig`) and ``rlft rm``
    (:class:`rlft.config.rm_schema.RMTrainerConfig`) share; each adds its own."""

    eval_every: int = knob(10, EVAL_ONLY, range="[0, inf)")
    """Evaluate on the held-out split (rlft rm: pairwise accuracy) every N steps (0: only at the end)."""
    eval_at_start: bool = knob(True, EVAL_ONLY)
    """Evaluate before the first update, as the baseline."""
    save_every: int = knob(0, CHECKPOINTING, range="[0, inf)")
    """Write a checkpoint every N steps (0: only the final one)."""
    keep_last: int = knob(0, CHECKPOINTING, range="[0, inf)")
    """Keep only the newest K checkpoints (0: keep all)."""
    resume: str = knob("", CHECKPOINTING)
    """'' starts fresh; auto continues from the newest complete checkpoint in the run directory
    (fresh if none); a path continues from that checkpoint (or the newest one in that run directory)."""
    threads: int = knob(0, (NUMERICS, "float rounding of CPU kernels that split work by thread"), range="[0, inf)")
    """torch intra-op threads (0: torch's default)."""
    device: str = knob("auto", (NUMERICS, "rounding of another device's kernels (a checkpoint maps onto any device)"))
    """Where the learner (the trained model, its optimizer and batches; in rlft train also the reference and
    critic) runs: auto (cuda when available, else cpu), cpu, cuda or cuda:N."""
    stop_grace_s: float = knob(300.0, WAITING, range="[0, inf)")
    """After the first Ctrl-C/SIGTERM, how long the current step may take to finish (it is then saved)
    before it is aborted as by a second signal (the step before it is saved); 0: wait however long it takes."""
    dist_timeout_s: float = knob(300.0, WAITING, range="(0, inf)")
    """Under several ranks: how long a collective may wait for the other ranks before this rank ends
    with one line saying another rank stopped answering (a rank that died or hangs; gloo and NCCL)."""


@dataclass
class TrainerConfig(LoopConfig):
    steps: int = knob(30, STEPS, range="[1, inf)")
    """Rollout/update iterations."""
    nproc: int = knob(1, (NUMERICS, "the order of the gradient sum over ranks (rollouts are seeded per prompt)"),
                      range="[1, inf)")
    """Data-parallel ranks to start on this machine through torch's launcher (1: this process only;
    under torchrun leave it 1: --nproc-per-node decides). trainer.num_prompts must be a multiple of the ranks."""
    strategy: str = knob(
        "ddp", (NUMERICS, "the order of the gradient sum over ranks; checkpoints hold whole tensors either way"))
    """How the ranks hold the learner: ddp (every rank a full replica, gradients all-reduced) or fsdp2
    (the decoder's layers sharded over the ranks with fully_shard; LoRA only; needs several ranks)."""
    num_prompts: int = knob(4, (HARMFUL, "the batch size"), range="[1, inf)")
    """Prompts per rollout batch (each sampled sampler.n times)."""
    micro_batch_size: int = knob(16, MICRO_BATCH, range="[1, inf)")
    """Sequences per forward/backward pass (gradient accumulation inside a mini-batch)."""
    max_minutes: float = knob(0.0, (HARMLESS, "where to stop; the steps run are unchanged"), range="[0, inf)")
    """Wall-clock budget: stop after the step that crosses it, then evaluate and checkpoint (0: off)."""


@dataclass
class OptimConfig:
    lr: float = knob(2e-4, OPTIMIZER, range="(0, inf)")
    """AdamW learning rate."""
    weight_decay: float = knob(0.0, OPTIMIZER, range="[0, inf)")
    """AdamW weight decay."""
    betas: list[float] = knob(resume=OPTIMIZER, factory=lambda: [0.9, 0.99], range="[0, 1)")
    """AdamW betas."""
    warmup_steps: int = knob(3, OPTIMIZER, range="[0, inf)")
    """Linear warm-up, in optimizer steps."""
    schedule: str = knob("constant", OPTIMIZER)
    """After warm-up: constant, linear (to 0) or cosine (to 0)."""
    max_grad_norm: float = knob(1.0, OPTIMIZER, range="[0, inf)")
    """Gradient clipping by global norm (0: off)."""


EPISODES = (HARMFUL, "the episodes: what the policy sees after its own turns")


@dataclass
class EpisodeConfig:
    """Multi-turn episodes (rlft/episodes): the policy's replies may call ``tools``; each call's result is
    appended as a tool message and the policy continues, until it replies without a call or a limit
    below ends the episode."""

    env: str | None = knob(None, EPISODES)
    """An environment class 'pkg.module:Class' that answers the policy between its turns (rlft.episodes.env:
    built per episode from its problem, stepped with each reply); None: the tools, or one reply per episode."""
    max_turns: int = knob(4, EPISODES, range="[1, inf)")
    """Policy turns per episode at most; an episode whose last turn still calls a tool ends truncated."""
    max_tokens: int = knob(0, EPISODES, range="[0, inf)")
    """Tokens of an episode after its prompt at most (the policy's and the environment's); a turn that
    would pass it ends the episode truncated (0: no total cap; each turn takes up to
    sampler.max_new_tokens, and episode.max_turns bound the episode)."""
    env_timeout_s: float = knob(60.0, (HARMLESS, "a limit that, when it acts, ends the run"), range="[0, inf)")
    """Wall-clock limit of one call into episode.env (building an environment, or one step); past it the
    run ends with one line naming the environment (0: no limit). The environments run in worker processes
    (episode.env_workers): a call blocked inside C code is stopped too (its worker is killed)."""
    schedule: str = knob("auto", (NUMERICS, "which turns share an engine step (batched kernels' rounding)"))
    """How the episodes of a rollout advance: continuous (each turn is its own request, and an episode's next
    turn enters the engine as soon as its environment has answered, while others generate or wait: vLLM only),
    lockstep (every episode's turn k, then every environment, then turn k + 1), or auto (continuous under
    sampler=vllm, lockstep under hf). The same seeds give the same episodes either way (token for token in fp32 on
    the CPU; in bf16 and on a GPU up to the rounding of kernels that depend on the batch)."""
    env_workers: int = knob(32, (HARMLESS, "how many environment calls run at once; the episodes are unchanged"),
                            range="[1, inf)")
    """Worker processes that run the user tools' calls (and hold the episode.env environments) of the episodes
    waiting on them, all at once: sized for calls that wait (an API, a test suite), not for cores. Kept for the
    whole run; a tool's worker that dies or hangs is replaced. The built-in python tool runs at most one program
    per CPU core."""
    worker_start: str = knob("server", (HARMLESS, "where workers start; what they run is the same code"))
    """Where the user tools' and episode.env's worker processes are forked from: server (a small process started
    once per job, which imports their modules afresh: what your program sets in those modules after import, such as
    a client stored in a module global, is not seen there) or fork (the trainer: the workers see its state as it
    was when each started, and each keeps a copy of the memory the trainer writes afterwards, which ran a 24 GB
    machine out of memory at trainer.micro_batch_size=16 on the tool task: docs/results.md). Closures, functions
    of the trainer's script and modules a fresh import does not find are forked under server too (said at start-up)."""
    tool_timeout_s: float = knob(10.0, EPISODES, range="(0, inf)")
    """Wall-clock limit of one tool call; past it the call is stopped and the policy reads an error
    message instead of a result."""
    tool_output_chars: int = knob(2000, EPISODES, range="[1, inf)")
    """A tool result longer than this many characters is cut to them (the policy reads a note saying so)."""
    python_memory_mb: int = knob(1024, EPISODES, range="[32, inf)")
    """Memory limit of the built-in python tool: of each of its processes (address space), and of all of them
    together where a cgroup can be made (python_sandbox=bwrap as root, or a delegated cgroup v2; its /tmp
    files count); docs/usage.md#the-python-sandbox."""
    python_sandbox: str = knob("bwrap", EPISODES)
    """Where the python tool runs the policy's code: bwrap (namespaces: no view of your files, the trainer's
    processes or the network; the run stops at start-up when it cannot start here) or process (a process of
    your user under limits only: it can read and write what you can). docs/usage.md#the-python-sandbox."""
    python_max_procs: int = knob(16, EPISODES, range="[1, inf)")
    """Processes and threads of one python tool call at most, all together (python_sandbox=bwrap: its cgroup's
    pids limit, else RLIMIT_NPROC in its own user namespace)."""
    tool_format: str = knob("auto", EPISODES)
    """How the tools are shown to the policy and its calls read: template (the tokenizer's chat template
    renders them, tools=), rlft (rlft's system prompt with <tool_call>{json}</tool_call> calls: see
    docs/usage.md), or auto (template when the chat template takes tools, else rlft)."""
    tool_role: str = knob("tool", EPISODES)
    """The role tool results come back in: tool (one tool message per call), or user (one user message holding
    each result in <tool_response></tool_response>: for chat templates that take only alternating user/assistant
    turns, as Gemma's and Mistral's; the run stops at start-up, saying so, when the template refuses a tool message)."""
    max_tool_calls: int = knob(1, EPISODES, range="[1, inf)")
    """Tool calls of one reply that are run, at most (>= 1); the policy reads an error for each call after them
    (too_many_calls). The default is verl's multi-turn max_parallel_calls (1, in verl/trainer/config/rollout/
    rollout.yaml), which drops the extra calls unanswered instead."""


@dataclass
class Config:
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logger: LoggerConfig = knob(resume=(HARMLESS, "logging only"), factory=LoggerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    tools: list[str] = knob(resume=EPISODES, factory=list)
    """Tools the policy may call: built-in names (python, calculator) or dotted paths 'pkg.module:function'
    (described to the policy from the signature and docstring); [] (default): one reply per episode."""
    seed: int = knob(0, (HARMFUL, "the data order and sampling seeds"), range="[0, 4294967295]")
    """Seeds data order, sampling and initialisation."""


def sections(cls: type) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``(title, field names)`` per ``section`` of ``cls``'s fields, in the order of their first field."""
    out: dict[str, list[str]] = {}
    for f in dataclasses.fields(cls):
        if "section" in f.metadata:
            out.setdefault(f.metadata["section"], []).append(f.name)
    return tuple((title, tuple(names)) for title, names in out.items())


def resume_classes(cls: type, prefix: str = "") -> dict[str, tuple[str, str]]:
    """Each field's resume ``(class, why)`` by its full key; a section field's under ``key.``."""
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[str, str]] = {}
    for f in dataclasses.fields(cls):
        key, sub = f"{prefix}{f.name}", hints[f.name]
        is_section = dataclasses.is_dataclass(sub)
        if "resume" in f.metadata:
            out[f"{key}." if is_section else key] = f.metadata["resume"]
        if is_section:
            out.update(resume_classes(sub, f"{key}."))
    return out


ALGO_SECTIONS = sections(AlgoConfig)
