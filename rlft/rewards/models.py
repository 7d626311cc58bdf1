"""Reward models: a trained scorer (a Hugging Face sequence-classification model with one label) as a
:class:`rlft.rewards.scorer.Scorer`.

Each model reads a reply through its own tokenizer and chat template, which may differ from the
policy's: the conversation [user: prompt (or the row's messages), assistant: completion] rendered by
its template, or prompt + completion as plain text, the way ``rlft rm`` trained it when the
directory holds its record (rlft.data.conversation.RECORD), else with the defaults (TRL's models:
chat template when it has one, no system prompt, 1024 tokens); the RewardModelConfig's own fields
override both. Special-token strings the policy writes stay text (rlft.data.safe_tokens). Replies
are scored in batches of ``batch_size``, sorted by length, right-padded with the model's pad id,
without gradients, on the learner's device; the score is the model's own pooled output (its head at
the last non-pad token), as TRL's trainers read it, that head computed in fp32 on the hidden state cast
to fp32 whatever ``dtype`` the backbone runs in (its weights read in fp32 as stored, a bf16 head upcast:
rlft.models.score_head). A rendering longer than ``max_length`` keeps the
whole prompt and the reply's end, its beginning cut (``reward/<name>/truncated_frac``); one whose
prompt leaves no room for the reply is unscored, NaN (``reward/<name>/too_long_frac``); see
rlft.data.conversation for why, against verl's right-truncation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from rlft.data.conversation import Fitted, Rendering, conversation_ids, fit_conversation, read_rendering
from rlft.errors import ModelError
from rlft.models.loading import DTYPES
from rlft.models.score_head import fp32_head, stored_head
from rlft.paths import user_path
from rlft.rewards.functions import Sample

if TYPE_CHECKING:
    from rlft.config.schemas.reward import RewardModelConfig

SEQUENCE_CLASSIFICATION = "ForSequenceClassification"


def check_reward_model(m: RewardModelConfig) -> None:
    """Start-up checks from the directory's config.json alone (no weights load).

    Raises:
        ModelError: the path does not exist, holds no Hugging Face model, or holds one that is not a
            sequence-classification model with one label.
    """
    src = user_path(m.path)
    where = f"reward.models: {m.path}"
    if not src.exists():
        raise ModelError(f"{where}: no such directory")
    if not (src / "config.json").is_file():
        raise ModelError(f"{where}: not a Hugging Face model directory (no config.json)")
    try:
        config = json.loads((src / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{where}: cannot read config.json ({type(e).__name__}: {e})") from None
    archs = config.get("architectures") or []
    if not any(str(a).endswith(SEQUENCE_CLASSIFICATION) for a in archs):
        raise ModelError(f"{where}: not a sequence-classification model (architectures: {', '.join(archs) or 'none'}); "
                         "a reward model is an AutoModelForSequenceClassification with one label (num_labels=1)")
    labels = len(config["id2label"]) if config.get("id2label") else int(config.get("num_labels", 2))
    if labels != 1:
        raise ModelError(f"{where}: has {labels} labels; a reward model has one scalar output (num_labels=1)")


class RewardModel:
    """A loaded reward model, scoring replies (see the module docstring).

    Attributes:
        notes: What the run log should say about it (a pad token set from EOS); the trainer prints them.
    """

    kind = "model"

    def __init__(self, m: RewardModelConfig, device: torch.device, dtype: str):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer  # slow; only when a model loads

        check_reward_model(m)
        self.name, self.weight = m.label, float(m.weight)
        self.batch_size, self.device = m.batch_size, device
        self.rendering = scoring_rendering(m, read_rendering(user_path(m.path)))
        self.notes: list[str] = []
        src = str(user_path(m.path))
        try:
            tok = AutoTokenizer.from_pretrained(src)
        except Exception as e:  # noqa: BLE001  (transformers raises anything on a broken directory)
            raise ModelError(f"reward.models: {m.path}: cannot load its tokenizer: {type(e).__name__}: {e}") from None
        if tok.pad_token_id is None:
            if tok.eos_token_id is None:
                raise ModelError(f"reward.models: {m.path}: its tokenizer has neither a pad nor an EOS token; "
                                 "set pad_token in its tokenizer_config.json")
            tok.pad_token = tok.eos_token  # what TRL's trainers and most users do
            self.notes.append(f"reward model {self.name}: its tokenizer has no pad token; padding with its EOS "
                              f"token {tok.eos_token!r}")
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                src, dtype=DTYPES[dtype], attn_implementation="sdpa" if device.type == "cuda" else "eager")
        except Exception as e:  # noqa: BLE001
            raise ModelError(f"reward.models: {m.path}: cannot load the model: {type(e).__name__}: {e}") from None
        # the head in fp32, with the values its files hold (a loader in bf16 rounded them)
        fp32_head(model, stored_head(user_path(m.path)) if DTYPES[dtype] != torch.float32 else None)
        if model.config.pad_token_id is None:  # its pooling finds the last token that is not the pad id
            model.config.pad_token_id = tok.pad_token_id
        self.pad_id = int(model.config.pad_token_id)
        self.model = model.to(device).eval().requires_grad_(False)
        self.tokenizer = tok
        self.dtype = dtype
        self._counts = {"truncated": 0, "too_long": 0}

    def render(self, s: Sample) -> list[int]:
        """The token ids the model reads for one reply (all of them, before ``max_length``)."""
        prompt, system = self._prompt(s)
        r = self.rendering
        return conversation_ids(self.tokenizer, prompt, s.completion, system, r.chat_template)

    def fit(self, s: Sample) -> Fitted:
        """:meth:`render` fitted to ``max_length`` (rlft.data.conversation.fit_conversation)."""
        prompt, system = self._prompt(s)
        r = self.rendering
        return fit_conversation(self.tokenizer, prompt, s.completion, system, r.chat_template, r.max_length)

    def _prompt(self, s: Sample) -> tuple[Any, str | None]:
        """The sample's prompt as this model reads it, and the system prompt: the row's own system message
        stands in for the rendering's."""
        if not (self.rendering.chat_template and getattr(self.tokenizer, "chat_template", None) and s.messages):
            return s.prompt, self.rendering.system_prompt
        own = s.messages[0].get("role") == "system"
        return list(s.messages), None if own else self.rendering.system_prompt

    def score(self, samples: Sequence[Sample]) -> list[float]:
        """One score per reply; NaN where the prompt leaves no room for the reply within ``max_length``."""
        fits = [self.fit(s) for s in samples]
        self._counts["truncated"] += sum(f.cut and f.ids is not None for f in fits)
        self._counts["too_long"] += sum(f.ids is None for f in fits)
        scored = [i for i, f in enumerate(fits) if f.ids is not None]
        order = sorted(scored, key=lambda i: -len(fits[i].ids))
        out = [math.nan] * len(fits)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            for i, value in zip(chunk, self._forward([fits[i].ids for i in chunk])):
                out[i] = value
        return out

    @torch.inference_mode()
    def _forward(self, rows: list[list[int]]) -> list[float]:
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        logits = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device)).logits
        return logits[:, 0].float().cpu().tolist()

    def take_counts(self) -> dict[str, int]:
        """Events since the last call: ``truncated`` (replies whose beginning was cut to fit ``max_length``),
        ``too_long`` (replies left unscored: the prompt leaves them no room)."""
        counts, self._counts = self._counts, dict.fromkeys(self._counts, 0)
        return counts

    def describe(self) -> str:
        return f"{self.weight:g} x {self.name} (reward model, {self.dtype})"


def scoring_rendering(m: RewardModelConfig, record: Rendering | None) -> Rendering:
    """How model ``m`` reads replies: its config's fields where set, else its record's, else the defaults."""
    base = record or Rendering()
    return Rendering(base.chat_template if m.chat_template is None else m.chat_template,
                     base.system_prompt if m.system_prompt is None else (m.system_prompt or None),
                     base.max_length if m.max_length is None else m.max_length)


def load_reward_models(models: Sequence[RewardModelConfig], device: torch.device, compute_dtype: str) -> list[Any]:
    """Each configured model, loaded once; ``dtype=auto`` takes ``compute_dtype`` (the learner's)."""
    return [RewardModel(m, device, compute_dtype if m.dtype == "auto" else m.dtype) for m in models]
