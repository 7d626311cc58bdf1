"""Config schemas: one dataclass per section, a short docstring per field.

The YAML files under ``conf/`` are merged onto these schemas, so a key missing from YAML takes
the default below and a key missing here is a typo.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GROUPS = ("algo", "model", "sampler", "reward", "data", "logger")


class ConfigError(ValueError):
    """A user-facing configuration problem; the CLI prints it on one line and exits 2."""


# Which algorithm each AlgoConfig knob belongs to (``rlft train --help algo`` prints them so; a test
# checks every field is listed once). The override paths stay flat: algo.ppo_epochs, algo.tis_cap.
ALGO_SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ('Advantages (GRPO, Dr. GRPO)', ('adv_estimator', 'norm_adv_by_std', 'adv_eps',)),
    ('Policy loss (all)', ('policy_loss', 'clip_eps_low', 'clip_eps_high', 'loss_agg',)),
    ('KL to the reference (GRPO)', ('kl_estimator', 'beta',)),
    ('Several updates per rollout (PPO; any algorithm)', ('ppo_epochs', 'num_mini_batches', 'early_stop_kl',)),
    ('PPO-Penalty (policy_loss=kl_penalty)', ('penalty_beta', 'penalty_target_kl',)),
    ('PPO: KL in the reward, GAE and the critic (adv_estimator=gae)', ('kl_reward_coef', 'kl_ctrl', 'kl_target', 'kl_horizon', 'gamma', 'lam', 'whiten_advantages', 'vf_coef', 'value_clip', 'critic_lr',)),
    ('DAPO: dynamic sampling and overlong handling', ('dynamic_sampling', 'max_sampling_rounds', 'overlong_filter', 'overlong_penalty', 'overlong_cache', 'overlong_penalty_factor',)),
    ('Sampler mismatch correction (sampler=vllm)', ('tis_cap',)),
)


@dataclass
class AlgoConfig:
    name: str = "grpo"
    """Preset name, for display."""
    # --- Advantages (GRPO, Dr. GRPO)
    adv_estimator: str = "grpo"
    """Advantage estimator registered in rlft.algorithms.advantages."""
    norm_adv_by_std: bool = True
    """GRPO: divide group-centred rewards by the group's std (False: Dr. GRPO)."""
    adv_eps: float = 1e-6
    """Added to the group std before dividing."""
    # --- Policy loss (all)
    policy_loss: str = "clip"
    """Policy loss registered in rlft.algorithms.losses."""
    clip_eps_low: float = 0.2
    """Ratio clipped below at 1 - clip_eps_low."""
    clip_eps_high: float = 0.2
    """Ratio clipped above at 1 + clip_eps_high (DAPO's clip-higher uses 0.28)."""
    # --- KL to the reference (GRPO)
    kl_estimator: str = "k3"
    """Estimator of KL(pi_theta || pi_ref) per token: k1, k2 or k3."""
    beta: float = 0.04
    """Weight of the KL-to-reference term in the loss; 0 skips the reference pass."""
    loss_agg: str = "seq-mean-token-mean"
    """How per-token losses become one scalar (see rlft.algorithms.aggregation)."""
    # --- Several updates per rollout (PPO; any algorithm)
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    num_mini_batches: int = 1
    """Optimizer steps per epoch; the rollout batch is split into this many mini-batches."""
    early_stop_kl: float = 0.0
    """Stop the remaining epochs on a rollout once mean approx KL(old || new) exceeds this (0: off)."""
    # --- PPO-Penalty (policy_loss=kl_penalty)
    penalty_beta: float = 1.0
    """PPO-Penalty (policy_loss=kl_penalty): initial coefficient of KL(old || new) in the loss."""
    penalty_target_kl: float = 0.01
    """PPO-Penalty: beta doubles when KL > 1.5x this, halves when KL < this / 1.5."""
    # --- PPO: KL in the reward, GAE and the critic (adv_estimator=gae)
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
    # --- DAPO: dynamic sampling and overlong handling
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
    # --- Sampler mismatch correction (sampler=vllm)
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

    @property
    def needs_old_logprobs(self) -> bool:
        """A pass for the rollout policy's log-probs before the update: several steps per rollout
        move the policy away from it, and PPO's reward reads them (with one step and no critic the
        ratio is exp(logp - logp.detach()))."""
        return self.ppo_epochs > 1 or self.num_mini_batches > 1 or self.uses_critic

    @property
    def uses_ppo_penalty(self) -> bool:
        """PPO-Penalty: KL(old || new) in the loss, its beta adapted after each update."""
        return self.policy_loss == "kl_penalty"

    @property
    def adapts_kl_coef(self) -> bool:
        """PPO's in-reward KL coefficient follows the adaptive (InstructGPT) controller."""
        return self.uses_critic and self.kl_ctrl == "adaptive"

    @property
    def learns_from_zero_advantages(self) -> bool:
        """A loss term that is not 0 where every advantage is: the KL to the reference, PPO-Penalty's
        pull back to the old policy, or the value loss."""
        return self.uses_critic or self.beta > 0 or self.uses_ppo_penalty


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
    """Longest prompt + completion the engine accepts: prompts longer than max_model_len - sampler.max_new_tokens
    are dropped at start-up (counted, as data.max_prompt_tokens does), so no completion is cut short by it."""
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
    num_workers: int = 0
    """Score in this many worker processes (0: in the training process, unless timeout_s needs one)."""
    timeout_s: float = 0.0
    """Time limit of one reward call (a batched function: of the whole batch), in seconds; calls then
    run in worker processes that can be stopped (0: no limit)."""
    on_timeout: float | None = None
    """Score of a call that ran past timeout_s or whose worker process died (os._exit, a signal, the
    OOM killer) (None: end the run with one line naming the function, the sample and what happened)."""


