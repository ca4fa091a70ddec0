"""Stopping a training that diverged: non-finite losses and weights become one `TrainingDivergedError`.

Every trainer (metric training, captioner XE and SCST) checks the loss of every optimizer step (the sum of its
micro-batch losses, so a NaN in any micro-batch shows) before applying the step, and the weights at every
validation, checkpoint and final save. The checks are collective — `any_process` all-reduces the verdict — so
under several processes every rank raises at the same step and none waits for the others (no deadlock).
A stage stopped this way leaves no non-finite "best" or "final" model behind.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from pacs.metric.common.errors import TrainingDivergedError


def any_process(accelerator: Any, flag: bool) -> bool:
    """True on every process when `flag` is true on any of them (an all-reduce: call it on every process)."""
    if accelerator is None or getattr(accelerator, "num_processes", 1) <= 1:
        return bool(flag)
    tensor = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(tensor, reduction="sum").item() > 0)


def nonfinite_parameter(named_parameters: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """The name of the first tensor holding a NaN or an infinity (None when all are finite)."""
    with torch.no_grad():
        for name, tensor in named_parameters:
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                return name
    return None


def diverged(stage: str, step: int, what: str, hint: str) -> TrainingDivergedError:
    """The error of a stage that diverged at optimizer `step`: what was not finite, and the likely fix."""
    return TrainingDivergedError(
        f"{stage}: training diverged at optimizer step {step}: {what}; the stage stopped and saved no model "
        f"from it (no best, no final). Lower the learning rate ({hint}) or clip the gradients")


def check_loss(accelerator: Any, loss: float, stage: str, step: int, hint: str) -> None:
    """TrainingDivergedError on every process when the loss of optimizer `step` is not finite on any of them."""
    if any_process(accelerator, not math.isfinite(loss)):
        shown = f"{loss}" if not math.isfinite(loss) else "not finite on another process"
        raise diverged(stage, step, f"the training loss is {shown}", hint)


def check_weights(accelerator: Any, model: torch.nn.Module, stage: str, step: int, hint: str) -> None:
    """TrainingDivergedError on every process when a weight of `model` is NaN/inf on any of them."""
    name = nonfinite_parameter(model.named_parameters())
    if any_process(accelerator, name is not None):
        where = f"weight {name!r}" if name else "a weight (on another process)"
        if step == 0:
            raise TrainingDivergedError(f"{stage}: {where} is not finite (NaN/inf) before the first optimizer "
                                        "step: the initial model is broken (check the checkpoint it was loaded from)")
        raise diverged(stage, step, f"{where} is not finite after the step", hint)
