"""The config of ``rlft rm``: training a Bradley-Terry reward model on preference pairs.

Composed from conf/rm.yaml, which reuses ``rlft train``'s model/ and logger/ groups; the
sections of its own (data, trainer) are defined here with their defaults, as rlft/config/schemas/ does
for ``rlft train`` (each field's ``knob`` gives its resume class, read by the resume check, and a number's
valid range); the trainer keys both commands share are rlft.config.schemas.trainer.LoopConfig's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlft.config.schemas import resume_classes
from rlft.config.schemas.fields import HARMFUL, HARMLESS, NUMERICS, knob
from rlft.config.schemas.logger import LoggerConfig
from rlft.config.schemas.model import ModelConfig
from rlft.config.schemas.trainer import MICRO_BATCH, STEPS, LoopConfig, OptimConfig
from rlft.config.validation import check_model, check_optim, check_ranges
from rlft.errors import ConfigError

RM_GROUPS = ("model", "logger")
"""Config groups of conf/rm.yaml (shared with ``rlft train``)."""

PAIRS = (HARMFUL, "the training pairs")
HELD_OUT = (HARMFUL, "the held-out pairs, carved out of or kept apart from the training pairs")


@dataclass
class PairsConfig:
    """Preference pairs: rows with a prompt, a chosen and a rejected reply."""

    path: str | None = knob(None, PAIRS)
    """A jsonl/json/parquet/csv file, a save_to_disk folder or a folder of data files (as data=hf reads)."""
    split: str = knob("train", PAIRS)
    """The split of data.path to train on (a single file is the split train)."""
    eval_path: str | None = knob(None, HELD_OUT)
    """Held-out pairs (default: the last data.num_eval rows of data.path)."""
    eval_split: str | None = knob(None, HELD_OUT)
    """The held-out split (of data.eval_path when given, else of data.path)."""
    num_eval: int = knob(64, HELD_OUT, range="[0, inf)")
    """Held-out pairs carved from the end of data.path when neither eval_path nor eval_split is given (0: none)."""
    prompt_field: str = knob("prompt", PAIRS)
    """Column of the prompt: a string, or a list of chat messages {role, content}."""
    chosen_field: str = knob("chosen", PAIRS)
    """Column of the preferred reply: a string, or the assistant's message(s) as a list of messages."""
    rejected_field: str = knob("rejected", PAIRS)
    """Column of the other reply (same forms as chosen)."""
    margin_field: str | None = knob(None, PAIRS)
    """Optional column of a per-pair margin m: the loss becomes -log sigmoid(r_c - r_r - m) (None: no margin)."""
    system_prompt: str | None = knob(None, PAIRS)
    """System message for the chat template (None: the model's default)."""
    chat_template: bool = knob(True, PAIRS)
    """Render prompt + reply with the tokenizer's chat template (false: prompt text + reply text)."""
    max_length: int = knob(1024, PAIRS, range="[0, inf)")
    """Longest sequence in tokens (0: no limit). A longer one keeps its whole prompt and its reply's end,
    where the score is read, its reply's beginning cut, as reward.models scores; a pair whose prompt
    leaves no room for the replies is dropped. Both counted in the log."""


@dataclass
class RMTrainerConfig(LoopConfig):
    steps: int = knob(100, STEPS, range="[1, inf)")
    """Optimizer steps."""
    nproc: int = knob(1, (NUMERICS, "the order of the gradient sum over ranks"), range="[1, inf)")
    """Data-parallel ranks to start on this machine through torch's launcher (1: this process only;
    under torchrun leave it 1: --nproc-per-node decides). trainer.batch_size must be a multiple of the ranks."""
    batch_size: int = knob(8, (HARMFUL, "the batch size"), range="[1, inf)")
    """Pairs per optimizer step (the pairs are shuffled each epoch, seeded by seed); under several ranks
    each takes an equal share of them."""
    micro_batch_size: int = knob(8, MICRO_BATCH, range="[1, inf)")
    """Pairs per forward/backward pass (gradient accumulation inside a step)."""
    export: bool = knob(True, (HARMLESS, "what is written at the end, not what is trained"))
    """At the end, write the trained reward model as a Hugging Face sequence-classification directory
    (LoRA merged) with its tokenizer and the record of how pairs were rendered (rlft_rendering.json: chat
    template, system prompt, max_length; reward.models scores by it), in RUN_DIR/reward_model (also: rlft
    export CHECKPOINT OUT)."""


@dataclass
class RMConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: PairsConfig = field(default_factory=PairsConfig)
    logger: LoggerConfig = knob(resume=(HARMLESS, "logging only"), factory=LoggerConfig)
    trainer: RMTrainerConfig = field(default_factory=RMTrainerConfig)
    optim: OptimConfig = knob(resume=None, factory=lambda: OptimConfig(lr=5e-4, warmup_steps=5))
    """AdamW (lr 5e-4 and 5 warm-up steps here: a reward head learns from a random start)."""
    loss: str = knob("bradley_terry", (HARMFUL, "the loss"))
    """Preference loss registered in rlft.algorithms.preference."""
    seed: int = knob(0, (HARMFUL, "the pair order and the initial score head"), range="[0, 4294967295]")
    """Seeds the pair order and the initialisation of the score head (and of the LoRA adapter)."""


RM_KEY_CLASSES = resume_classes(RMConfig)
"""What changing each key between a checkpoint and its resumption does (see rlft.state.resume_rules)."""


def validate_rm(cfg: RMConfig) -> None:
    """Cross-field checks of ``rlft rm``'s config, each saying what to change."""
    from rlft.algorithms import PREFERENCE_LOSSES  # torch: kept off the config check's start-up

    check_ranges(cfg)
    PREFERENCE_LOSSES.check(cfg.loss, "loss")
    check_model(cfg.model, cfg.trainer.device)
    check_optim(cfg.optim)
    d, t = cfg.data, cfg.trainer
    if not d.path:
        raise ConfigError("rlft rm needs data.path=FILE_OR_DIR: preference pairs with the columns "
                          f"{d.prompt_field}, {d.chosen_field}, {d.rejected_field}")
    if t.batch_size % t.nproc:
        raise ConfigError(f"trainer.batch_size={t.batch_size} must be a multiple of trainer.nproc={t.nproc}: "
                          "each rank takes an equal share of a step's pairs")
    if d.system_prompt and not d.chat_template:
        raise ConfigError("data.system_prompt is a chat message, but data.chat_template=false sends raw text: "
                          "drop one of them")
    if d.eval_split and d.eval_split == d.split and not d.eval_path:
        raise ConfigError(f"data.eval_split={d.eval_split} is the training split (data.split): its rows would be "
                          "trained on; drop data.eval_split to hold out the last data.num_eval rows instead")
    fields = [d.prompt_field, d.chosen_field, d.rejected_field] + ([d.margin_field] if d.margin_field else [])
    if len(set(fields)) < len(fields):
        raise ConfigError(f"data.prompt_field/chosen_field/rejected_field/margin_field must name different columns, "
                          f"got {fields}")
