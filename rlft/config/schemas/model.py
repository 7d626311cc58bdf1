"""``model``: the model trained, its LoRA adapter and the tiny random model of the tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlft.config.schemas.fields import ADAPTER, HARMFUL, LABEL, MODEL, NUMERICS, knob


@dataclass
class LoraConfig:
    enabled: bool = knob(True, ADAPTER)
    """Train a LoRA adapter (False: full fine-tuning)."""
    r: int = knob(16, ADAPTER, range="[1, inf)")
    """Adapter rank."""
    alpha: float = knob(32.0, ADAPTER, range="(0, inf)")
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = knob(0.0, ADAPTER, range="[0, 1)")
    """Dropout on the adapter input."""
    target_modules: list[str] = knob(
        resume=ADAPTER, factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that get an adapter."""


@dataclass
class TinyModelConfig:
    hidden_size: int = knob(64, range="[1, inf)")
    """Hidden width (head_dim = hidden_size / num_heads must be >= 32 for vLLM on CPU)."""
    num_layers: int = knob(2, range="[1, inf)")
    """Decoder layers."""
    num_heads: int = knob(2, range="[1, inf)")
    """Attention heads."""
    num_kv_heads: int = knob(1, range="[1, inf)")
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = knob(128, range="[1, inf)")
    """MLP width."""


@dataclass
class ModelConfig:
    name: str = knob("smollm2_135m", LABEL)
    """Preset name, for display."""
    source: str = knob("smollm2_gguf", MODEL)
    """Where the weights come from: smollm2_gguf, path or tiny."""
    path: str | None = knob(None, MODEL)
    """Local Hugging Face model directory (source=path)."""
    dtype: str = knob("auto", (HARMFUL, "the frozen weights' dtype and the compute precision"))
    """Compute dtype: bf16 (autocast, frozen weights in bf16), fp32, or auto (bf16 on CUDA; on CPU
    whichever a start-up GEMM probe at the model's shapes measures faster, logged with its figures;
    a resumed run keeps the dtype its checkpoint was trained in)."""
    attn_implementation: str = knob("auto", (NUMERICS, "float rounding of another kernel for the same attention"))
    """Learner attention kernel: eager, sdpa, flash_attention_2 (CUDA, needs the flash-attn package), or
    auto (eager on CPU, where it trained ~15% faster than sdpa's flash kernel on short RL sequences;
    sdpa on CUDA)."""
    gradient_checkpointing: bool = knob(
        False, (NUMERICS, "recomputes the same activations, whole rows instead of a shared prompt pass"))
    """Recompute each layer's activations in backward instead of keeping them (long sequences on
    a GPU); the learner then runs each row whole, without sharing a prompt's pass across its group."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Adapter settings."""
    tiny: TinyModelConfig = knob(resume=MODEL, factory=TinyModelConfig)
    """Shape of the random model (source=tiny)."""
