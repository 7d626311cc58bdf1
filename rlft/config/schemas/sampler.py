"""``sampler``: the rollout backend and its sampling settings."""

from __future__ import annotations

from dataclasses import dataclass

from rlft.config.schemas.fields import NUMERICS, SAMPLING, SYNC_CHECK, knob


@dataclass
class VLLMConfig:
    dtype: str = "auto"
    """Engine dtype: auto (= model.dtype), bf16 or fp32."""
    max_model_len: int = knob(1024, range="[1, inf)")
    """Longest prompt + completion the engine accepts: prompts longer than max_model_len - sampler.max_new_tokens
    are dropped at start-up (counted, as data.max_prompt_tokens does), so no completion is cut short by it."""
    gpu_memory_utilization: float = knob(0.3, range="(0, 1]")
    """Share of accelerator memory for the engine (GPU; on CPU only when kv_cache_gb is 0)."""
    kv_cache_gb: float | None = knob(None, range="[0, inf)")
    """KV-cache size in GiB (0: the gpu_memory_utilization share; None: that on GPU, 2 GiB on CPU,
    where the share of all RAM would be reserved up front: ~90k tokens of SmolLM2-135M fit in 2 GiB)."""
    tensor_parallel_size: int = knob(1, range="[1, inf)")
    """GPUs the engine shards the model over."""
    prefix_caching: bool = True
    """Reuse the KV cache of shared prompt prefixes (the n samples of a prompt); reset at each sync."""
    sleep: bool = True
    """GPU only: put the engine to sleep while the learner runs, freeing its memory."""
    enforce_eager: bool | None = None
    """Skip vLLM's graph compilation (None: skip on CPU, where compiling took 80-110 s and decoded no faster)."""
    sync: str = "merged"
    """How each update reaches the engine: merged (LoRA merged into the base weights, pushed in place)
    or adapter (the engine serves the LoRA adapter itself; on CPU vLLM's LoRA kernels decode ~6-7x slower)."""


@dataclass
class SamplerConfig:
    name: str = knob("auto", (NUMERICS, "rounding and random draws of another backend for the same distribution"))
    """Rollout backend: vllm, hf (transformers), or auto (vllm when installed, else hf)."""
    n: int = knob(8, SAMPLING, range="[1, inf)")
    """Completions per prompt (the GRPO group size G)."""
    temperature: float = knob(1.0, SAMPLING, range="(0, inf)")
    """Sampling temperature; log-probs are computed on logits / temperature."""
    top_p: float = knob(1.0, SAMPLING, range="(0, 1]")
    """Nucleus sampling threshold (1.0: off)."""
    top_k: int = knob(0, SAMPLING, range="[0, inf)")
    """Top-k sampling (0: off)."""
    max_new_tokens: int = knob(32, SAMPLING, range="[1, inf)")
    """Completion length cap; longer completions are truncated."""
    sync_check: str = knob("error", SYNC_CHECK)
    """After each weight sync (and at start-up, after a resume, before `rlft eval`) the sampler scores a fixed
    probe and its log-probs must match the learner's: error (stop the run, exit 1), warn (say so and go on) or off."""
    sync_check_tol: float | None = knob(None, SYNC_CHECK, range="(0, inf)")
    """Largest mean |log-prob difference| on the probe that passes (None: by dtype, 1e-3 when learner and
    sampler both run fp32, else 0.25)."""
    sync_probe_every: int = knob(10, SYNC_CHECK, range="[1, inf)")
    """Where the sampler reads back every weight the learner trains (LoRA on linear layers), each check compares
    those weights and the probe's log-probs run at the first check and every N-th after (1: every check); else
    (full fine-tuning, LoRA on embeddings, vLLM tensor parallel) the probe runs at every check."""
    vllm: VLLMConfig = knob(resume=(NUMERICS, "rounding and random draws of the vLLM engine"), factory=VLLMConfig)
    """vLLM engine settings (sampler=vllm)."""
