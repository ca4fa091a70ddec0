"""GradCache: one contrastive loss over a whole global batch, back-propagated micro-batch by micro-batch.

Gao et al., "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup" (2021). A step is
1. pass 1: every micro-batch of this process is encoded without a graph (its RNG state saved first);
2. the cached embeddings become leaf tensors, are gathered across processes (gradient through the local shard,
   `pacs.metric.training.distributed.gather_with_grad`), the loss is computed on the full global batch and differentiated
   with respect to the leaves (d loss / d embeddings, and d loss / d temperature);
   the temperature is any tensor the encoder returns with the embeddings: CLIP's scalar scale, or SigLIP's
   ``[scale, bias]`` for the sigmoid loss (every element gets its cached gradient back in pass 2);
3. pass 2: every micro-batch is encoded again with a graph (same RNG state, so dropout masks repeat) and
   back-propagated with its slice of the cached gradients.
The parameter gradients equal those of one forward/backward of the full batch on one process. Memory: the
activations of one micro-batch at a time plus ``[global batch, E]`` embeddings; compute: one extra forward.
With a single micro-batch there is nothing to cache: the step is one forward with a graph, the gather, the loss
and one backward (open_clip's scheme), with the same gradients.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from pacs.metric.common.errors import PacsError
from pacs.metric.training.distributed import gather_with_grad, world_size

# a micro-batch -> (embedding tensors [n, E] each, or None for one not encoded, temperature: a scalar or
# [scale, bias]); the same encoder in both passes; the first embedding is always present (the micro-batch size)
Encode = Callable[[Any], tuple[Sequence[torch.Tensor | None], torch.Tensor]]


class HasTotal(Protocol):
    """Whatever the loss function returns: a scalar `total` (plus anything else, e.g. loss terms for logs)."""

    total: torch.Tensor


LossFn = Callable[[list[torch.Tensor | None], torch.Tensor], HasTotal]


class RandomState:
    """The CPU and (for a CUDA device) accelerator RNG states at one moment, restorable later."""

    def __init__(self, device: torch.device):
        self.cpu = torch.get_rng_state()
        self.device = device if device.type == "cuda" else None
        self.cuda = torch.cuda.get_rng_state(device) if self.device is not None else None

    def restore(self) -> None:
        """Put the saved states back so the next random draws repeat those made after the capture."""
        torch.set_rng_state(self.cpu)
        if self.device is not None and self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def grad_cache_step(micro_batches: Sequence[Any], encode: Encode, loss_fn: LossFn,
                    backward: Callable[[torch.Tensor], None],
                    no_sync: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
                    averaged_over: int = 1, device: torch.device | None = None) -> HasTotal:
    """Run one GradCache step over this process's `micro_batches`; return the loss of the global batch.

    `backward(scalar)` back-propagates (e.g. ``accelerator.backward``); `no_sync()` is entered for every
    micro-batch but the last (e.g. ``lambda: accelerator.no_sync(model)``) so that DDP reduces gradients once.
    `averaged_over` is the number of processes DDP averages gradients over (1 without DDP); the pass-2
    gradients are multiplied by it so that the reduced gradient is the *sum* of the shards' contributions, i.e.
    the full-batch gradient. Every process computes the same global loss, so its temperature gradient is
    split evenly between the processes. Gradients are accumulated into ``.grad``; the caller steps/zeroes.
    """
    if not micro_batches:
        raise PacsError("grad_cache_step: no micro-batch to encode")
    if len(micro_batches) == 1:
        return _direct_step(micro_batches[0], encode, loss_fn, backward, averaged_over)
    device = device or torch.device("cpu")
    states, cached, scale = [], [], None
    with torch.no_grad():
        for micro in micro_batches:
            states.append(RandomState(device))
            embeddings, scale = encode(micro)
            cached.append([None if emb is None else emb.detach() for emb in embeddings])
    sizes = [chunk[0].shape[0] for chunk in cached]
    leaves = [None if cached[0][k] is None else torch.cat([chunk[k] for chunk in cached]).requires_grad_()
              for k in range(len(cached[0]))]
    present = [leaf for leaf in leaves if leaf is not None]
    scale_leaf = scale.detach().float().requires_grad_()
    terms = loss_fn([None if leaf is None else gather_with_grad(leaf) for leaf in leaves], scale_leaf)
    grads = iter(torch.autograd.grad(terms.total, [*present, scale_leaf], allow_unused=True))
    emb_grads = [None if leaf is None else _or_zeros(next(grads), leaf) for leaf in leaves]
    scale_grad = _or_zeros(next(grads), scale_leaf)
    after = torch.get_rng_state()
    start = 0
    for index, (micro, state, size) in enumerate(zip(micro_batches, states, sizes)):
        last = index == len(micro_batches) - 1
        state.restore()
        with (contextlib.nullcontext() if last else no_sync()):
            embeddings, scale = encode(micro)
            surrogate = sum((emb * grad[start:start + size]).sum()
                            for emb, grad in zip(embeddings, emb_grads) if grad is not None)  # None: not encoded
            if last:  # the temperature once per process, in the backward that DDP reduces
                surrogate = surrogate + (scale.float() * scale_grad).sum() / world_size()
            backward(surrogate * averaged_over)
        start += size
    torch.set_rng_state(after)
    return terms


def _direct_step(micro: Any, encode: Encode, loss_fn: LossFn, backward: Callable[[torch.Tensor], None],
                 averaged_over: int) -> HasTotal:
    """One micro-batch: encode with a graph, gather, back-propagate the global loss (same scaling as above)."""
    embeddings, scale = encode(micro)
    share = 1.0 / world_size()  # same value; the temperature's gradient split between the processes
    scale = scale.float() * share + scale.float().detach() * (1.0 - share)
    terms = loss_fn([None if emb is None else gather_with_grad(emb) for emb in embeddings], scale)
    backward(terms.total * averaged_over)
    return terms


def _or_zeros(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The gradient, or zeros shaped like `like` where the loss did not depend on it."""
    return torch.zeros_like(like) if grad is None else grad
