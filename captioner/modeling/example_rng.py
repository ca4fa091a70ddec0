"""Per-example random streams for training: one generator per (seed, step, global example index, purpose).

Every random draw made for a training example — its dropout masks, its sampled captions — comes from its own
`torch.Generator`, so the draws do not depend on which process or micro-batch the example lands in: splitting a
global batch over 1 or N processes and any micro-batch size gives the same masks and the same samples, and a
resumed run needs no generator state beyond the step number.

A tensor with `N = B·r` rows over a batch of `B` examples is read as `r` consecutive rows per example (the
captioner's decoder holds the `k` captions of an image next to each other).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from pacs.metric.common.errors import PacsError

DROPOUT = 0
SAMPLING = 1
POOL_BLOCK = 1 << 15  # values drawn per example and refill (at least 4 calls' worth)


def example_seed(seed: int, step: int, index: int, purpose: int) -> int:
    """A 63-bit seed mixing (seed, step, example index, purpose) with numpy's SeedSequence hash."""
    words = np.random.SeedSequence([int(x) % 2**64 for x in (seed, step, index, purpose)]).generate_state(2)
    return (int(words[0]) << 31) | (int(words[1]) >> 1)


def example_generators(seed: int, step: int, indices: Sequence[int], purpose: int,
                       device: torch.device | str = "cpu") -> list[torch.Generator]:
    """One freshly seeded generator per example of `indices` (global example indices) on `device`."""
    device = torch.device(device)
    return [torch.Generator(device=device).manual_seed(example_seed(seed, step, int(i), purpose)) for i in indices]


class ExampleRNG:
    """Draws for the rows of a batch, each example's rows from that example's own generator (in batch order)."""

    def __init__(self, generators: Sequence[torch.Generator]) -> None:
        if not generators:
            raise PacsError("ExampleRNG needs at least one generator")
        self.generators = list(generators)
        self._pool: torch.Tensor | None = None  # [examples, values]: the next values of each generator's stream
        self._used = 0

    def rows_per_example(self, rows: int) -> int:
        """How many consecutive rows of a `rows`-row tensor belong to each example."""
        if rows % len(self.generators):
            raise PacsError(f"a tensor with {rows} rows cannot be split over {len(self.generators)} examples")
        return rows // len(self.generators)

    def rand(self, shape: Sequence[int], device: torch.device | str) -> torch.Tensor:
        """Uniform [0, 1) float32 values of `shape`; rows of example `e` drawn from generator `e`.

        Each example's values are the next ones of its generator's stream, served from a pool refilled in
        blocks (one `torch.rand` per example and block, not per call), so a dropout site costs a slice of
        the pool instead of one draw per example. Refills happen at the same points for every example (all
        consume the same count per call), so an example's values depend only on its generator.
        """
        per = self.rows_per_example(int(shape[0]))
        rest = tuple(int(s) for s in shape[1:])
        count = per * math.prod(rest)
        device = torch.device(device)
        if self._pool is None or self._pool.device != device or self._used + count > self._pool.shape[1]:
            self._refill(count, device)
        values = self._pool[:, self._used:self._used + count]
        self._used += count
        return values.reshape(len(self.generators) * per, *rest)

    def _refill(self, count: int, device: torch.device) -> None:
        """Move what is left of the pool to the front and fill the rest with the next block of each stream."""
        block = max(POOL_BLOCK, 4 * count)
        pool = self._pool if self._pool is not None and self._pool.device == device else None
        left = pool.shape[1] - self._used if pool is not None else 0
        fresh = torch.empty((len(self.generators), left + block), dtype=torch.float32, device=device)
        if left:
            fresh[:, :left] = pool[:, self._used:]
        for row, generator in zip(fresh, self.generators):
            row[left:].uniform_(generator=generator)  # a row of a contiguous tensor: one call per example
        self._pool, self._used = fresh, 0

    def multinomial(self, probs: torch.Tensor) -> torch.Tensor:
        """One index per row of `probs [N, V]`; rows of example `e` sampled with generator `e`."""
        per = self.rows_per_example(probs.shape[0])
        return torch.cat([torch.multinomial(probs[e * per:(e + 1) * per], 1, generator=g).squeeze(-1)
                          for e, g in enumerate(self.generators)])
