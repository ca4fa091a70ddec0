"""Pieces shared by the XE and SCST stages: the accelerator, trackers (CSV + the named ones), the LR schedule and
the deterministic batch plan (which examples each process sees at each step, so the position in the data is
just `(epoch, position)` and one process or many see the same global batches).
"""
from __future__ import annotations

import csv
import importlib.util
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from accelerate import Accelerator, PartialState
from accelerate.tracking import GeneralTracker
from accelerate.utils import LoggerType
from annotated_types import Le

from pacs.metric.common.config import MAX_STEPS, NonNegativeFloat, NonNegativeInt, PositiveFloat, check_batch_split
from pacs.metric.common.device import build_accelerator
from pacs.metric.common.device import process_state as device_process_state
from pacs.metric.common.errors import InputError
from pacs.metric.common.link_safety import open_no_follow
from pacs.metric.common.suggest import known_hint

logger = logging.getLogger(__name__)


class CSVTracker(GeneralTracker):
    """An accelerate tracker writing one row per logged step to a CSV file (fixed columns, blanks allowed).

    On resume (`resume_step`), rows logged after that step by an interrupted run are dropped first.
    """

    name = "csv"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, path: str | os.PathLike, columns: Sequence[str], resume_step: int | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.columns = ["step", *[c for c in columns if c != "step"]]
        self.resume_step = resume_step

    def start(self) -> None:
        """Create the file (or truncate rows beyond the resumed step)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: list[dict[str, str]] = []
        if self.resume_step is not None and self.path.is_file():
            with open(self.path, newline="", encoding="utf-8") as handle:
                kept = [row for row in csv.DictReader(handle) if int(float(row["step"])) <= self.resume_step]
        with open_no_follow(self.path, "w", newline="", encoding="utf-8") as handle:  # never through a link
            writer = csv.DictWriter(handle, fieldnames=self.columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)

    @property
    def tracker(self) -> Path:
        """The CSV path."""
        return self.path

    def store_init_configuration(self, values: dict) -> None:
        """Configuration goes to the run's YAML, not the CSV."""

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Append one row."""
        row = {key: (f"{value:.8g}" if isinstance(value, float) else value) for key, value in values.items()}
        row["step"] = step
        with open_no_follow(self.path, "a", newline="", encoding="utf-8") as handle:
            csv.DictWriter(handle, fieldnames=self.columns, extrasaction="ignore").writerow(row)


def process_state(device: str = "auto") -> PartialState:
    """accelerate's process state (rank, world, device), honouring `ACCELERATE_USE_CPU` like `Accelerator` does.

    `device` cpu sets a new state up on the CPU (`pacs.metric.common.device.process_state`, the one place that creates
    it). Two CPU processes: `accelerate launch --cpu --num_processes 2 ...` (the entry points re-execute themselves
    under torchrun, see `pacs.captioner.orchestration.launching`) or `ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu ...`.
    """

    return device_process_state(device)


#: the trackers `trackers:` may name: accelerate's (`log_with`), each installed as the package of its name
TRACKERS = tuple(kind.value for kind in LoggerType if kind.value != "all")
#: what an XE / SCST section logs to when it names no trackers (when the package is installed)
DEFAULT_TRACKERS = ("tensorboard",)


def tracker_names(trackers: Sequence[str] | None, tensorboard: bool | None = None, section: str = "xe") -> list[str]:
    """The trackers of an XE / SCST section: `trackers` checked (a known name, its package installed), or the default.

    None: TensorBoard when it is installed. `tensorboard` (the deprecated bool key) still removes it (false) or
    adds it to a list (true), with a warning. InputError: an unknown name (with did-you-mean) or one whose package
    is not installed.
    """
    if tensorboard is not None:
        logger.warning("%s.tensorboard is deprecated and goes in 0.8: write %s.trackers: %s", section, section,
                       "[tensorboard]" if tensorboard else "[]")
        if not tensorboard:
            trackers = [name for name in (DEFAULT_TRACKERS if trackers is None else trackers) if name != "tensorboard"]
        elif trackers is not None and "tensorboard" not in trackers:
            trackers = [*trackers, "tensorboard"]
    if trackers is None:
        return [name for name in DEFAULT_TRACKERS if importlib.util.find_spec(name) is not None]
    names = list(dict.fromkeys(str(name).strip() for name in trackers))
    for name in names:
        if name not in TRACKERS:
            raise InputError(f"trackers: unknown tracker {name!r} {known_hint(name, TRACKERS)}",
                             parameter="trackers")
        if importlib.util.find_spec(name) is None:  # accelerate would drop it without a word
            raise InputError(f"trackers: {name} is not installed (pip install {name})", parameter="trackers")
    return names


def check_trackers(config: Any, section: str) -> None:
    """The XE / SCST configs' `validate` part: their `trackers` checked, the deprecated `tensorboard` key folded in."""
    if config.tensorboard is not None:  # warned once, when the config is read
        config.trackers, config.tensorboard = tracker_names(config.trackers, config.tensorboard, section), None
    else:
        config.trackers = None if config.trackers is None else tracker_names(config.trackers, None, section)


def make_accelerator(output_dir: str | os.PathLike, csv_name: str, columns: Sequence[str],
                     mixed_precision: str = "no", trackers: Sequence[str] | None = None,
                     device: str = "auto") -> Accelerator:
    """An Accelerator logging to `<output_dir>/<csv_name>` and to `trackers` (accelerate's `log_with`; None:
    `tracker_names`' default) under `<output_dir>/`, on the process state's device
    (`pacs.metric.common.device.build_accelerator`: `device` must agree with it). A wandb run lives in
    `<output_dir>/wandb` and honours `WANDB_MODE=offline`."""

    log_with: list[Any] = [CSVTracker(Path(output_dir) / csv_name, columns),
                           *(tracker_names(None) if trackers is None else list(trackers))]
    return build_accelerator(device, mixed_precision, log_with=log_with, project_dir=str(output_dir),
                             step_scheduler_with_optimizer=False)


