"""The settings every trainer shares (metric, XE and SCST): seed, precision, resume, checkpoint/eval/log cadence.

`TrainerConfig` is a keyword-only dataclass base: the metric trainer's `MetricTrainConfig`, the captioner's
`XEConfig` and `SCSTConfig` derive from it (overriding defaults where they differ) so the same setting has the
same name and type everywhere. One rule for the cadences: ``save_every`` / ``eval_every`` / ``log_every`` = N
acts every N optimizer steps, 0 turns the periodic action off (what each trainer still does once at the end is
documented in docs/config.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from annotated_types import Le

from pacs.metric.common.config import MAX_STEPS, NonNegativeInt
from pacs.metric.common.errors import InputError

MIXED_PRECISIONS = ("no", "fp16", "bf16")


@dataclass(kw_only=True)
class TrainerConfig:
    """Settings shared by every trainer (keyword-only; a trainer's config derives from it)."""

    output_dir: str = "runs/train"
    seed: int = 0  # in [0, 2**32 - 1], checked by validate() (subclasses override the default, not the check)
    mixed_precision: str = "no"  # no, fp16 or bf16 (accelerate's autocast)
    resume: str | None = None  # a saved state/checkpoint folder, or "latest"
    save_every: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 0  # save resumable state every N optimizer steps (0: no periodic saving)
    eval_every: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 0  # validate every N optimizer steps (0: no periodic validation)
    log_every: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 10  # log the training loss every N optimizer steps (0: no periodic logging)

    def validate(self) -> None:
        """Checks of the shared fields (a subclass's validate() calls this first)."""
        if self.mixed_precision not in MIXED_PRECISIONS:
            raise InputError(f"mixed_precision must be no, fp16 or bf16, got {self.mixed_precision!r}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise InputError(f"seed={self.seed!r}: expected int >= 0 and <= {2**32 - 1}")


def resume_target(resume: str | None) -> str | None:
    """The checkpoint folder `resume` names, or None for the newest one ("latest" or empty)."""
    return None if not resume or resume == "latest" else resume


def is_due(step: int, every: int) -> bool:
    """Whether a periodic action with cadence `every` (0: off) runs after optimizer step `step`."""
    return every > 0 and step % every == 0
