"""Closing decode pools ends their worker processes: a process that still holds a pool can always exit."""
from __future__ import annotations

import pytest
import torch

from pacs.metric.scoring import decode_pool

pytestmark = pytest.mark.skipif(not decode_pool.fork_available(), reason="decode pools need fork")


def _pixels(item: int) -> torch.Tensor:
    return torch.full((1, 2, 2), float(item))


def test_close_all_ends_every_open_pools_workers_and_forgets_them():
    pools = [decode_pool.DecodePool(_pixels, 2, (1, 2, 2)) for _ in range(2)]
    for pool in pools:  # the workers start with the first task
        assert torch.equal(next(pool.batches([3, 4], 2)), torch.stack([_pixels(3), _pixels(4)]))
    workers = [process for pool in pools for process in pool._executor._processes.values()]
    assert len(workers) == 4 and all(process.is_alive() for process in workers)

    decode_pool.close_all()

    assert not any(process.is_alive() for process in workers)
    assert not list(decode_pool._LIVE)
    decode_pool.close_all()  # closing twice is harmless
