"""``data``: the task, its data files and the prompts' rendering."""

from __future__ import annotations

from dataclasses import dataclass

from rlft.config.schemas.fields import EVAL_ROWS, HARMFUL, PROBLEMS, knob


@dataclass
class DataConfig:
    name: str = knob("arithmetic", PROBLEMS)
    """Task: arithmetic, countdown (generated), jsonl (a JSON/JSONL file), hf (a local data set), gsm8k (an hf preset)."""
    digits: int = knob(2, PROBLEMS, range="[1, inf)")
    """Arithmetic: digits per operand; countdown: numbers and targets lie in [1, 10**digits - 1]."""
    ops: list[str] = knob(resume=PROBLEMS, factory=lambda: ["+"])
    """Operators: arithmetic draws one per problem (+, -, *); countdown builds targets with them (+, -, *, /)."""
    num_numbers: list[int] = knob(resume=PROBLEMS, factory=lambda: [3, 4], range="[2, 6]")
    """Countdown: how many numbers a problem gives, drawn from this list (each used exactly once)."""
    template: str = knob("What is {a} {op} {b}? Reply with just the number.", PROBLEMS)
    """Prompt text; arithmetic fills {a} {op} {b}, countdown {numbers} {target}, jsonl/hf {prompt} (string prompts)."""
    num_eval: int = knob(200, (HARMFUL, "the held-out split, carved out of or rejected from the training problems"),
                         range="[0, inf)")
    """Held-out problems used for evaluation."""
    path: str | None = knob(None, PROBLEMS)
    """jsonl: training file; hf/gsm8k: a save_to_disk folder, a folder of data files, or a parquet/json/jsonl/csv file."""
    split: str = knob("train", PROBLEMS)
    """hf/gsm8k: the split of data.path to train on (a single file is the split train)."""
    eval_split: str | None = knob(None, EVAL_ROWS)
    """hf/gsm8k: the held-out split (of data.eval_path when given, else of data.path)."""
    eval_path: str | None = knob(None, EVAL_ROWS)
    """jsonl/hf: held-out file or folder (default: the last num_eval rows of path)."""
    prompt_field: str = knob("prompt", PROBLEMS)
    """jsonl/hf: column holding the prompt (a string, or a list of chat messages {role, content})."""
    answer_field: str | None = knob("answer", PROBLEMS)
    """jsonl/hf: column holding the reference answer (null: none, rewards get answer="")."""
    system_prompt: str | None = knob(None, PROBLEMS)
    """System message for the chat template (None: the model's default)."""
    chat_template: bool = knob(True, PROBLEMS)
    """Render prompts with the tokenizer's chat template (false: the raw text; message prompts are refused)."""
    max_prompt_tokens: int = knob(0, PROBLEMS, range="[0, inf)")
    """jsonl/hf: drop (never truncate) problems whose templated prompt is longer than this many tokens (0: no limit)."""
