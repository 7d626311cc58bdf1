"""Generative judges (``reward.judges``): a causal LM reads a rubric holding the prompt, the policy's
reply and the reference answer, and its reply, decoded by one of rlft's samplers (hf or vllm, greedy
by default), is parsed into a score (rlft.rewards.rubric): only its last non-empty line is read. The
rubric's fields are the data's and the policy's text: tags the rubric writes are broken inside them and
special-token strings stay text (rlft.data.safe_tokens).

A :class:`JudgeScorer` is a :class:`rlft.rewards.scorer.Scorer` of kind ``judge``: a reply that states
no readable score is NaN (the judge is left out of that sample's total) and counted as ``unparsed``;
on vLLM a rubric too long for the engine is not sent and counted as ``too_long`` (the rollout logs
both as ``reward/<name>/<event>_frac``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from rlft.config.schemas.model import LoraConfig
from rlft.config.validation import resolve_sampler_name
from rlft.data.chat import filled_prompt_ids, prompt_room
from rlft.errors import ModelError
from rlft.models.loading import DTYPES, load_base
from rlft.paths import user_path
from rlft.rewards.functions import Sample
from rlft.rewards.rubric import (
    DEFAULT_VERDICTS,
    default_template,
    guard_fields,
    normalise,
    parse_score,
    parse_verdict,
    render,
)
from rlft.samplers import SamplingParams, build_sampler

if TYPE_CHECKING:
    from rlft.config.schemas import Config
    from rlft.config.schemas.model import ModelConfig
    from rlft.config.schemas.reward import JudgeConfig
    from rlft.samplers import Sampler

NAMED_MODELS = {"smollm2_135m": "smollm2_gguf", "tiny": "tiny"}
"""``reward.judges[i].model`` names that are not a directory, and the model.source each loads."""


class JudgeScorer:
    """Scores samples with one judge model through a sampler it owns.

    Attributes:
        replies: The judge's reply to each sample of the last call (None: its rubric did not fit).
    """

    kind = "judge"

    def __init__(self, cfg: JudgeConfig, sampler: Sampler, tokenizer: Any, room: int | None = None,
                 backend: str = "hf"):
        """``room``: the longest rubric, in tokens, the sampler can answer (None: no limit)."""
        self.name, self.weight = cfg.name, float(cfg.weight)
        self.cfg, self.sampler, self.tokenizer, self.room, self.backend = cfg, sampler, tokenizer, room, backend
        self.template = judge_template(cfg)
        self.verdicts = cfg.verdicts if cfg.verdicts is not None else DEFAULT_VERDICTS
        self.params = SamplingParams(n=1, temperature=cfg.temperature or 1.0, max_new_tokens=cfg.max_new_tokens,
                                     greedy=cfg.temperature == 0)
        self.replies: list[str | None] = []
        # too_long only where there is a limit (vLLM's max_model_len): its metric exists only there.
        self._counts = {"unparsed": 0, **({"too_long": 0} if room is not None else {})}

    def score(self, samples: Sequence[Sample]) -> list[float]:
        """One score per sample (NaN: the judge's reply stated none, or the rubric was too long)."""
        prompts = [self.rubric_ids(s) for s in samples]
        fits = [self.room is None or len(p) <= self.room for p in prompts]
        texts = iter(self.generate([p for p, ok in zip(prompts, fits) if ok]))
        self.replies = [next(texts) if ok else None for ok in fits]
        values = [self.parse(t) if t is not None else None for t in self.replies]
        self._counts["unparsed"] += sum(v is None and t is not None for v, t in zip(values, self.replies))
        if "too_long" in self._counts:
            self._counts["too_long"] += fits.count(False)
        return [math.nan if v is None else v for v in values]

    def take_counts(self) -> dict[str, int]:
        """Events since the last call: ``unparsed`` (a reply with no readable score), ``too_long`` (vLLM:
        a rubric not sent)."""
        counts, self._counts = self._counts, dict.fromkeys(self._counts, 0)
        return counts

    def describe(self) -> str:
        return f"{self.weight:g} x {self.name} (judge {self.cfg.model}, {self.cfg.kind}, {self.backend})"

    def rubric_ids(self, s: Sample) -> list[int]:
        """The rubric of one sample as ids: its fields' tags broken (rubric.render) and any special-token
        string in them tokenized as text, so a reply cannot end the user turn and write the judge's answer."""
        fields = guard_fields(self.template, s.prompt, s.completion, s.answer)  # render guards again: no change
        return filled_prompt_ids(self.tokenizer, lambda c: render(self.template, *c), fields)

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
        score = parse_score(reply, c.min_score, c.max_score, c.score_format)
        return None if score is None else normalise(score, c.min_score, c.max_score)


def judge_template(cfg: JudgeConfig) -> str:
    if cfg.template is not None:
        return cfg.template
    return default_template(cfg.kind, cfg.min_score, cfg.max_score, cfg.verdicts or DEFAULT_VERDICTS,
                            cfg.score_format)


def check_judge_model(model: str, key: str) -> None:
    """Start-up check from the directory's config.json alone (no weights load): a named model, or a
    directory whose config.json describes a causal LM.

    Raises:
        ModelError: naming ``key`` (e.g. ``reward.judges[0].model``) and what to give instead.
    """
    if model in NAMED_MODELS:
        return
    names = ", ".join(NAMED_MODELS)
    src = user_path(model)
    if not src.is_dir():
        why = "not a directory" if src.exists() else "no such directory"
        raise ModelError(f"{key}={model}: {why}; give a local causal LM directory (Hugging Face format) or one "
                         f"of {names}")
    try:
        config = json.loads((src / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{key}={model}: not a Hugging Face model directory (config.json: "
                         f"{type(e).__name__})") from None
    # transformers' auto mappings take seconds to import: only when a judge names a directory.
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    archs = config.get("architectures") or []
    causal = config.get("model_type") in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
        not archs or any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs))
    if not causal:
        what = ", ".join(archs) or f"model_type {config.get('model_type')!r}"
        raise ModelError(f"{key}={model}: not a causal LM ({what}); a judge generates its verdict, so it needs a "
                         "model transformers loads with AutoModelForCausalLM")


def judge_model_config(j: JudgeConfig, policy: ModelConfig, dtype: str) -> ModelConfig:
    """The ModelConfig that loads judge ``j``: the policy's settings (tiny shape, attention kernel),
    its own weights, no adapter."""
    source = NAMED_MODELS.get(j.model, "path")
    return dataclasses.replace(policy, name=j.model, source=source, path=j.model if source == "path" else None,
                               dtype=dtype, gradient_checkpointing=False,
                               lora=dataclasses.replace(LoraConfig(), enabled=False))


def build_judges(cfg: Config, dtype: str, device: torch.device | str = "cpu") -> list[JudgeScorer]:
    """One scorer per ``reward.judges`` entry, each with its own model and sampler on ``device`` (a
    vLLM judge: an engine of its own, with ``sampler.vllm``'s settings), in ``dtype`` (the policy's)."""
    out = []
    for i, j in enumerate(cfg.reward.judges):
        model_cfg = judge_model_config(j, cfg.model, dtype)
        backend = resolve_sampler_name(j.sampler if j.sampler != "auto" else cfg.sampler.name)
        sampler_cfg = dataclasses.replace(cfg.sampler, name=backend, n=1, max_new_tokens=j.max_new_tokens)
        # A vLLM engine loads its own weights: the transformers copy (stop tokens; tiny's weights to save
        # for the engine) stays on the CPU, not on the GPU whose free memory the engine sizes itself by.
        where = device if backend == "hf" else "cpu"
        try:
            model, tokenizer = load_base(model_cfg, DTYPES[dtype], cfg.seed, where)
        except ModelError as e:
            raise ModelError(f"reward.judges[{i}].model={j.model}: {e}") from None
        sampler = build_sampler(sampler_cfg, model_cfg, model, tokenizer, cfg.seed, device)
        room = prompt_room(sampler_cfg)
        out.append(JudgeScorer(j, sampler, tokenizer, room[0] if room else None, backend))
    return out