@dataclass
class DataConfig:
    name: str = "arithmetic"
    """Task: arithmetic, countdown (generated), jsonl (a JSON/JSONL file), hf (a local data set), gsm8k (an hf preset)."""
    digits: int = 2
    """Arithmetic: digits per operand; countdown: numbers and targets lie in [1, 10**digits - 1]."""
    ops: list[str] = field(default_factory=lambda: ["+"])
    """Operators: arithmetic draws one per problem (+, -, *); countdown builds targets with them (+, -, *, /)."""
    num_numbers: list[int] = field(default_factory=lambda: [3, 4])
    """Countdown: how many numbers a problem gives, drawn from this list (each used exactly once)."""
    template: str = "What is {a} {op} {b}? Reply with just the number."
    """Prompt text; arithmetic fills {a} {op} {b}, countdown {numbers} {target}, jsonl/hf {prompt} (string prompts)."""
    num_eval: int = 200
    """Held-out problems used for evaluation."""
    path: str | None = None
    """jsonl: training file; hf/gsm8k: a save_to_disk folder, a folder of data files, or a parquet/json/jsonl/csv file."""
    split: str = "train"
    """hf/gsm8k: the split of data.path to train on (a single file is the split train)."""
    eval_split: str | None = None
    """hf/gsm8k: the held-out split (of data.eval_path when given, else of data.path)."""
    eval_path: str | None = None
    """jsonl/hf: held-out file or folder (default: the last num_eval rows of path)."""
    prompt_field: str = "prompt"
    """jsonl/hf: column holding the prompt (a string, or a list of chat messages {role, content})."""
    answer_field: str | None = "answer"
    """jsonl/hf: column holding the reference answer (null: none, rewards get answer="")."""
    system_prompt: str | None = None
    """System message for the chat template (None: the model's default)."""
    chat_template: bool = True
    """Render prompts with the tokenizer's chat template (false: the raw text; message prompts are refused)."""
    max_prompt_tokens: int = 0
    """jsonl/hf: drop (never truncate) problems whose templated prompt is longer than this many tokens (0: no limit)."""


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
    verbose: bool = False
    """Also show other libraries' log records, warnings and progress bars on the console (they always go to
    train.log; without it the console shows rlft's lines and the libraries' errors)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases settings."""
    rollouts: bool = False
    """Also write every kept rollout row (step, group, prompt and completion token ids, score) to rollouts.jsonl."""


@dataclass
class TrainerConfig:
    steps: int = 30
    """Rollout/update iterations."""
    nproc: int = 1
    """Data-parallel ranks to start on this machine through torch's launcher (1: this process only;
    under torchrun leave it 1: --nproc-per-node decides). trainer.num_prompts must be a multiple of the ranks."""
    strategy: str = "ddp"
    """How the ranks hold the learner: ddp (every rank a full replica, gradients all-reduced) or fsdp2
    (the decoder's layers sharded over the ranks with fully_shard; LoRA only; needs several ranks)."""
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
    stop_grace_s: float = 300.0
    """After the first Ctrl-C/SIGTERM, how long the current step may take to finish (it is then saved)
    before it is aborted as by a second signal (the step before it is saved); 0: wait however long it takes."""
    dist_timeout_s: float = 300.0
    """Under several ranks: how long a collective may wait for the other ranks before this rank ends
    with one line saying another rank stopped answering (a rank that died or hangs; gloo and NCCL)."""


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

