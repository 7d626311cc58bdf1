"""Generative judges (``reward.judges``): a causal LM reads a rubric holding the prompt, the policy's
reply and the reference answer, and its reply, decoded by one of rlft's samplers (hf or vllm, greedy
by default), is parsed into a score (rlft.rewards.rubric).

A :class:`JudgeScorer` has the scorer shape the rollout mixes with ``reward.fns``: ``name``,
``weight``, ``score(samples) -> list[float]`` (NaN: unscored) and ``events``, per-sample flags of the
last call that the rollout logs as ``reward/NAME_EVENT_frac``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from rlft.config import ConfigError
from rlft.paths import user_path
from rlft.rewards.registry import Sample
from rlft.rewards.rubric import (
    DEFAULT_VERDICTS,
    check_template,
    default_template,
    normalise,
    parse_score,
    parse_verdict,
    render,
)

if TYPE_CHECKING:
    from rlft.config.schemas import Config, JudgeConfig, ModelConfig
    from rlft.samplers import Sampler

NAMED_MODELS = {"smollm2_135m": "smollm2_gguf", "tiny": "tiny"}
"""``reward.judges[i].model`` names that are not a directory, and the model.source each loads."""

KINDS = ("score", "verdict")


class JudgeScorer:
    """Scores samples with one judge model through a sampler it owns."""

    def __init__(self, cfg: JudgeConfig, sampler: Sampler, tokenizer: Any, room: int | None = None):
        """``room``: the longest rubric, in tokens, the sampler can answer (None: no limit)."""
        from rlft.samplers import SamplingParams

        self.name, self.weight = cfg.name, cfg.weight
        self.cfg, self.sampler, self.tokenizer, self.room = cfg, sampler, tokenizer, room
        self.template = judge_template(cfg)
        self.verdicts = cfg.verdicts if cfg.verdicts is not None else DEFAULT_VERDICTS
        self.params = SamplingParams(n=1, temperature=cfg.temperature or 1.0, max_new_tokens=cfg.max_new_tokens,
                                     greedy=cfg.temperature == 0)
        self.events: dict[str, list[bool]] = {}
        """Per-sample flags of the last call: unparsed (the reply stated no score), too_long (vLLM)."""
        self.replies: list[str | None] = []
        """The judge's reply to each sample of the last call (None: its rubric did not fit)."""

    def score(self, samples: Sequence[Sample]) -> list[float]:
        """One score per sample (NaN: the judge's reply stated none, or the rubric was too long)."""
        prompts = [self.rubric_ids(s) for s in samples]
        fits = [self.room is None or len(p) <= self.room for p in prompts]
        texts = iter(self.generate([p for p, ok in zip(prompts, fits) if ok]))
        self.replies = [next(texts) if ok else None for ok in fits]
        values = [self.parse(t) if t is not None else None for t in self.replies]
        self.events = {"unparsed": [v is None and t is not None for v, t in zip(values, self.replies)]}
        if self.room is not None:  # vLLM's max_model_len
            self.events["too_long"] = [not ok for ok in fits]
        return [math.nan if v is None else v for v in values]

    def rubric_ids(self, s: Sample) -> list[int]:
        from rlft.data.chat import prompt_ids

        return prompt_ids(self.tokenizer, render(self.template, s.prompt, s.completion, s.answer))

    def generate(self, prompts: list[list[int]]) -> list[str]:
        out: list[str] = []
        for start in range(0, len(prompts), self.cfg.batch_size):
            gens = self.sampler.generate(prompts[start : start + self.cfg.batch_size], self.params)
            out += self.tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
        self.sampler.sleep()  # vLLM on a GPU: the learner gets the engine's memory back
        return out

    def parse(self, reply: str) -> float | None:
        """The reply's score: a number on [min_score, max_score] rescaled to [0, 1], or a verdict's value."""
        c = self.cfg
        if c.kind == "verdict":
            return parse_verdict(reply, self.verdicts)
        score = parse_score(reply, c.min_score, c.max_score)
        return None if score is None else normalise(score, c.min_score, c.max_score)


def judge_template(cfg: JudgeConfig) -> str:
    if cfg.template is not None:
        return cfg.template
    return default_template(cfg.kind, cfg.min_score, cfg.max_score, cfg.verdicts or DEFAULT_VERDICTS)


