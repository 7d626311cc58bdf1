"""Model loading, LoRA, the frozen reference and weight export for samplers."""

from rlft.errors import ModelError
from rlft.models.loading import load_base, smollm2_dir
from rlft.models.policy import Policy, build_policy

__all__ = ["ModelError", "Policy", "build_policy", "load_base", "smollm2_dir"]
