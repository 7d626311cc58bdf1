"""Rollouts with transformers models and a lean decode loop on the sampler's own weights."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from rlft.samplers.base import Generations, SamplingParams, completion_seeds
from rlft.samplers.readback import column_index


def sample_next(logits: Tensor, params: SamplingParams, generator: torch.Generator | None = None,
                uniforms: Tensor | None = None) -> Tensor:
    """Pick the next token of each row.

    Args:
        logits: (B, V) fp32 next-token logits.
        params: Greedy, or temperature / top-k / top-p sampling.
        generator: Random source for sampling (when ``uniforms`` is not given).
        uniforms: (B,) draws in [0, 1), one per row, on the logits' device.

    Returns:
        (B,) token ids.
    """
    if params.greedy:
        return logits.argmax(-1)
    logits = logits / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, -1)
        # drop a token when the tokens ranked above it already reach top_p
        drop = (probs.cumsum(-1) - probs) >= params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    # Inverse-CDF sampling: torch.multinomial is ~20x slower on (B, 49152) rows on CPU.
    cdf = torch.softmax(logits, -1).double().cumsum(-1)
    if uniforms is None:
        uniforms = torch.rand(logits.shape[0], generator=generator, device=logits.device)
    u = uniforms.double()[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(-1).clamp(max=logits.shape[-1] - 1)



def generator_seed(seed: int) -> int:
    """A completion seed (run seed in the high 32 bits, the completion's number in the low ones) as
    the 32 bits torch's CPU generator keeps: the high half folded in by an odd multiplier, so the
    run seed still changes every draw, and within a run (one high half) distinct seeds stay distinct."""
    return (seed + (seed >> 32) * 0x9E3779B1) % 2**32

class HFSampler:
    """Batched group sampling on a plain (non-peft) causal LM in the compute dtype.

    The decode loop keeps a KV cache and drops finished rows from the batch, so a few long
    completions do not make every row pay. The trainer pushes merged weights in after each
    update with :meth:`load_weights`, as it would into vLLM. Everything runs on ``device`` (the
    learner's); the same seed draws other tokens on CUDA than on the CPU (other generators).
    """

    serves_adapter = False
    """It samples from a plain model: a sync merges the adapter into its weights."""

    def __init__(self, model: Any, tokenizer: Any, seed: int, stop: list[int], max_batch: int = 256,
                 device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.dtype = self.model.dtype
        self.stop = torch.tensor(stop, device=self.device)  # rollout.base.stop_token_ids: the same set as vLLM's
        self.pad = tokenizer.pad_token_id
        self.max_batch = max_batch
        self.generator = torch.Generator(self.device).manual_seed(seed)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Generations:
        rows = [p for p in prompts for _ in range(params.n)]
        index = [i for i in range(len(prompts)) for _ in range(params.n)]
        completions: list[list[int]] = []
        truncated: list[bool] = []
        uniforms = self._uniforms(len(prompts), params)
        for start in range(0, len(rows), self.max_batch):
            out, cut = self._decode(rows[start : start + self.max_batch], params, uniforms[start : start + self.max_batch])
            completions += out
            truncated += cut
        return Generations(index, completions, truncated)

    def _uniforms(self, num_prompts: int, params: SamplingParams) -> Tensor:
        """(rows, max_new_tokens) draws, row r's t-th one picking its t-th token. Drawn up front so a
        row's tokens do not depend on which rows finish first or share its batch; with per-prompt
        seeds each row has a stream of its own (prompt seed, row within the group)."""
        shape = (num_prompts * params.n, params.max_new_tokens)
        if params.greedy:
            return torch.zeros(shape, device=self.device)
        if params.prompt_seeds is None:
            if params.seed is not None:
                self.generator.manual_seed(params.seed)
            return torch.rand(shape, generator=self.generator, device=self.device)
        if len(params.prompt_seeds) != num_prompts:
            raise ValueError(f"{len(params.prompt_seeds)} prompt seeds for {num_prompts} prompts")
        g = torch.Generator()
        rows = [torch.rand(params.max_new_tokens, generator=g.manual_seed(generator_seed(seed)), device="cpu")
                for seed in completion_seeds(params)]
        return torch.stack(rows).to(self.device)

    def _decode(self, rows: list[list[int]], params: SamplingParams,
                uniforms: Tensor) -> tuple[list[list[int]], list[bool]]:
        from transformers import DynamicCache  # transformers: seconds to import, only with a model

        b, width = len(rows), max(len(r) for r in rows)
        ids = torch.full((b, width), self.pad, dtype=torch.long, device="cpu")
        mask = torch.zeros((b, width), dtype=torch.long, device="cpu")
        for i, r in enumerate(rows):  # left padding: every row continues from the right edge
            ids[i, width - len(r) :] = torch.tensor(r, device="cpu")
            mask[i, width - len(r) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        decoder, head = self.model.get_decoder(), self.model.get_output_embeddings()

        def next_logits(input_ids: Tensor, attn: Tensor, pos: Tensor) -> Tensor:
            hidden = decoder(
                input_ids=input_ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True
            ).last_hidden_state
            # A 2-D input keeps the LM head a plain matmul (a strided 3-D one copies the weight per row).
            return head(hidden[:, -1, :]).float()

        logits = next_logits(ids, mask, positions)
        alive = torch.arange(b, device=self.device)
        next_pos = positions[:, -1] + 1
        tokens: list[list[int]] = [[] for _ in range(b)]
        finished = [False] * b
        for t in range(params.max_new_tokens):
            tok = sample_next(logits, params, uniforms=uniforms[alive, t])
            keep = ~torch.isin(tok, self.stop)
            for row, tk, going in zip(alive.tolist(), tok.tolist(), keep.tolist()):
                tokens[row].append(tk)
                finished[row] = not going
            if t == params.max_new_tokens - 1 or not keep.any():
                break
            if not keep.all():
                sel = keep.nonzero().squeeze(-1)
                alive, tok, mask, next_pos = alive[sel], tok[sel], mask[sel], next_pos[sel]
                for layer in cache.layers:
                    layer.batch_select_indices(sel)
            mask = torch.cat([mask, torch.ones((len(alive), 1), dtype=mask.dtype, device=self.device)], dim=1)
            logits = next_logits(tok[:, None], mask, next_pos[:, None])
            next_pos = next_pos + 1
        return tokens, [not f for f in finished]

    @torch.inference_mode()
    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Log-probs of the completion from one forward pass of the sampler's own copy of the weights,
        through the same decoder and LM head calls as the decode loop (not the learner's code)."""
        ids = torch.tensor([prompt_ids + completion_ids], device=self.device)
        hidden = self.model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0]
        before = hidden[len(prompt_ids) - 1 : -1]  # the state before each completion token
        logp = torch.log_softmax(self.model.get_output_embeddings()(before).float(), -1)
        return logp.gather(-1, ids[0, len(prompt_ids) :, None]).squeeze(-1).tolist()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        for name, value in weights:
            self.model.get_parameter(name).copy_(value)

    @torch.no_grad()
    def read_served(self, names: list[str]) -> dict[str, tuple[Tensor, ...]]:
        """Columns (rlft/samplers/readback.py: columns) of each named linear weight of the sampler's copy."""
        out = {}
        for name in names:
            w = self.model.get_submodule(name).weight
            out[name] = (w.index_select(1, column_index(w.shape[1], w.device)).cpu(),)
        return out

    def load_adapter(self, model: Any) -> None:
        """Never called: a sync pushes merged weights into this sampler (:meth:`load_weights`)."""
        raise NotImplementedError("the hf sampler serves no adapter (serves_adapter is False): use load_weights")

    def sleep(self) -> None:
        """Keeps everything: the decode loop holds no memory between calls (its KV cache lives for one
        call), and freeing its copy of the weights would cost a reload before every rollout."""
