"""Config schemas: one dataclass per section, a short docstring per field.

This is the one place a default is written. The YAML files under ``conf/`` are merged onto these
schemas, so a key missing from YAML takes the default below and a key missing here is a typo; a
group option in conf/ sets only the keys that make it that option (tests/test_config_defaults.py).

Each field also says what changing it between a checkpoint and its resumption does to the run
(``resume``, collected into :data:`rlft.state.resume_rules.KEY_CLASSES`) and, in algo, which algorithm it
belongs to (``section``, collected into :data:`ALGO_SECTIONS` for ``rlft train --help algo``). Every
numeric field says its valid values (``range``, a :class:`rlft.config.schemas.fields.Range` in interval notation, e.g. ``"[0, 1]"``),
which :func:`rlft.config.validation.check_ranges` enforces and ``rlft train --help SECTION`` prints.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field

from rlft.config.schemas.algo import AlgoConfig
from rlft.config.schemas.data import DataConfig
from rlft.config.schemas.episode import EPISODES, EpisodeConfig
from rlft.config.schemas.fields import HARMFUL, HARMLESS, knob
from rlft.config.schemas.logger import LoggerConfig
from rlft.config.schemas.model import ModelConfig
from rlft.config.schemas.reward import RewardConfig
from rlft.config.schemas.sampler import SamplerConfig
from rlft.config.schemas.trainer import OptimConfig, TrainerConfig

GROUPS = ("algo", "model", "sampler", "reward", "data", "logger")


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
