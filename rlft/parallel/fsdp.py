"""``trainer.strategy=fsdp2``: the policy's decoder sharded over the ranks with FSDP2 (``fully_shard``).

Each decoder layer is one FSDP unit and the decoder (embeddings, final norm) the root: a layer's
weights are all-gathered just before it runs and freed after, and each rank keeps 1/N of the
frozen base (and of the adapters and their Adam moments). Gradients are reduce-scattered as sums
(the loss of each rank is already its share of the global loss, see :mod:`rlft.parallel.distributed`).

What FSDP2 needs from the rest of rlft, and where it is given:

- Every rank runs the same forward and backward passes (each one all-gathers layer by layer):
  the learner pads a rank's micro-batches with blank ones up to the most any rank has
  (:func:`lockstep_count`), and always makes both decoder calls of its shared-prompt pass.
- The LM head is not sharded: the learner reads its weight directly (logits only at completion
  tokens), outside any FSDP forward. Under LoRA it is frozen, so each rank's full copy stays
  right (with tied embeddings it is the copy the embedding had before sharding).
- Checkpoints and the sampler see full tensors (:func:`full`, a collective every rank makes at
  the same point), so a checkpoint is the same file whatever the strategy and world size.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from rlft.errors import ConfigError
from rlft.parallel.distributed import DataParallel


def shard_decoder(model: Any, device: torch.device, dp: DataParallel) -> None:
    """``fully_shard`` each decoder layer of ``model`` (a peft or plain causal LM), then the decoder."""
    decoder = model.get_decoder()
    if not isinstance(getattr(decoder, "layers", None), torch.nn.ModuleList):
        raise ConfigError(f"trainer.strategy=fsdp2 shards a decoder's `layers`, and {type(decoder).__name__} has "
                          "none (Llama, Qwen, Mistral, Gemma, SmolLM do); use trainer.strategy=ddp")
    mesh = init_device_mesh(device.type, (dp.world,))
    units = [*decoder.layers, decoder]
    for unit in units:
        fully_shard(unit, mesh=mesh)
    for unit in units:
        # Sums, not FSDP's default mean. Forced sum reductions: gloo has no pre-multiplied sum.
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)


def is_sharded(model: Any) -> bool:
    """Whether ``model``'s decoder runs under FSDP2 (and so every rank must make the same passes)."""
    get = getattr(model, "get_decoder", None)
    return get is not None and isinstance(get(), FSDPModule)


def sharded_layers(model: Any) -> list[Any]:
    """The FSDP units :func:`shard_decoder` made of ``model``'s decoder layers (none when it is not sharded)."""
    return list(model.get_decoder().layers) if is_sharded(model) else []


def lockstep_count(n: int, dp: DataParallel) -> int:
    """The most micro-batches any rank runs, when this rank runs ``n`` (one all-reduce)."""
    return int(dp.max_(torch.tensor([float(n)])).item())


def full(t: Tensor) -> Tensor:
    """The whole tensor: gathered from every rank when ``t`` is sharded (a collective), else ``t``."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def full_columns(t: Tensor, cols: Tensor) -> Tensor:
    """``t[:, cols]`` whole. Under FSDP2 (rows sharded) each rank selects the columns of its own rows and
    only those are gathered (a collective): N x len(cols) elements, not the whole weight."""
    if not isinstance(t, DTensor):
        return t.index_select(1, cols.to(t.device))
    if tuple(t.placements) != (Shard(0),):
        return t.full_tensor().index_select(1, cols.to(t.device))
    local = t.to_local().index_select(1, cols.to(t.device))
    return DTensor.from_local(local, t.device_mesh, t.placements, run_check=False,
                              shape=(t.shape[0], len(cols)), stride=(len(cols), 1)).full_tensor()


def full_named(items: Iterable[tuple[str, Tensor]]) -> dict[str, Tensor]:
    """``{name: full(tensor)}``, gathered in the order given (the same on every rank)."""
    return {name: full(t) for name, t in items}


def like(target: Tensor, whole: Tensor) -> Tensor:
    """``whole`` placed as ``target`` is: this rank's shard when ``target`` is sharded (cut locally,
    no communication: every rank holds ``whole``), else ``whole`` itself."""
    if not isinstance(target, DTensor):
        return whole
    return distribute_tensor(whole.to(target.device), target.device_mesh, target.placements, src_data_rank=None)


def copy_full_(target: Tensor, whole: Tensor) -> None:
    """``target <- whole`` for a plain or sharded ``target``, without communication."""
    if isinstance(target, DTensor):
        target.to_local().copy_(like(target, whole).to_local())
    else:
        target.copy_(whole)


def grad_norm_and_clip(params: list[Tensor], max_norm: float, dp: DataParallel) -> Tensor:
    """The global gradient norm of sharded and plain parameters, clipped to ``max_norm`` (> 0) as
    ``torch.nn.utils.clip_grad_norm_`` does (its own version cannot mix sharded and plain tensors).

    Sharded gradients add their shards' squares over ranks; plain ones are already whole on every rank.
    """
    sharded = [p.grad.to_local().float() for p in params if isinstance(p.grad, DTensor)]
    plain = [p.grad.float() for p in params if p.grad is not None and not isinstance(p.grad, DTensor)]
    device = next((p.device for p in params), torch.device("cpu"))
    squares = torch.zeros((), dtype=torch.float32, device=device)
    for g in sharded:
        squares = squares + g.pow(2).sum()
    squares = dp.sum_(squares.reshape(1)).reshape(())
    for g in plain:
        squares = squares + g.pow(2).sum()
    norm = squares.sqrt()
    if max_norm > 0:
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for p in params:
            if p.grad is not None:
                (p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad).mul_(coef)
    return norm
