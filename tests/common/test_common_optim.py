"""make_adam: torch's fused Adam/AdamW where every parameter allows it, the same updates as the per-parameter one."""
from __future__ import annotations

import pytest
import torch

from pacs.metric.common.optim import fused_supported, make_adam


@pytest.mark.parametrize(("decoupled", "options"), [(False, {"lr": 1e-2, "betas": (0.9, 0.98)}),
                                                    (True, {"lr": 1e-2, "weight_decay": 0.1})])
def test_make_adam_is_fused_on_cpu_and_matches_the_per_parameter_update(decoupled, options):
    generator = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    start = [torch.randn(shape, generator=generator) for shape in shapes]
    fused = [p.clone().requires_grad_(True) for p in start]
    reference = [p.clone().requires_grad_(True) for p in start]
    optimizer = make_adam(fused, decoupled_weight_decay=decoupled, **options)
    expected_cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    assert type(optimizer) is expected_cls and optimizer.defaults["fused"] is True
    baseline = expected_cls(reference, foreach=False, **options)
    for _ in range(20):
        for a, b in zip(fused, reference):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.clone()
        optimizer.step()
        baseline.step()
    for a, b, s in zip(fused, reference, start):
        assert torch.allclose(a, b, atol=1e-6) and not torch.allclose(a, s, atol=1e-2)


def test_make_adam_falls_back_where_no_fused_kernel_exists():
    assert not fused_supported([]) and not fused_supported([torch.zeros(2, dtype=torch.long)])
    assert not fused_supported([torch.zeros(2, device="meta")])
    optimizer = make_adam([torch.zeros(2, device="meta", requires_grad=True)], lr=1e-3)
    assert not optimizer.defaults["fused"]
