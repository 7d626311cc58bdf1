"""``build_sampler``: the sampler backend a SamplerConfig names, over the modules that implement each."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlft.config.validation import resolve_sampler_name
from rlft.models.loading import save_model_dir, smollm2_dir
from rlft.paths import user_path
from rlft.samplers.base import Sampler, scratch_dir, stop_token_ids
from rlft.samplers.hf import HFSampler
from rlft.samplers.vllm import VLLMSampler

if TYPE_CHECKING:
    from rlft.config.schemas.model import ModelConfig
    from rlft.config.schemas.sampler import SamplerConfig


def build_sampler(cfg: SamplerConfig, model_cfg: ModelConfig, model: Any, tokenizer: Any, seed: int,
                  device: Any = "cpu") -> Sampler:
    """The backend named by ``cfg.name`` (SamplerConfig).

    Args:
        cfg: SamplerConfig.
        model_cfg: ModelConfig (where vLLM loads the weights from).
        model: A plain copy of the base model in the compute dtype (hf owns it; vllm saves it
            to a temporary directory only when the weights exist nowhere on disk).
        tokenizer: The policy's tokenizer.
        seed: Sampling seed.
        device: The learner's device, where the hf sampler runs too (and a one-process vLLM engine,
            on ``cuda:N``: rlft.samplers.vllm.engine_placement).
    """
    name = resolve_sampler_name(cfg.name)
    stop = stop_token_ids(model.generation_config, tokenizer)
    if name == "hf":
        return HFSampler(model, tokenizer, seed, stop, device=device)
    if name == "vllm":
        rank = model_cfg.lora.r if model_cfg.lora.enabled else 0
        return VLLMSampler(_model_dir(model_cfg, model, tokenizer), cfg, model_cfg.dtype, seed, stop, rank, device)
    raise ValueError(f"sampler.name='{cfg.name}'; valid choices: auto, hf, vllm")


def _model_dir(model_cfg: ModelConfig, model: Any, tokenizer: Any) -> str:
    if model_cfg.source == "path":
        return str(user_path(model_cfg.path))
    if model_cfg.source == "smollm2_gguf":
        return str(smollm2_dir())
    tmp = scratch_dir("rlft-vllm-model-")
    save_model_dir(model, tokenizer, tmp)
    return tmp
