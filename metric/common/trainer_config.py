"""The settings every trainer shares (metric, XE and SCST): seed, precision, resume, checkpoint/eval/log cadence.

`TrainerConfig` is a keyword-only dataclass base: the metric trainer's `MetricTrainConfig`, the captioner's
`XEConfig` and `SCSTConfig` derive from it (overriding defaults where they differ) so the same setting has the
same name and type everywhere. One rule for the cadences: ``save_every`` / ``eval_every`` / ``log_every`` = N
acts every N optimizer steps, 0 turns the periodic action off (what each trainer still does once at the end is
documented in docs/config.md).

The names the captioner trainers used before (``resume_from``, ``checkpoint_every``, ``val_every``) remain
deprecated aliases for one release (removed in pacs 0.4): in YAML and ``key=value`` overrides
(`pacs.metric.common.config` renames them with a warning), as constructor keywords and as attributes.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from annotated_types import Le

from pacs.metric.common.config import MAX_STEPS, NonNegativeInt
from pacs.metric.common.errors import InputError

MIXED_PRECISIONS = ("no", "fp16", "bf16")
DEPRECATED_TRAINER_ALIASES = {"resume_from": "resume", "checkpoint_every": "save_every", "val_every": "eval_every"}


def _alias_warning(cls_name: str, old: str, new: str) -> str:
    return f"{cls_name}.{old} is deprecated (removed in pacs 0.4): use {new}"


class _AliasedInit(type):
    """Metaclass that lets the constructor take a deprecated keyword for one release (with a warning)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        """Rename deprecated keywords to their new names, then construct as usual."""
        aliases: dict[str, str] = getattr(cls, "DEPRECATED_ALIASES", {})
        for old, new in aliases.items():
            if old in kwargs:
                if new in kwargs:
                    raise InputError(f"{cls.__name__}: {old} and {new} are the same setting ({old} is its "
                                     f"deprecated name): give only {new}")
                warnings.warn(_alias_warning(cls.__name__, old, new), DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
        return super().__call__(*args, **kwargs)


@dataclass(kw_only=True)
class TrainerConfig(metaclass=_AliasedInit):
    """Settings shared by every trainer (keyword-only; a trainer's config derives from it)."""

    DEPRECATED_ALIASES: ClassVar[dict[str, str]] = DEPRECATED_TRAINER_ALIASES

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

    def __getattr__(self, name: str) -> Any:
        """Read a deprecated name (e.g. ``val_every``) as its new field, with a DeprecationWarning."""
        new = type(self).DEPRECATED_ALIASES.get(name)
        if new is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        warnings.warn(_alias_warning(type(self).__name__, name, new), DeprecationWarning, stacklevel=2)
        return getattr(self, new)

    def __setattr__(self, name: str, value: Any) -> None:
        """Write a deprecated name to its new field (with a DeprecationWarning) instead of adding an attribute."""
        new = type(self).DEPRECATED_ALIASES.get(name)
        if new is not None:
            warnings.warn(_alias_warning(type(self).__name__, name, new), DeprecationWarning, stacklevel=2)
            name = new
        object.__setattr__(self, name, value)


def resume_target(resume: str | None) -> str | None:
    """The checkpoint folder `resume` names, or None for the newest one ("latest" or empty)."""
    return None if not resume or resume == "latest" else resume


def is_due(step: int, every: int) -> bool:
    """Whether a periodic action with cadence `every` (0: off) runs after optimizer step `step`."""
    return every > 0 and step % every == 0
