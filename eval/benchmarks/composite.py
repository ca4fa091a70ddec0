"""Composite (Aditya et al. 2015): about 12k 1-5 correctness ratings of COCO, Flickr8k and Flickr30k captions.

Input (`--data`): the clipscore-format json used by the CLIPScore / PAC-S correlation code
(`{key: {"image_path", "ground_truth": [...], "human_judgement": [{"caption", "rating"}]}}`), or a folder
holding it as `composite.json`. One row per judgment; NaN ratings are skipped and counted; Kendall τb / τc ×100.
"""
from __future__ import annotations

from typing import Any

from pacs.eval.benchmarks import Benchmark, RunContext, register_benchmark
from pacs.eval.benchmarks.flickr8k import correlate_rows, load_clipscore_json
from pacs.metric.common.errors import InputError


@register_benchmark("composite")
class Composite(Benchmark):
    """Composite: Kendall τb/τc against 1-5 human ratings."""

    description = "Composite (Kendall tau-b / tau-c, one row per judgment)"

    def run(self, context: RunContext) -> dict[str, Any]:
        """Correlate every metric with the Composite ratings."""
        path = context.data / "composite.json" if context.data.is_dir() else context.data
        if not path.is_file():
            raise InputError(f"{path} not found (data= is composite.json or a folder holding it)",
                             parameter="data")
        return correlate_rows(load_clipscore_json(path, context), context)
