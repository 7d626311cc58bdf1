"""The ``rlft`` command: ``train`` (a thin command line over ``rlft.training.loop.train``), ``check``, ``rm``, ``eval``
and ``export``, each dispatched to its own module."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlft.errors import CheckpointError, ConfigError, DataError, ModelError, RlftError, fail
from rlft.output.console import run_log
from rlft.paths import quote_home, user_path

# The commands' own modules are imported inside the functions that run them: Hydra, torch and
# transformers take seconds to import, and `rlft --help` or a bad argument needs none of them.


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlft", description="RL fine-tuning of language models from YAML configs.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # `rlft train ...` never reaches argparse (main hands it to Hydra); listed here for `rlft --help`.
    sub.add_parser("train", help="run a training job or a sweep (a Hydra application: rlft train --help)")
    sub.add_parser("check", help="before a long run, whether it can learn: sample, score and time one step of the "
                   "run's config (rlft check --help)")
    sub.add_parser("rm", help="train a reward model on preference pairs (a Hydra application: rlft rm --help)")
    sub.add_parser("sft", help="supervised fine-tuning on demonstrations, rendered as rlft train renders them (a Hydra "
                   "application: rlft sft --help)")
    export = sub.add_parser("export", help="write a checkpoint as a Hugging Face model directory")
    export.add_argument("checkpoint", help="a checkpoints/step_NNNNNN directory, or a run directory (newest)")
    export.add_argument("out_dir", help="new output directory")
    export.add_argument("--adapter-only", action="store_true", help="write the peft LoRA adapter, not merged weights")
    ev = sub.add_parser("eval", help="greedy accuracy and pass@k on held-out problems",
                        usage="rlft eval [CHECKPOINT] [KEY=VALUE ...] [--samples N] [--out FILE]")
    ev.add_argument("args", nargs="*", help="an optional checkpoint or run directory, then overrides (base model "
                    "without one: rlft eval model=smollm2_135m)")
    ev.add_argument("--samples", type=int, default=8, metavar="N",
                    help="sampled completions per problem for pass@k (0: greedy only; default: %(default)s)")
    ev.add_argument("--data", metavar="FILE", help="a JSONL file of held-out problems (default: the task's held-out split)")
    ev.add_argument("--out", metavar="FILE", help="where to write the results as JSON (default: eval_step_NNNNNN.json in the run "
                    "directory of the checkpoint evaluated; ./eval.json for a base model)")
    parser.set_defaults(eval_parser=ev)
    return parser


def user_errors() -> tuple[type[Exception], ...]:
    """Problems with the user's config, data, model or checkpoint: one line and exit 2, no traceback
    (every :class:`rlft.errors.RlftError` is one line, with its class's exit code)."""
    return ConfigError, DataError, ModelError, CheckpointError


def cmd_export(checkpoint: str, out_dir: str, adapter_only: bool) -> int:
    from rlft.commands.export import export  # torch, transformers

    try:
        used = export(checkpoint, out_dir, adapter_only)
    except RlftError as e:
        return fail(str(e), e.exit_code)
    print(f"exported {used} -> {out_dir}" + (" (adapter only)" if adapter_only else " (merged model)"))
    return 0


def default_eval_out(checkpoint: Path | None) -> Path:
    """Where ``rlft eval`` writes without ``--out``: next to the run it evaluates, one file per checkpoint
    (evaluations of several runs from one directory would overwrite a shared ./eval.json)."""
    if checkpoint is None:
        return Path("eval.json")
    home = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    return home / f"eval_{checkpoint.name}.json"


def cmd_eval(args: list[str], samples: int, data: str | None, out: str | None) -> int:
    from rlft.commands.export import checkpoint_config, find_checkpoint, is_sft_checkpoint  # torch
    from rlft.config import compose  # Hydra
    from rlft.training.evaluation import run_eval, write_result  # torch, transformers

    path, overrides = None, list(args)
    if overrides and ("=" not in overrides[0] or user_path(overrides[0]).exists()):
        path = overrides.pop(0)
    if data:
        overrides += ["data=jsonl", f"data.path={data}", f"data.eval_path={data}"]
    overrides = quote_home(overrides)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        checkpoint = find_checkpoint(path) if path else None
        target = user_path(out) if out else default_eval_out(checkpoint)
        if target.is_dir():  # before the evaluation, not after minutes of it
            return fail(f"--out {target} is a directory: give a file name")
        if checkpoint and is_sft_checkpoint(checkpoint):
            return fail(f"{checkpoint} is an rlft sft checkpoint, which has no task to evaluate on: export it (rlft "
                        "export CHECKPOINT DIR, or the run's own model/ directory) and evaluate that: rlft eval "
                        "model=local model.path=DIR data=...")
        cfg = checkpoint_config(checkpoint, overrides) if checkpoint else compose(overrides)[0]
        target.parent.mkdir(parents=True, exist_ok=True)
        with run_log(target.with_suffix(".log")):  # other libraries' output: beside the result, not the console
            result = run_eval(cfg, checkpoint, samples)
    except RlftError as e:
        return fail(str(e), e.exit_code)
    write_result(result, target)
    _print_result(result, str(target))
    return 0


def _print_result(result: dict, out: str) -> None:
    table = Table(title=Text(f"{result['model']}: {result['problems']} problems"))  # a path is text, not markup
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in result.items():
        if k.startswith("eval/"):
            table.add_row(k.removeprefix("eval/"), f"{v:.4f}")
    Console().print(table)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    if os.getcwd() not in sys.path:  # user reward functions in the working directory import by name
        sys.path.insert(0, os.getcwd())
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-sc"], ["--shell-completion"]) and any(a.startswith("query=") for a in argv):
        # Hydra's bash completion asks `rlft -sc query=bash` about COMP_LINE "rlft train ...".
        line = os.environ.get("COMP_LINE", "")
        head, sep, rest = line.partition(" train ")
        if sep:
            os.environ["COMP_LINE"] = f"{head} {rest}"
            os.environ["COMP_POINT"] = str(max(0, int(os.environ.get("COMP_POINT", len(line))) - len(" train")))
        argv = ["train", *argv]
    if argv[:1] == ["train"]:  # Hydra parses the rest: every Hydra flag works as documented
        rest = argv[1:]
        if {"-h", "--help"} & set(rest):
            from rlft.commands.help import train_help  # Hydra

            try:
                print(train_help(rest))
            except RlftError as e:  # a ConfigError
                return fail(str(e), e.exit_code)
            return 0
        from rlft.commands.train import run  # Hydra

        return run(rest)
    if argv[:1] == ["check"]:  # rlft train's Hydra application, with a check for its job
        from rlft.check.command import main as check_main

        return check_main(argv[1:])
    if argv[:1] == ["rm"]:  # Hydra parses the rest, as for train
        from rlft.rm.command import main as rm_main

        return rm_main(argv[1:])
    if argv[:1] == ["sft"]:
        from rlft.sft.command import main as sft_main

        return sft_main(argv[1:])
    parser = _parser()
    if argv[:1] == ["eval"]:  # overrides may come after --samples/--data/--out too (not with parse_args)
        args = parser.get_default("eval_parser").parse_intermixed_args(argv[1:])
        return cmd_eval(args.args, args.samples, args.data, args.out)
    args = parser.parse_args(argv)
    if args.command == "export":
        return cmd_export(args.checkpoint, args.out_dir, args.adapter_only)
    parser.print_help()
    return 0 if args.command is None else 2


if __name__ == "__main__":
    sys.exit(main())
