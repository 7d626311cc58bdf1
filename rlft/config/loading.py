"""Loading: conf/ composed through Hydra, shell overrides checked first so that errors name the key
and the valid choices, and every failure turned into one :class:`ConfigError` line."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlft.config.schemas import GROUPS, Config
from rlft.config.validation import validate
from rlft.errors import ConfigError

EXTRA_GROUPS = ("experiment",)
"""Groups with no schema section of their own: ``+experiment=NAME`` presets set keys anywhere."""


@dataclass(frozen=True)
class Schema:
    """What one command's config is composed from: ``rlft train``'s (:data:`TRAIN`) or ``rlft rm``'s."""

    config_name: str
    """The root config, conf/NAME.yaml."""
    root: type
    """Its dataclass schema."""
    groups: tuple[str, ...]
    """The config groups an override may pick (GROUP=OPTION)."""
    validate: Callable[[Any], None]
    """Cross-field checks of a composed config."""
    store_name: str
    """The name its defaults list gives the schema (Hydra's ConfigStore)."""


TRAIN = Schema("config", Config, GROUPS + EXTRA_GROUPS, validate, "rlft_schema")


def conf_dir() -> Path:
    """The config directory: top-level conf/ in a checkout, rlft/conf in an installed wheel."""
    env = os.environ.get("RLFT_CONF_DIR")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent.parent
    checkout = package.parent / "conf"
    if (checkout / "config.yaml").is_file():
        return checkout
    return package / "conf"  # where the wheel puts it


def group_options(group: str) -> list[str]:
    """Names of the YAML files in a config group, sorted."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


# ---------------------------------------------------------------------------------------
# Override checks: done before Hydra so that messages name the key and the valid choices.


def _schema_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _check_key(key: str, root: type = Config) -> None:
    cls: Any = root
    walked: list[str] = []
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            raise ConfigError(f"unknown config key '{key}': '{'.'.join(walked)}' has no sub-keys")
        fields = _schema_fields(cls)
        if part not in fields:
            where = f"'{'.'.join(walked)}'" if walked else "the top level"
            raise ConfigError(
                f"unknown config key '{key}': no '{part}' in {where}; valid keys: {', '.join(fields)}"
            )
        walked.append(part)
        cls = field_type(cls, part)


def field_type(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def _check_group_choice(group: str, value: Any) -> None:
    choices = group_options(group)
    values = value.list if hasattr(value, "list") else [value]
    for v in values:
        if str(v) not in choices:
            raise ConfigError(f"unknown {group} '{v}'; valid choices: {', '.join(choices)}")


def check_overrides(overrides: list[str], schema: Schema = TRAIN) -> list[Any]:
    """Parse shell overrides and reject unknown keys/groups with one clear line.

    Returns:
        Hydra ``Override`` objects, in order.
    """
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as e:
        raise ConfigError(f"cannot parse override: {str(e).splitlines()[0]}") from None
    for ov in parsed:
        key = ov.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        if key in schema.groups:
            _check_group_choice(key, ov.value())
        else:
            _check_key(key, schema.root)
    return parsed


# ---------------------------------------------------------------------------------------
# Loading


def register_schema(schema: Schema = TRAIN) -> None:
    """Make the schema available to its root config's defaults list (conf/config.yaml: ``- rlft_schema``)."""
    ConfigStore.instance().store(name=schema.store_name, node=schema.root)


def to_config(raw: Any, schema: Schema = TRAIN) -> Any:
    """The typed, validated Config of a composed node (``hydra`` removed).

    Raises:
        ConfigError: a missing value, a wrong type, or a failed cross-field check.
    """
    try:
        missing = sorted(OmegaConf.missing_keys(raw))
        if missing:
            raise ConfigError(f"missing value for '{missing[0]}': set it on the command line, e.g. {missing[0]}=...")
        cfg = OmegaConf.to_object(raw)
    except OmegaConfBaseException as e:
        raise ConfigError(_one_line(e)) from None
    schema.validate(cfg)
    return cfg


def compose(overrides: list[str], schema: Schema = TRAIN) -> tuple[Any, Any, str]:
    """Build the run config from conf/ and shell overrides.

    Args:
        overrides: Hydra-style overrides, e.g. ``["algo=grpo", "trainer.steps=3"]``
            (no sweeps: expand those first).

    Returns:
        ``(cfg, resolved, run_dir)``: the typed config, the same as an OmegaConf node
        (for saving), and the resolved ``hydra.run.dir``.

    Raises:
        ConfigError: on any unknown key, bad choice, wrong type or failed cross-field check.
    """
    raw, run_dir = compose_node(overrides, schema)
    return to_config(raw, schema), raw, run_dir


