"""Optimizer construction shared by the trainers: Adam/AdamW with torch's fused kernel where it has one.

The fused kernel updates every parameter in one call instead of a dozen tensor operations per parameter: on the
demo's tiny CLIP (3.5 M parameters, 2 CPU threads) an AdamW step takes 0.16 of the per-parameter step's time, on its
captioner 0.27 (`bench/bench_optimizer.py`); the parameters differ by float rounding (about 5e-8 after 30 steps).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

FUSED_DEVICE_TYPES = ("cpu", "cuda")  # where torch 2.x ships fused Adam/AdamW kernels for float parameters


def fused_supported(parameters: Iterable[torch.Tensor]) -> bool:
    """Whether every parameter is a floating-point tensor on a device with a fused Adam kernel."""
    parameters = list(parameters)
    return bool(parameters) and all(p.device.type in FUSED_DEVICE_TYPES and p.is_floating_point()
                                    for p in parameters)


def make_adam(parameters: Iterable[torch.nn.Parameter], decoupled_weight_decay: bool = False,
              **options: Any) -> torch.optim.Optimizer:
    """`torch.optim.Adam` (or `AdamW` with `decoupled_weight_decay`) over `parameters`, fused where supported."""
    parameters = list(parameters)
    cls = torch.optim.AdamW if decoupled_weight_decay else torch.optim.Adam
    return cls(parameters, fused=True if fused_supported(parameters) else None, **options)
