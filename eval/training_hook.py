"""Periodic correlation during metric training: a hook running an eval benchmark on the current weights.

`pacs.metric.training.trainer.train_metric(..., correlation_hook=...)` calls the hook with the backbone being
trained and logs its numbers as ``corr_<key>``; the metric package never imports eval, the caller (the
`pacs train-metric` command, a recipe, a script) builds the hook here and passes it in.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pacs.metric.common.errors import InputError

if TYPE_CHECKING:
    from pacs.metric.models.backbones import Backbone
    from pacs.metric.training.config import CorrelationOptions

#: the metric a backbone family is scored with
METRIC_OF_FAMILY = {"pac-s++": "pac-s++", "pac-s": "pac-s", "clip": "clip-s"}

CorrelationHook = Callable[["Backbone"], dict[str, float]]


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        out[prefix] = float(value)
    elif isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}_{key}" if prefix else str(key), inner, out)


def benchmark_correlation(benchmark: str, data: str | None, images: str | None, backbone: Backbone,
                          batch_size: int = 64) -> dict[str, float]:
    """Run `benchmark` on the current weights with the metric of the backbone's family; flat numeric results.

    Judged pairs whose image is missing are skipped (and counted by the benchmark), as during training a
    partial image folder is common; the keys are e.g. ``tau_b``, ``tau_c``, ``n`` or ``HC``, ``mean``.
    """
    from pacs.eval.benchmarks import RunContext, get_benchmark
    from pacs.eval.caption_scoring import MetricSuite
    from pacs.metric.scoring.scorer import Scorer

    if not data:
        raise InputError("correlation.data is required with correlation.benchmark")
    metric = METRIC_OF_FAMILY.get(backbone.family, "clip-s")
    bench = get_benchmark(benchmark)
    suite = MetricSuite(metrics=[metric], scorer_factory=lambda name: Scorer(backbone, batch_size=batch_size))
    context = RunContext(data=Path(data), suite=suite, images=Path(images) if images else None,
                         skip_missing_images=True)  # the benchmark's options: their defaults
    table = bench.run(context)
    flat: dict[str, float] = {}
    _flatten("", table.get(metric, {}), flat)
    return flat


def correlation_hook(benchmark: str, data: str | None, images: str | None = None,
                     batch_size: int = 64) -> CorrelationHook:
    """A hook for `train_metric(correlation_hook=...)`: `benchmark_correlation` on the backbone it is given."""
    def hook(backbone: Backbone) -> dict[str, float]:
        return benchmark_correlation(benchmark, data, images, backbone, batch_size)

    return hook


def correlation_hook_from_config(options: CorrelationOptions) -> CorrelationHook | None:
    """The hook a training config's `correlation` section asks for (None without a benchmark or cadence)."""
    if not options.benchmark or not options.every:
        return None
    return correlation_hook(options.benchmark, options.data, options.images)