def start_trackers(accelerator: Accelerator, project: str, config: dict[str, Any], resume_step: int | None) -> None:
    """Start the trackers (after a resume, the CSV drops rows logged beyond `resume_step`)."""
    for tracker in accelerator.log_with:
        if isinstance(tracker, CSVTracker):
            tracker.resume_step = resume_step
    flat = {key: value for key, value in _flatten(config).items() if isinstance(value, (int, float, str, bool))}
    names = {getattr(tracker, "value", tracker) for tracker in accelerator.log_with}
    kwargs = {"wandb": {"dir": accelerator.project_dir}} if "wandb" in names else {}  # not ./wandb in the cwd
    accelerator.init_trackers(project, config=flat, init_kwargs=kwargs)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def finish_trackers(accelerator: Accelerator) -> None:
    """Close the trackers of a stage (unlike `end_training`, keeps the process group for the next stage)."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        for tracker in accelerator.trackers:
            tracker.finish()
    accelerator.trackers = []


@dataclass
class ScheduleConfig:
    """PAC-S++ XE schedule: linear warm-up, constant, sub-linear decay, constant."""

    warmup_steps: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 1000
    constant_until: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 10000
    decay_until: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 15000
    peak_lr: PositiveFloat = 2.5e-4
    final_lr: NonNegativeFloat = 1e-5
    decay_power: PositiveFloat = 0.5


def pacs_lr(step: int, s: ScheduleConfig) -> float:
    """LR at optimizer step `step` (0-based).

    Warm-up: `peak·(step+1)/warmup`; constant `peak` until `constant_until`; then
    `final + (peak−final)·(1−p)^decay_power` with `p` the fraction of the decay window elapsed
    (power 0.5 = square-root shape: slower than linear at first, reaching `final` at `decay_until`);
    constant `final` afterwards.
    """
    if s.warmup_steps > 0 and step < s.warmup_steps:
        return s.peak_lr * (step + 1) / s.warmup_steps
    if step < s.constant_until:
        return s.peak_lr
    if step < s.decay_until:
        p = (step - s.constant_until) / max(1, s.decay_until - s.constant_until)
        return s.final_lr + (s.peak_lr - s.final_lr) * (1.0 - p) ** s.decay_power
    return s.final_lr


def pacs_scheduler(optimizer: torch.optim.Optimizer, s: ScheduleConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR following `pacs_lr` (the optimizer's base LR must be `s.peak_lr`)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: pacs_lr(step, s) / s.peak_lr)


def micro_batch_for(batch_size: int, micro_batch_size: int | None, processes: int, what: str) -> int:
    """The per-process micro-batch for a global `batch_size` on `processes` processes (InputError if none fits).

    `micro_batch_size` 0 or None means "not fixed": the whole per-process share, `batch_size // processes`.
    """

    if not micro_batch_size:
        if batch_size < 1 or batch_size % processes:
            raise InputError(f"{what}: batch_size={batch_size} cannot be split evenly over {processes} processes")
        micro_batch_size = batch_size // processes
    check_batch_split(what, batch_size, micro_batch_size, processes)
    return micro_batch_size


class BatchPlan:
    """Deterministic global batches over `n` examples: epoch `e` uses `randperm(n, seed + e)`; the last
    partial batch of an epoch is dropped. Process `rank` of `world` takes `batch[rank::world]`."""

    def __init__(self, n: int, global_batch: int, micro_batch: int, world: int, seed: int, what: str) -> None:
        if global_batch % world or (global_batch // world) % micro_batch:
            raise InputError(f"{what}: batch_size={global_batch} must be a multiple of processes ({world}) × "
                             f"micro_batch_size ({micro_batch})")
        if n < global_batch:
            raise InputError(f"{what}: batch_size={global_batch} exceeds the {n} training examples")
        self.n, self.global_batch, self.micro_batch, self.world, self.seed = n, global_batch, micro_batch, world, seed
        self.steps_per_epoch = n // global_batch
        self.dropped_per_epoch = n - self.steps_per_epoch * global_batch
        self._epoch, self._perm = -1, None

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per process per optimizer step."""
        return self.global_batch // self.world // self.micro_batch

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.n, generator=generator)
            self._perm = order.to(torch.int32) if self.n < 2**31 else order  # kept: 4 bytes per example
            self._epoch = epoch
        return self._perm

    def local_micro_batches(self, epoch: int, position: int, rank: int) -> list[list[int]]:
        """This process's micro-batches (example indices) of the global batch starting at `position`."""
        indices = self._permutation(epoch)[position:position + self.global_batch][rank::self.world].tolist()
        return [indices[i:i + self.micro_batch] for i in range(0, len(indices), self.micro_batch)]

    def advance(self, epoch: int, position: int) -> tuple[int, int]:
        """The (epoch, position) after one more global batch."""
        position += self.global_batch
        if position + self.global_batch > self.n:
            return epoch + 1, 0
        return epoch, position


def reduce_mean(accelerator: Accelerator, value: float) -> float:
    """Mean of a float over processes (each process contributing equally)."""
    tensor = torch.tensor([float(value)], device=accelerator.device, dtype=torch.float64)
    return float(accelerator.reduce(tensor, reduction="mean").item())


def finite_or_nan(value: float) -> float:
    """`value`, or NaN when it is not finite (for logging)."""
    return value if math.isfinite(value) else float("nan")
