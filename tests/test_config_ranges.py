"""Every numeric key's valid range: declared beside its default (``knob(..., range=...)``), held by the config
check in one line naming the key, the value and the range, and printed by ``rlft train --help SECTION``."""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from pathlib import Path

import pytest
import yaml

from rlft.config.loading import TRAIN, conf_dir
from rlft.config.rm_schema import RMConfig, RMTrainerConfig
from rlft.config.schemas import Config
from rlft.config.schemas.fields import Range, field_types, valid_values
from rlft.config.schemas.trainer import LoopConfig, TrainerConfig
from rlft.config.validation import check_ranges
from rlft.errors import ConfigError
from tests.support import one_error_line, run_cli


def _rm_validate(cfg):
    from rlft.rm.command import RM_SCHEMA

    RM_SCHEMA.validate(cfg)


SCHEMAS = {"train": (Config, TRAIN.validate), "rm": (RMConfig, _rm_validate)}


def _number_type(kind: typing.Any) -> type | None:
    """int or float for a numeric field's type (``int``, ``float | None``, ``list[float]``), else None."""
    if typing.get_origin(kind) is list:
        kind = typing.get_args(kind)[0]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    kind = args[0] if len(args) == 1 else kind
    return kind if kind in (int, float) else None


def numeric_fields(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, type, dataclasses.Field]]:
    """``(key, owning class, field)`` of every int/float field (Optional and list ones too) under ``cls``; the
    fields of a list of sections (reward.models) under its first entry, ``reward.models[0].batch_size``."""
    for f in dataclasses.fields(cls):
        kind = field_types(cls)[f.name]
        entry = next(iter(typing.get_args(kind)), None)
        if dataclasses.is_dataclass(kind):
            yield from numeric_fields(kind, f"{prefix}{f.name}.")
        elif typing.get_origin(kind) is list and dataclasses.is_dataclass(entry):
            yield from numeric_fields(entry, f"{prefix}{f.name}[0].")
        elif _number_type(kind) is not None:
            yield f"{prefix}{f.name}", cls, f


def with_entries(obj: typing.Any) -> typing.Any:
    """A config (its schema's defaults) with one default entry in each list of sections, so that its keys are
    checked too."""
    for f in dataclasses.fields(obj):
        value, entry = getattr(obj, f.name), next(iter(typing.get_args(field_types(type(obj))[f.name])), None)
        if dataclasses.is_dataclass(value):
            with_entries(value)
        elif isinstance(value, list) and dataclasses.is_dataclass(entry):
            setattr(obj, f.name, [with_entries(entry())])
    return obj


def outside(valid: Range, number: type) -> list[typing.Any]:
    """Values just outside the range (below its low end, above its high end), and the non-finite floats it
    leaves out."""
    low, high = float(valid.low), float(valid.high)
    step = 1 if number is int else 1e-3
    out = []
    if not math.isinf(low):
        out.append(number(low) if valid.low_open else number(low - step))
    if not math.isinf(high):
        out.append(number(high) if valid.high_open else number(high + step))
    if number is float:
        out += [math.inf, math.nan] if math.isinf(low) and math.isinf(high) else [math.inf] * math.isinf(high)
    return out


def cases() -> list:
    out = []
    for schema, (root, _) in SCHEMAS.items():
        for key, cls, f in numeric_fields(root):
            valid = f.metadata.get("range")
            if valid is not None:
                number = _number_type(field_types(cls)[f.name])
                out += [pytest.param(schema, key, cls, f.name, v, id=f"{schema}:{key}={v}") for v in outside(valid, number)]
    return out


def _set(obj: typing.Any, key: str, value: typing.Any) -> str:
    """Set ``key`` (``a.b``, ``reward.models[0].x``) to ``value`` (a list key: its first entry); returns the
    key as a message names it."""
    *path, last = key.split(".")
    for part in path:
        name, _, index = part.partition("[")
        obj = getattr(obj, name)
        obj = obj[int(index[:-1])] if index else obj
    current = getattr(obj, last)
    if isinstance(current, list):
        setattr(obj, last, [value, *current[1:]])
        return f"{key}[0]"
    setattr(obj, last, value)
    return key


def test_every_numeric_key_has_a_range():
    """A new int or float knob cannot be added without its valid range."""
    keys = {schema: [key for key, _, _ in numeric_fields(root)] for schema, (root, _) in SCHEMAS.items()}
    assert len(keys["train"]) > 80 and "algo.gamma" in keys["train"] and "reward.judges[0].temperature" in keys["train"]
    assert "trainer.batch_size" in keys["rm"] and "optim.betas" in keys["rm"]
    missing = [f"{schema}:{key}" for schema, (root, _) in SCHEMAS.items() for key, _, f in numeric_fields(root)
               if not isinstance(f.metadata.get("range"), Range)]
    assert missing == []


