"""Defaults in one place: the schema (rlft/config/schemas/) writes every default; a conf/ preset
sets only the keys that make it that preset (the algo presets, which document each recipe, may
also restate defaults), and what conf/ composes to is the schema where no preset speaks."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlft.config import GROUPS, Config, group_options
from tests.support import ROOT

CONF = ROOT / "conf"


def _code_stats() -> Any:
    spec = importlib.util.spec_from_file_location("code_stats", ROOT / "scripts" / "code_stats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    return {k: v for key, sub in node.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}


def _schema() -> dict[str, Any]:
    from omegaconf import OmegaConf

    return _flat(OmegaConf.to_container(OmegaConf.structured(Config)))


def _composed(*overrides: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    from rlft.config.loading import compose_node

    node, _ = compose_node(list(overrides))
    return _flat(OmegaConf.to_container(node, resolve=True, throw_on_missing=False))


def _preset(group: str, option: str) -> tuple[dict[str, Any], dict[str, str]]:
    """What a conf/ file sets, by full key, and the group options its defaults list overrides."""
    path = CONF / group / f"{option}.yaml"
    data = yaml.safe_load(path.read_text()) or {}
    choices = {}
    for entry in data.pop("defaults", []):
        (target, choice), = entry.items()  # "override /reward@_global_.reward": "gsm8k"
        choices[target.removeprefix("override /").split("@")[0]] = choice
    is_global = path.read_text().startswith("# @package _global_")
    return _flat(data, "" if is_global else f"{group}."), choices


def _expected(choices: dict[str, str], experiment: str | None = None) -> dict[str, Any]:
    """The schema's values, overlaid by what the chosen presets set (an experiment's last)."""
    presets = {g: _preset(g, o) for g, o in choices.items()}
    for _, overrides in [*presets.values(), *([_preset("experiment", experiment)] if experiment else [])]:
        choices = {**choices, **overrides}
    out = _schema()
    for g, o in choices.items():
        out.update(_preset(g, o)[0])
    if experiment:
        out.update(_preset("experiment", experiment)[0])
    return out


def _default_choices() -> dict[str, str]:
    entries = yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]
    return {g: o for e in entries if isinstance(e, dict) for g, o in e.items() if g in GROUPS}


def _differences(composed: dict[str, Any], expected: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {k: (composed.get(k), expected.get(k)) for k in composed.keys() | expected.keys()
            if composed.get(k) != expected.get(k)}


def test_the_default_config_is_the_schema_where_no_preset_speaks():
    choices = _default_choices()
    assert set(choices) == set(GROUPS)
    composed = _composed()
    assert not _differences(composed, _expected(choices))
    # config.yaml itself sets no key (only the defaults list and hydra's settings).
    top = yaml.safe_load((CONF / "config.yaml").read_text())
    assert set(top) == {"defaults", "hydra"}
    # The schema and the algo preset a run gets agree on the update schedule (the schema once said 1).
    assert (composed["algo.ppo_epochs"], composed["algo.num_mini_batches"]) == (1, 2) == \
        (_schema()["algo.ppo_epochs"], _schema()["algo.num_mini_batches"])


@pytest.mark.parametrize("group, option", [(g, o) for g in (*GROUPS, "experiment") for o in group_options(g)])
def test_each_preset_composes_to_the_schema_and_its_own_keys(group, option):
    choices = _default_choices()
    if group == "experiment":
        composed, expected = _composed(f"+experiment={option}"), _expected(choices, option)
    else:
        composed, expected = _composed(f"{group}={option}"), _expected({**choices, group: option})
    assert not _differences(composed, expected)


def test_presets_set_only_what_differs_from_the_schema():
    repeats = _code_stats().yaml_default_repeats(ROOT)
    outside_recipes = [r for r in repeats if not r.startswith("algo/")]
    assert not outside_recipes, f"these conf/ keys restate the schema's default; delete them: {outside_recipes}"


def test_yaml_default_repeats_counts_each_key_set_to_its_default(tmp_path: Path):
    (tmp_path / "rlft").symlink_to(ROOT / "rlft")
    files = {
        "config.yaml": "defaults: [rlft_schema]\nseed: 0\ntrainer:\n  steps: 31\nhydra:\n  job:\n    name: x\n",
        "model/m.yaml": "name: m\npath: ???\nlora:\n  alpha: 32\n  enabled: 1\n  target_modules: [q_proj]\n",
        "experiment/e.yaml": "# @package _global_\noptim:\n  betas: [0.9, 0.99]\n  lr: 1.0\n",
        "logger/l.yaml": "# a comment only\n",
    }
    for name, text in files.items():
        (tmp_path / "conf" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "conf" / name).write_text(text)
    # 32 restates the float 32.0; 1 is no bool; ??? and unknown keys (hydra.*) are no defaults.
    assert _code_stats().yaml_default_repeats(tmp_path) == [
        "config.yaml: seed", "experiment/e.yaml: optim.betas", "model/m.yaml: model.lora.alpha"]
