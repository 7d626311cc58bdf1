"""Write the 3-digit multiplication task of docs/results.md "Tools: multiplication with a calculator".

Three JSONL files in OUT_DIR, rows {"prompt": ..., "answer": ...}:
  train.jsonl   message prompts: one worked demonstration (a question, the assistant's calculator call, the
                tool's answer, the assistant's final reply) and then the question; the policy gets
                tools=[calculator] (--tool python: a python call that prints the product, tools=[python]);
  eval.jsonl    the same, on held-out pairs (no pair of eval is in train);
  plain.jsonl   the held-out questions alone (the base model without a tool).

SmolLM2-135M-Instruct never calls a tool it is only told about (0 of 32 replies); one demonstration in
the prompt gives it some calls to reinforce. The demonstration uses rlft's tool-call format
(rlft/tools/format.py).

    python scripts/tool_task.py OUT_DIR [--train 400] [--eval 100] [--seed 0] [--tool calculator|python]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

QUESTION = "What is {a} * {b}? Reply with just the number."
DEMO = (312, 457)


def demonstration(tool: str = "calculator") -> list[dict[str, str]]:
    """The worked call: ``calculator`` with the expression, or ``python`` with a program that prints it (the
    tool's answer then ends with print's newline, as the python tool returns it)."""
    a, b = DEMO
    arguments = {"expression": f"{a} * {b}"} if tool == "calculator" else {"code": f"print({a} * {b})"}
    call = json.dumps({"name": tool, "arguments": arguments})
    return [{"role": "user", "content": QUESTION.format(a=a, b=b)},
            {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
            {"role": "tool", "content": str(a * b) + ("" if tool == "calculator" else "\n")},
            {"role": "assistant", "content": str(a * b)}]


def pairs(count: int, rng: random.Random, taken: set[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    while len(out) < count:
        p = (rng.randrange(100, 1000), rng.randrange(100, 1000))
        if p not in taken and p != DEMO:
            taken.add(p)
            out.append(p)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--train", type=int, default=400)
    ap.add_argument("--eval", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tool", choices=["calculator", "python"], default="calculator",
                    help="the tool the demonstration calls (the run's tools=[...])")
    args = ap.parse_args()
    rng, taken = random.Random(args.seed), set()
    held_out, train = pairs(args.eval, rng, taken), pairs(args.train, rng, taken)
    args.out_dir.mkdir(parents=True, exist_ok=True)

    def write(name: str, rows: list[tuple[int, int]], demo: bool) -> None:
        with open(args.out_dir / name, "w") as f:
            for a, b in rows:
                question = {"role": "user", "content": QUESTION.format(a=a, b=b)}
                prompt = [*demonstration(args.tool), question] if demo else question["content"]
                f.write(json.dumps({"prompt": prompt, "answer": str(a * b)}) + "\n")

    write("train.jsonl", train, True)
    write("eval.jsonl", held_out, True)
    write("plain.jsonl", held_out, False)
    print(f"{args.out_dir}: {len(train)} training and {len(held_out)} held-out problems")


if __name__ == "__main__":
    main()
