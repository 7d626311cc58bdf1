"""`rlft train --help [SECTION]`: the groups and their options, and each field's docstring."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from functools import cache

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlft.commands.train import split_args
from rlft.config import ALGO_SECTIONS, GROUPS, Config, group_options
from rlft.config.loading import compose_node, field_type
from rlft.config.schemas.fields import valid_values
from rlft.errors import ConfigError
from rlft.paths import quote_home
from rlft.sweep import expand

USAGE = """usage: rlft train [KEY=VALUE ...] [-m] [HYDRA FLAGS]

Fine-tune a language model with RL from the configs in conf/ (a Hydra application).

  rlft train                                  GRPO + LoRA on SmolLM2-135M, arithmetic task
  rlft train algo=dapo trainer.steps=20       pick a group option, override any key
  rlft train model=tiny sampler.n=4           fast random-weight model
  rlft train +experiment=dapo_30min           a published recipe (docs/results.md)
  rlft train hydra.run.dir=runs/exp1          choose the run directory
  rlft train hydra.run.dir=runs/exp1 trainer.resume=auto     continue a stopped run
  rlft train -m algo=grpo,dapo seed=0,1       sweep: every combination, then a summary
  rlft train -m hydra/launcher=joblib hydra.launcher.n_jobs=2 seed=0,1,2,3     jobs in parallel
  rlft train --cfg job                        print the composed config (Hydra: --cfg job|hydra|all)

Config groups (GROUP=OPTION):
{groups}
  +experiment {experiments}

Sections (SECTION.KEY=VALUE): {sections}
  rlft train --help SECTION [KEY=VALUE ...]   every key of a section: its value in that run (a sweep's
                                              first job) and its meaning

Hydra: -m/--multirun, --cfg, --resolve, --info, --hydra-help, tab completion:
eval "$(rlft train -sc install=bash)",
hydra/launcher=basic|joblib|submitit_local|submitit_slurm, hydra/sweeper=basic|optuna
(launchers and Optuna: pip install 'rlft[sweep]'). Exit codes: 0 ok, 1 a run or a sweep job
failed, 2 a config/data/model/checkpoint error, 130 interrupted.
"""


def train_help(args: list[str]) -> str:
    """The usage text, or with a SECTION among ``args`` that section's keys and the values the run
    that ``args``' overrides name would use.

    Raises:
        ConfigError: no such section, or overrides that do not compose.
    """
    sections = [f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(field_type(Config, f.name))]
    words, _ = split_args(args)
    topic = next((w for w in words if "=" not in w), None)
    if topic is None:
        groups = "\n".join(f"  {g:<9} {', '.join(group_options(g))}" for g in GROUPS)
        return USAGE.format(groups=groups, experiments=", ".join(group_options("experiment")),
                            sections=" ".join(sections))
    if topic not in sections:
        raise ConfigError(f"rlft train --help: no section '{topic}'; valid: {', '.join(sections)}")
    return section_help(topic, _first_job(quote_home([w for w in words if "=" in w])))


def _first_job(overrides: list[str]) -> list[str]:
    """The overrides of a sweep's first job (those of a single run unchanged)."""
    fixed, combos = expand(overrides)
    return fixed + combos[0]


def section_help(name: str, overrides: list[str] | None = None) -> str:
    """Each key of a config section, its value in the config composed with ``overrides`` and its
    docstring; algo's keys by algorithm."""
    cls = field_type(Config, name)
    lines = [f"{name}: {(cls.__doc__ or '').strip().splitlines()[0]}" if _own_doc(cls) else f"{name}:"]
    if name in GROUPS:
        lines.append(f"  options ({name}=OPTION): {', '.join(group_options(name))}")
    lines.append(f"  values: those of `{' '.join(['rlft train', *(overrides or [])])}`")
    rows = dict(_rows(cls, name, composed_values(name, overrides or [])))
    if name == "algo":
        for title, keys in ALGO_SECTIONS:
            lines += ["", f"  [{title}]"] + [rows.pop(f"algo.{k}") for k in keys]
        lines += [""] + list(rows.values())  # the display name
    else:
        lines += list(rows.values())
    return "\n".join(lines)


def composed_values(name: str, overrides: list[str]) -> dict[str, typing.Any]:
    """A section of the config conf/ and ``overrides`` compose to, as plain values (presets applied;
    a missing value reads '???'). The cross-field checks are left to the run: help shows what was asked.

    Raises:
        ConfigError: overrides that do not compose.
    """
    node, _ = compose_node(overrides)
    try:
        return OmegaConf.to_container(node[name], resolve=True, throw_on_missing=False)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise ConfigError(f"{name}: {str(e).splitlines()[0]}") from None


def _rows(cls: type, prefix: str, values: dict[str, typing.Any]) -> typing.Iterator[tuple[str, str]]:
    docs = field_docs(cls)
    own = inspect.get_annotations(cls)
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.name not in own):  # a section's own keys before a base's
        key = f"{prefix}.{f.name}"
        sub = field_type(cls, f.name)
        if dataclasses.is_dataclass(sub):
            yield from _rows(sub, key, values[f.name])
            continue
        doc = " ".join(docs.get(f.name, "").split())
        valid = valid_values(cls, f.name)
        doc += f" Valid: {valid}." if valid else ""
        yield key, f"  {key} = {values[f.name]!r}\n      {doc}"
        entry = next(iter(typing.get_args(sub)), None)
        if dataclasses.is_dataclass(entry):  # a list of sections (reward.judges): an entry's keys and defaults
            yield from _rows(entry, f"{key}[i]", dataclasses.asdict(entry()))


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (a string literal right after the field), its dataclass
    bases' fields included."""
    out = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            out.update(_own_field_docs(base))
    return out


def _own_field_docs(cls: type) -> dict[str, str]:
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            out[node.target.id] = inspect.cleandoc(after.value.value)
    return out


def _own_doc(cls: type) -> bool:
    return bool(cls.__doc__) and not cls.__doc__.startswith(cls.__name__ + "(")
