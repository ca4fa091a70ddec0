"""Periodic correlation during metric training: run an eval benchmark (lazy import of eval.benchmarks)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metric.common.errors import InputError

if TYPE_CHECKING:
    from metric.models.backbones import Backbone

METRIC_OF_FAMILY = {"pac-s++": "pac-s++", "pac-s": "pac-s", "clip": "clip-s"}


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
    try:
        from eval.benchmarks import RunContext, get_benchmark
        from eval.scoring import MetricSuite
    except ImportError as error:
        raise InputError(f"periodic correlation needs the eval package ({error})") from None
    from metric.scoring.scorer import Scorer

    if not data:
        raise InputError("correlation.data is required with correlation.benchmark")
    metric = METRIC_OF_FAMILY.get(backbone.family, "clip-s")
    bench = get_benchmark(benchmark)
    parser = argparse.ArgumentParser(add_help=False)
    bench.add_arguments(parser)
    suite = MetricSuite(metrics=[metric], scorer_factory=lambda name: Scorer(backbone, batch_size=batch_size))
    context = RunContext(data=Path(data), suite=suite, images=Path(images) if images else None,
                         skip_missing_images=True, args=parser.parse_args([]))
    table = bench.run(context)
    flat: dict[str, float] = {}
    _flatten("", table.get(metric, {}), flat)
    return flat