def check_judges(cfg: Config) -> None:
    """The start-up checks of ``reward.judges``, before any model loads: templates, kinds, ranges,
    names, and that each model is a causal LM (its config.json read, not its weights).

    Raises:
        ConfigError: naming the judge's key and what to change.
    """
    names = list(cfg.reward.fns)
    for i, j in enumerate(cfg.reward.judges):
        key = f"reward.judges[{i}]"
        if j.kind not in KINDS:
            raise ConfigError(f"{key}.kind='{j.kind}'; valid choices: {', '.join(KINDS)}")
        if j.template is not None:
            check_template(j.template, f"{key}.template")
        if j.kind == "score" and not j.min_score < j.max_score:
            raise ConfigError(f"{key}: min_score={j.min_score:g} must be below max_score={j.max_score:g}")
        if j.kind == "verdict" and j.verdicts is not None and (not j.verdicts or not all(w.strip() for w in j.verdicts)):
            raise ConfigError(f"{key}.verdicts={dict(j.verdicts)} needs at least one verdict, each a non-empty word")
        for field, value in (("max_new_tokens", j.max_new_tokens), ("batch_size", j.batch_size)):
            if value < 1:
                raise ConfigError(f"{key}.{field}={value} must be at least 1")
        if j.temperature < 0:
            raise ConfigError(f"{key}.temperature={j.temperature:g} must be >= 0 (0: greedy)")
        if j.sampler not in ("auto", "hf", "vllm"):
            raise ConfigError(f"{key}.sampler='{j.sampler}'; valid choices: auto, hf, vllm")
        if j.name in names:
            raise ConfigError(f"{key}.name='{j.name}' is already the name of a reward function or judge: its "
                              "metrics would mix; give each judge its own name")
        names.append(j.name)
        _check_causal_lm(j.model, f"{key}.model")


def _check_causal_lm(model: str, key: str) -> None:
    """A named model, or a directory whose config.json describes a causal LM."""
    if model in NAMED_MODELS:
        return
    names = ", ".join(NAMED_MODELS)
    src = user_path(model)
    if not src.is_dir():
        why = "not a directory" if src.exists() else "no such directory"
        raise ConfigError(f"{key}={model}: {why}; give a local causal LM directory (Hugging Face format) or one "
                          f"of {names}")
    try:
        config = json.loads((src / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{key}={model}: not a Hugging Face model directory (config.json: "
                          f"{type(e).__name__})") from None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    archs = config.get("architectures") or []
    causal = config.get("model_type") in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
        not archs or any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs))
    if not causal:
        what = ", ".join(archs) or f"model_type {config.get('model_type')!r}"
        raise ConfigError(f"{key}={model}: not a causal LM ({what}); a judge generates its verdict, so it needs a "
                          "model transformers loads with AutoModelForCausalLM")


def judge_model_config(j: JudgeConfig, policy: ModelConfig, dtype: str) -> ModelConfig:
    """The ModelConfig that loads judge ``j``: the policy's settings (tiny shape, attention kernel),
    its own weights, no adapter."""
    from rlft.config.schemas import LoraConfig

    source = NAMED_MODELS.get(j.model, "path")
    return dataclasses.replace(policy, name=j.model, source=source, path=j.model if source == "path" else None,
                               dtype=dtype, gradient_checkpointing=False,
                               lora=dataclasses.replace(LoraConfig(), enabled=False))


def build_judges(cfg: Config, dtype: str, device: torch.device | str = "cpu") -> list[JudgeScorer]:
    """One scorer per ``reward.judges`` entry, each with its own model and sampler on ``device`` (a
    vLLM judge: an engine of its own, with ``sampler.vllm``'s settings), in ``dtype`` (the policy's)."""
    from rlft.config.validation import resolve_sampler_name
    from rlft.data.chat import prompt_room
    from rlft.models import ModelError
    from rlft.models.loading import DTYPES, load_base
    from rlft.samplers import build_sampler

    out = []
    for i, j in enumerate(cfg.reward.judges):
        model_cfg = judge_model_config(j, cfg.model, dtype)
        backend = resolve_sampler_name(j.sampler if j.sampler != "auto" else cfg.sampler.name)
        sampler_cfg = dataclasses.replace(cfg.sampler, name=backend, n=1, max_new_tokens=j.max_new_tokens)
        try:
            model, tokenizer = load_base(model_cfg, DTYPES[dtype], cfg.seed, device)
        except ModelError as e:
            raise ModelError(f"reward.judges[{i}].model={j.model}: {e}") from None
        sampler = build_sampler(sampler_cfg, model_cfg, model, tokenizer, cfg.seed, device)
        room = prompt_room(sampler_cfg)
        out.append(JudgeScorer(j, sampler, tokenizer, room[0] if room else None))
    return out
