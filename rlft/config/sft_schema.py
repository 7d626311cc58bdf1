"""The config of ``rlft sft``: supervised fine-tuning on demonstrations, rendered as ``rlft train`` renders them.

Composed from conf/sft.yaml, which reuses ``rlft train``'s model/ and logger/ groups; its own sections (data,
trainer) are defined here with their defaults, as rlft/config/schemas/ does for ``rlft train``.
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

SFT_KIND = "sft"
"""``trainer_state.json``'s ``kind`` in a checkpoint of ``rlft sft`` (``rlft export`` and ``rlft eval`` read it)."""
SFT_GROUPS = ("model", "logger")
"""Config groups of conf/sft.yaml (shared with ``rlft train``)."""

EXAMPLES = (HARMFUL, "the training examples")
HELD_OUT = (HARMFUL, "the held-out examples, carved out of or kept apart from the training ones")


@dataclass
class DemosConfig:
    """Demonstrations: conversations whose assistant turns are trained on."""

    path: str | None = knob(None, EXAMPLES)
    """A jsonl/json/parquet/csv file, a save_to_disk folder or a folder of data files (as data=hf reads), with
    prompt + completion columns or a messages column."""
    split: str = knob("train", EXAMPLES)
    """The split of data.path to train on (a single file is the split train)."""
    eval_path: str | None = knob(None, HELD_OUT)
    """Held-out examples (default: the last data.num_eval rows of data.path)."""
    eval_split: str | None = knob(None, HELD_OUT)
    """The held-out split (of data.eval_path when given, else of data.path)."""
    num_eval: int = knob(32, HELD_OUT, range="[0, inf)")
    """Held-out examples carved from the end of data.path when neither eval_path nor eval_split is given (0: none)."""
    prompt_field: str = knob("prompt", EXAMPLES)
    """Column of the prompt (prompt-completion rows): a string, or a list of chat messages {role, content}."""
    completion_field: str = knob("completion", EXAMPLES)
    """Column of the completion: a string, or the assistant's message(s)."""
    messages_field: str = knob("messages", EXAMPLES)
    """Column of a whole conversation (conversational rows; used when the data has it)."""
    system_prompt: str | None = knob(None, EXAMPLES)
    """System message for the chat template (None: the model's default), as rlft train's data.system_prompt: give
    the RL run the same one."""
    max_length: int = knob(1024, EXAMPLES, range="[0, inf)")
    """Longest example in tokens (0: no limit). A longer one is dropped and counted, never cut: a cut reply would
    teach the model to stop without its end."""


@dataclass
class SFTTrainerConfig(LoopConfig):
    steps: int = knob(100, STEPS, range="[1, inf)")
    """Optimizer steps."""
    nproc: int = knob(1, (NUMERICS, "the order of the gradient sum over ranks"), range="[1, inf)")
    """Data-parallel ranks to start on this machine through torch's launcher (1: this process only;
    under torchrun leave it 1). trainer.batch_size must be a multiple of the ranks."""
    batch_size: int = knob(8, (HARMFUL, "the batch size"), range="[1, inf)")
    """Examples per optimizer step (shuffled each epoch, seeded by seed); the loss is the mean over every assistant
    token of the step."""
    micro_batch_size: int = knob(8, MICRO_BATCH, range="[1, inf)")
    """Examples per forward/backward pass (gradient accumulation inside a step; the gradient is the same)."""
    export: bool = knob(True, (HARMLESS, "what is written at the end, not what is trained"))
    """At the end, write the trained model (LoRA merged into the base) with its tokenizer to RUN_DIR/model:
    `rlft train model=local model.path=RUN_DIR/model` starts RL from it, with it as the reference policy."""


@dataclass
class SFTConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DemosConfig = field(default_factory=DemosConfig)
    logger: LoggerConfig = knob(resume=(HARMLESS, "logging only"), factory=LoggerConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = knob(0, (HARMFUL, "the example order and the initial adapter"), range="[0, 4294967295]")
    """Seeds the example order and the initialisation of the LoRA adapter."""


SFT_KEY_CLASSES = resume_classes(SFTConfig)
"""What changing each key between a checkpoint and its resumption does (see rlft.state.resume_rules)."""


def validate_sft(cfg: SFTConfig) -> None:
    """Cross-field checks of ``rlft sft``'s config, each saying what to change."""
    check_ranges(cfg)
    check_model(cfg.model, cfg.trainer.device)
    check_optim(cfg.optim)
    d, t = cfg.data, cfg.trainer
    if not d.path:
        raise ConfigError("rlft sft needs data.path=FILE_OR_DIR: demonstrations with the columns "
                          f"{d.prompt_field} + {d.completion_field}, or {d.messages_field}")
    if t.batch_size % t.nproc:
        raise ConfigError(f"trainer.batch_size={t.batch_size} must be a multiple of trainer.nproc={t.nproc}: "
                          "each rank takes an equal share of a step's examples")
    if d.eval_split and d.eval_split == d.split and not d.eval_path:
        raise ConfigError(f"data.eval_split={d.eval_split} is the training split (data.split): its rows would be "
                          "trained on; drop data.eval_split to hold out the last data.num_eval rows instead")
