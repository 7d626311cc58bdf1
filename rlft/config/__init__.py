"""rlft's config: schemas (``schemas``), loading through Hydra (``loading``) and cross-field checks
(``validation``). Imports flow one way: schemas <- validation <- loading."""

from rlft.config.loading import check_overrides, compose, compose_on, conf_dir, group_options
from rlft.config.schemas import ALGO_SECTIONS, GROUPS, Config
from rlft.config.validation import validate
from rlft.errors import ConfigError

__all__ = ["ALGO_SECTIONS", "GROUPS", "Config", "ConfigError", "check_overrides", "compose", "compose_on",
           "conf_dir", "group_options", "validate"]
