"""Cross-process helpers for metric training: gather embeddings with gradients through the local shard."""
from __future__ import annotations

import torch
import torch.distributed as dist


def world_size() -> int:
    """The number of torch.distributed processes (1 when nothing is initialised)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's torch.distributed rank (0 when nothing is initialised)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def gather_with_grad(local: torch.Tensor) -> torch.Tensor:
    """Concatenate every process's ``[n, ...]`` shard in rank order; gradients flow only into `local`.

    As open_clip's ``gather_features`` (``gather_with_grad=False``): the other shards are detached copies from
    ``all_gather`` and this process's slot is replaced by `local` itself, so back-propagating a loss on the
    result gives exactly ``d loss / d local``. Every process must pass a tensor of the same shape.
    """
    size = world_size()
    if size == 1:
        return local
    shards = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(shards, local.detach().contiguous())
    shards[rank()] = local
    return torch.cat(shards, dim=0)
