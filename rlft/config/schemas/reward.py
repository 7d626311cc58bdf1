"""``reward``: reward functions, reward models and judges, and how their calls run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from rlft.config.schemas.fields import EVAL_ONLY, HARMLESS, LABEL, NUMERICS, REWARD, TIMEOUT, knob

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
