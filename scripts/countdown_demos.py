"""Countdown demonstrations for `rlft sft`: the training problems of `rlft train data=countdown`'s task (the same
seeded stream, so none of its held-out problems), each solved by a search (rlft.sft.demos), as prompt-completion rows.

    python scripts/countdown_demos.py OUT.jsonl [N] [KEY=VALUE ...]    # N rows (default 2000); data.* overrides
    rlft sft data.path=OUT.jsonl ...                                      # then SFT on them

The prompt is the task's own (data.template), so the SFT model reads what the RL run will show it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out, rest = Path(argv[0]), argv[1:]
    n = int(rest.pop(0)) if rest and "=" not in rest[0] else 2000
    from rlft.config import compose
    from rlft.data.countdown import countdown_task
    from rlft.sft.demos import countdown_completion

    cfg = compose(["data=countdown", "reward=countdown", *rest])[0]
    task = countdown_task(cfg.data, cfg.seed)
    t0, rows, unsolved = time.perf_counter(), [], 0
    for p in task.batch(0, n):
        ref = json.loads(p.answer)
        reply = countdown_completion(ref["numbers"], ref["target"])
        if reply is None:
            unsolved += 1
            continue
        rows.append({"prompt": p.prompt, "completion": reply})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} demonstrations to {out} ({unsolved} unsolved) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