def compose_node(overrides: list[str], schema: Schema = TRAIN) -> tuple[Any, str]:
    """What :func:`compose` composes, before the cross-field checks: the OmegaConf node (``hydra``
    removed) and the resolved ``hydra.run.dir``. Values may still be missing (``???``).

    Raises:
        ConfigError: on any unknown key, bad choice or wrong type.
    """
    parsed = check_overrides(overrides, schema)
    register_schema(schema)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            raw = hydra_compose(schema.config_name, overrides=list(overrides), return_hydra_config=True)
        run_dir = str(raw.hydra.run.dir)
        _check_required_by_presets(raw, {ov.key_or_group for ov in parsed}, schema)
        with _open_struct(raw):
            del raw["hydra"]
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_one_line(e)) from None
    finally:
        GlobalHydra.instance().clear()
    return raw, run_dir


def _check_required_by_presets(raw: Any, given: set[str], schema: Schema) -> None:
    """A ``???`` in a chosen preset says "must be given", but OmegaConf's merge keeps the value beneath it (the
    schema's default), so the run would go on with that default: refuse it unless the command line or a later
    preset gave the key.

    Raises:
        ConfigError: naming the key and the preset.
    """
    defaults = OmegaConf.structured(schema.root)
    for group, option in raw.hydra.runtime.choices.items():
        path = conf_dir() / group / f"{option}.yaml"
        if group.startswith("hydra") or option is None or not path.is_file():
            continue
        text = path.read_text()
        prefix = "" if "@package _global_" in text else f"{group.replace('/', '.')}."
        preset = yaml.safe_load(text) or {}
        preset.pop("defaults", None)
        for key in _missing_leaves(preset, prefix):
            value = OmegaConf.select(raw, key, default=None, throw_on_missing=False)
            if key not in given and value == OmegaConf.select(defaults, key, default=None, throw_on_missing=False):
                raise ConfigError(f"missing value for '{key}': {group}/{option}.yaml sets it to ??? (it must be "
                                  f"given); set it on the command line, e.g. {key}=...")


def _missing_leaves(node: Any, prefix: str) -> list[str]:
    """Dotted keys whose value is ``???`` in a preset's YAML."""
    if not isinstance(node, dict):
        return []
    out = []
    for key, value in node.items():
        if value == "???":
            out.append(f"{prefix}{key}")
        out += _missing_leaves(value, f"{prefix}{key}.")
    return out


def compose_on(saved_yaml: str, overrides: list[str], schema: Schema = TRAIN) -> Any:
    """A saved run config (a checkpoint's ``config.yaml``) with shell overrides applied on top.

    Group overrides (``data=jsonl``) replace that whole section with the group's YAML; key
    overrides (``data.num_eval=50``) set one value.

    Raises:
        ConfigError: as :func:`compose`.
    """
    parsed = check_overrides(overrides, schema)
    try:
        node = OmegaConf.merge(OmegaConf.structured(schema.root), OmegaConf.create(yaml.safe_load(saved_yaml) or {}))
        for ov in parsed:
            key = ov.key_or_group
            if key.startswith("hydra"):
                continue
            if key in schema.groups and key not in EXTRA_GROUPS:
                section = yaml.safe_load((conf_dir() / key / f"{ov.value()}.yaml").read_text()) or {}
                node[key] = OmegaConf.merge(OmegaConf.structured(field_type(schema.root, key)), section)
            else:
                OmegaConf.update(node, key, ov.value(), merge=False)
        cfg = OmegaConf.to_object(node)
    except OmegaConfBaseException as e:
        raise ConfigError(_one_line(e)) from None
    schema.validate(cfg)
    return cfg


class _open_struct:
    def __init__(self, node: Any):
        self.node = node

    def __enter__(self) -> None:
        OmegaConf.set_struct(self.node, False)

    def __exit__(self, *exc: Any) -> None:
        OmegaConf.set_struct(self.node, True)


def _one_line(e: BaseException) -> str:
    cause = e.__cause__ or e.__context__
    if getattr(e, "full_key", None) is None and cause is not None and getattr(cause, "full_key", None):
        e = cause  # Hydra wraps OmegaConf's error, which knows the key
    full_key = getattr(e, "full_key", None)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if full_key:
        return f"invalid value for '{full_key}': {first}"
    return first