def test_defaults_and_presets_lie_in_their_ranges():
    """The ranges forbid no default and no value a conf/ preset sets."""
    for root, _ in SCHEMAS.values():
        check_ranges(with_entries(root()))
    checked = 0
    for path in sorted(Path(conf_dir()).rglob("*.yaml")):
        text = path.read_text()
        root = RMConfig if path.name == "rm.yaml" else Config
        group = path.parent.name
        prefix = [] if path.parent == Path(conf_dir()) or "@package _global_" in text else [group]
        for key, value in _leaves(yaml.safe_load(text) or {}, prefix):
            cls, name = _owner(root, key)
            valid = None if cls is None else next(f for f in dataclasses.fields(cls) if f.name == name).metadata.get("range")
            for v in (value if isinstance(value, list) else [value]):
                if valid is not None and v != "???":
                    assert v in valid, f"{path.name}: {'.'.join(key)}={v} outside {valid}"
                    checked += 1
    assert checked > 30


def _leaves(node: dict, prefix: list[str]) -> typing.Iterator[tuple[list[str], typing.Any]]:
    for k, v in node.items():
        if k in ("defaults", "hydra"):
            continue
        if isinstance(v, dict):
            yield from _leaves(v, [*prefix, k])
        else:
            yield [*prefix, k], v


def _owner(root: type, key: list[str]) -> tuple[type | None, str]:
    cls = root
    for part in key[:-1]:
        cls = field_types(cls).get(part)
        if not dataclasses.is_dataclass(cls):
            return None, ""
    return cls, key[-1]


@pytest.mark.parametrize(("schema", "key", "cls", "name", "value"), cases())
def test_a_value_outside_its_range_is_one_line_naming_key_value_and_range(schema, key, cls, name, value):
    root, validate = SCHEMAS[schema]
    cfg = with_entries(root())
    shown = _set(cfg, key, value)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    message = str(err.value)
    valid = valid_values(cls, name) if shown == key else str(next(
        f for f in dataclasses.fields(cls) if f.name == name).metadata["range"])
    assert message == f"{shown}={value} must be {valid}"


def test_range_notation_and_its_words():
    assert [str(Range.parse(t)) for t in ("[0, 1]", "(0, 1]", "[1, inf)", "(0, inf)", "(-inf, inf)", "(-inf, 0)")] == [
        "in [0, 1]", "in (0, 1]", ">= 1", "> 0", "a finite number", "< 0"]
    assert 0 in Range.parse("[0, 1]") and 0 not in Range.parse("(0, 1]") and 1 not in Range.parse("[0, 1)")
    assert math.nan not in Range.parse("(-inf, inf)") and math.inf not in Range.parse("[0, inf)")
    for bad in ("0..1", "[1, 0]", "[0, inf]", "[-inf, 0)"):
        with pytest.raises(ValueError):
            Range.parse(bad)
    assert valid_values(Config().sampler.__class__, "sync_check_tol") == "> 0, or null"
    assert valid_values(RMConfig().optim.__class__, "betas") == "each entry in [0, 1)"


def test_help_prints_each_range_and_the_shared_trainer_keys():
    from rlft.commands.help import section_help

    algo = section_help("algo")
    assert "  algo.gamma = 1.0\n      Discount (GAE, REINFORCE++'s returns-to-go). Valid: in [0, 1].\n" in algo
    trainer = section_help("trainer")
    assert trainer.index("trainer.steps = 30") < trainer.index("trainer.eval_every = 10")  # its own keys first
    assert "Under several ranks: how long a collective may wait" in trainer and "Valid: > 0." in trainer


def test_the_trainer_sections_share_one_base():
    """rlft train's and rlft rm's trainer sections derive from LoopConfig; a key both declare themselves differs
    in something (default, docstring), else it belongs in the base."""
    from rlft.commands.help import field_docs

    base = {f.name for f in dataclasses.fields(LoopConfig)}
    assert {"save_every", "resume", "stop_grace_s", "dist_timeout_s"} <= base
    own = [set(inspect.get_annotations(cls)) for cls in (TrainerConfig, RMTrainerConfig)]
    assert issubclass(TrainerConfig, LoopConfig) and issubclass(RMTrainerConfig, LoopConfig)
    assert not (own[0] | own[1]) & base
    for name in own[0] & own[1]:
        a, b = (next(f for f in dataclasses.fields(cls) if f.name == name) for cls in (TrainerConfig, RMTrainerConfig))
        same = (a.default, a.metadata, field_docs(TrainerConfig)[name]) == (b.default, b.metadata,
                                                                          field_docs(RMTrainerConfig)[name])
        assert not same, f"trainer.{name} is the same in both: move it to LoopConfig"


@pytest.mark.parametrize(("args", "expected"), [
    (["train", "algo=ppo", "algo.gamma=2"], "rlft: error: algo.gamma=2.0 must be in [0, 1]"),
    (["rm", "data.path=pairs.jsonl", "trainer.batch_size=0"], "rlft: error: trainer.batch_size=0 must be >= 1"),
    (["eval", "sampler.top_p=0"], "rlft: error: sampler.top_p=0.0 must be in (0, 1]"),
])
def test_cli_refuses_an_out_of_range_value_in_one_line(tmp_path, args, expected):
    assert one_error_line(run_cli(args, cwd=tmp_path), 2) == expected
    assert list(tmp_path.iterdir()) == []  # refused before any run directory or result file
