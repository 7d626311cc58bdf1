"""`rlft train [overrides]`: a thin command line over ``rlft.trainer.train``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

USAGE = """rlft train [KEY=VALUE ...]

Fine-tune a language model with RL from the configs in conf/.

  rlft train                                  GRPO + LoRA on SmolLM2-135M, arithmetic task
  rlft train algo=grpo trainer.steps=20       pick a group option, override any key
  rlft train model=tiny sampler.n=4           fast random-weight model
  rlft train hydra.run.dir=runs/exp1          choose the run directory

Config groups (GROUP=OPTION):
{groups}
"""


def _groups_help() -> str:
    from rlft.config import GROUPS, group_options

    return "\n".join(f"  {g:<9} {', '.join(group_options(g))}" for g in GROUPS)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlft", description="RL fine-tuning of language models from YAML configs.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    train = sub.add_parser(
        "train", help="run a training job", usage=USAGE.format(groups=_groups_help()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("overrides", nargs="*", help="Hydra-style overrides, e.g. algo=grpo trainer.steps=10")
    train.add_argument("--cfg", action="store_true", help="print the resolved config and exit")
    return parser


def fail(message: str, code: int = 2) -> int:
    print(f"rlft: error: {message}", file=sys.stderr)
    return code


def cmd_train(overrides: list[str], show_cfg: bool) -> int:
    from rlft.config import ConfigError, compose

    try:
        cfg, raw, run_dir = compose(overrides)
    except ConfigError as e:
        return fail(str(e))
    from omegaconf import OmegaConf

    resolved = OmegaConf.to_yaml(raw, resolve=True)
    if show_cfg:
        print(resolved, end="")
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rlft.data import DataError
    from rlft.models import ModelError
    from rlft.rewards import RewardError
    from rlft.trainer import train

    try:
        train(cfg, Path(run_dir), resolved)
    except (DataError, ModelError, ConfigError) as e:
        return fail(str(e))
    except RewardError as e:
        return fail(str(e), 1)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    return 0


def main(argv: list[str] | None = None) -> int:
    if os.getcwd() not in sys.path:  # user reward functions in the working directory import by name
        sys.path.insert(0, os.getcwd())
    args = _parser().parse_args(argv)
    if args.command == "train":
        return cmd_train(args.overrides, args.cfg)
    _parser().print_help()
    return 0 if args.command is None else 2


if __name__ == "__main__":
    sys.exit(main())
