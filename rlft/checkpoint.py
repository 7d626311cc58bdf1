"""Checkpoints: trainable weights as safetensors plus a JSON state, written atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def save_checkpoint(run_dir: Path, step: int, policy: Any, state: dict[str, Any]) -> Path:
    """Write ``checkpoints/step_NNNNNN`` in ``run_dir``; the directory appears complete or not at all.

    Under LoRA the adapter is saved in peft's format (loadable with PeftModel.from_pretrained);
    under full fine-tuning, a full HF model directory.
    """
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    policy.model.save_pretrained(tmp)  # safetensors; handles tied embeddings
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    return final
