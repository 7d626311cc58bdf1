"""Preference pairs from the arithmetic task, for the RLHF end-to-end run (docs/results.md).

Samples K replies per problem from SmolLM2-135M-Instruct (temperature 1, transformers' own
``generate``), checks each with the rule checker (``math_correct``), and pairs a correct reply
(chosen) with a wrong one (rejected) for every problem that has both. The pairs of the last
``--held-out`` share of the problems are held out (OUT_DIR/eval.jsonl), so the reward model's held-out
accuracy is measured on problems it never saw; all problems are training problems of the task, so the
policy's held-out problems (the same seed) are never among them.

    python scripts/rlhf_pairs.py OUT_DIR [--problems 400] [--held-out 0.25] [--samples 8]

Writes OUT_DIR/train.jsonl and OUT_DIR/eval.jsonl, rows ``{"prompt", "chosen", "rejected"}``
(``prompt`` is the user message; chat templating is the reward model's job), and prints counts.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlft.config.schemas.data import DataConfig
from rlft.data import Problem, build_task
from rlft.models.loading import smollm2_dir
from rlft.rewards.builtins import math_correct


def sample_replies(model, tok, problems: list[Problem], k: int, max_new_tokens: int, batch: int) -> list[list[str]]:
    """K replies per problem (T=1), decoded without special tokens."""
    out: list[list[str]] = []
    for i in range(0, len(problems), batch):
        chunk = problems[i:i + batch]
        texts = [tok.apply_chat_template([{"role": "user", "content": p.prompt}], tokenize=False,
                                         add_generation_prompt=True) for p in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 max_new_tokens=max_new_tokens, num_return_sequences=k,
                                 pad_token_id=tok.pad_token_id)
        replies = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        out += [replies[j * k:(j + 1) * k] for j in range(len(chunk))]
        print(f"  sampled {min(i + batch, len(problems))}/{len(problems)} problems", flush=True)
    return out


def pairs(problems: list[Problem], replies: list[list[str]], rng: random.Random) -> list[dict[str, str]]:
    """Each problem with a correct and a wrong reply gives min(#correct, #wrong) pairs of distinct texts."""
    rows = []
    for p, rs in zip(problems, replies):
        good = sorted({r.strip() for r in rs if math_correct(p.prompt, r, p.answer)})
        bad = sorted({r.strip() for r in rs if not math_correct(p.prompt, r, p.answer)} - set(good))
        rng.shuffle(good)
        rng.shuffle(bad)
        rows += [{"prompt": p.prompt, "chosen": g, "rejected": b, "answer": p.answer} for g, b in zip(good, bad)]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--problems", type=int, default=400)
    ap.add_argument("--held-out", type=float, default=0.25)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    path = smollm2_dir()
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # The schema's data settings and seed, as `rlft train` uses them: the policy's held-out problems are
    # then never among the reward model's training problems.
    problems = build_task(DataConfig(), seed=args.seed).batch(0, args.problems)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    replies = sample_replies(model, tok, problems, args.samples, args.max_new_tokens, args.batch)
    correct = sum(math_correct(p.prompt, r, p.answer) for p, rs in zip(problems, replies) for r in rs)
    print(f"{len(problems)} problems x {args.samples} replies: {correct / (len(problems) * args.samples):.3f} correct "
          f"({time.perf_counter() - t0:.0f} s)")
    rows = pairs(problems, replies, rng)
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    held = set(prompts[len(prompts) - round(len(prompts) * args.held_out):])
    for name, part in (("train", [r for r in rows if r["prompt"] not in held]), ("eval", [r for r in rows if r["prompt"] in held])):
        with open(args.out / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in part)
        print(f"{name}: {len(part)} pairs from {len({r['prompt'] for r in part})} problems -> {args.out / (name + '.jsonl')}")


if __name__ == "__main__":
    main()
