"""One model per contrastive column: `pacs evaluate --metric-model METRIC=SPEC` (a paper's system table in one call).

`SPEC` is `SOURCE[,arch=FILE][,family=NAME][,w=NUMBER]`. `SOURCE` is a checkpoint when it names an existing file
or folder (an official PAC-S / PAC-S++ file, a pacs checkpoint, an adapter or transformers folder), else a
backbone (`ViT-B-32/openai`, `ViT-B-32/FILE`, `tiny-random`, `local-dir:FOLDER`). A model given for a metric also
scores its Ref- variant unless that one has its own (`pac-s=FILE` gives `pac-s` and `ref-pac-s`). The other
model options (`--device`, `--batch-size`, `--lora-mode`, ...) are shared by every column; `w` defaults to the
metric's own (CLIP-S 2.5, PAC-S 2.0, PAC-S++ 2.5 on ViT-B/32, 3.0 on ViT-L/14), then `--w`.

>>> [spec.backbone for spec in parse_metric_models(["clip-s=tiny-random,w=2"]).values()]
['tiny-random']
>>> parse_metric_models(["clip-s=tiny-random,w=2"])["clip-s"].w
2.0
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pacs.metric.common.errors import InputError
from pacs.metric.scoring.model_options import ModelOptions

KEYS = ("arch", "family", "w")


@dataclass(frozen=True)
class MetricModel:
    """The model of one contrastive column, as given with `--metric-model METRIC=SPEC`."""

    metric: str
    spec: str
    checkpoint: str | None = None
    backbone: str | None = None
    arch: str | None = None
    family: str | None = None
    w: float | None = None


def _parse_one(metric: str, spec: str) -> MetricModel:
    """One `SPEC` of `metric` (see the module docstring); InputError naming it when malformed."""
    from pacs.metric.scoring.registry import METRICS

    flag = f"--metric-model {metric}={spec}"
    name = str(metric).strip().lower()
    if name not in METRICS:
        raise InputError(f"{flag}: {metric!r} is not a contrastive metric (one of {', '.join(METRICS)})",
                         parameter="metric_models")
    source, *options = [part.strip() for part in str(spec).split(",")]
    if not source:
        raise InputError(f"{flag}: expected METRIC=SOURCE[,arch=FILE][,family=NAME][,w=NUMBER]",
                         parameter="metric_models")
    values: dict[str, Any] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key.strip() not in KEYS or not value.strip():
            raise InputError(f"{flag}: {option!r} is not one of {', '.join(k + '=...' for k in KEYS)}",
                             parameter="metric_models")
        values[key.strip()] = value.strip()
    if "w" in values:
        try:
            values["w"] = float(values["w"])
        except ValueError:
            values["w"] = math.nan
        if not math.isfinite(values["w"]) or values["w"] <= 0:
            raise InputError(f"{flag}: w must be a positive number", parameter="metric_models")
    is_file = Path(source).exists()
    return MetricModel(name, str(spec), checkpoint=source if is_file else None,
                       backbone=None if is_file else source, **values)


def parse_metric_models(specs: Sequence[str] | Mapping[str, str] | None) -> dict[str, MetricModel]:
    """`{metric: MetricModel}` of `METRIC=SPEC` strings (or a `{metric: SPEC}` mapping); a metric given twice, an
    unknown metric or a malformed SPEC is an InputError naming it."""
    if not specs:
        return {}
    pairs: list[tuple[str, str]] = []
    if isinstance(specs, Mapping):
        pairs = [(str(k), str(v)) for k, v in specs.items()]
    else:
        for text in specs:
            metric, sep, spec = str(text).partition("=")
            if not sep or not metric.strip() or not spec.strip():
                raise InputError(f"--metric-model {text!r}: expected METRIC=SPEC (e.g. pac-s=clip_ViT-B-32.pth)",
                                 parameter="metric_models")
            pairs.append((metric, spec))
    models: dict[str, MetricModel] = {}
    for metric, spec in pairs:
        model = _parse_one(metric, spec)
        if model.metric in models:
            raise InputError(f"--metric-model: {model.metric} is given twice", parameter="metric_models")
        models[model.metric] = model
    return models


def model_of(metric: str, models: Mapping[str, MetricModel]) -> MetricModel | None:
    """The model given for `metric`, else the one given for its reference-free form (`ref-pac-s` -> `pac-s`)."""
    if metric in models:
        return models[metric]
    return models.get(metric[len("ref-"):]) if metric.startswith("ref-") else None


def options_for(metric: str, base: ModelOptions, models: Mapping[str, MetricModel]) -> ModelOptions:
    """The model options of one column: `base` with the column's model (source, arch, family, w) when given."""
    model = model_of(metric, models)
    if model is None:
        return base
    return dataclasses.replace(base, checkpoint=model.checkpoint, backbone=model.backbone, arch=model.arch,
                               family=model.family, w=model.w if model.w is not None else base.w)


def check_columns(metrics: Sequence[str], models: Mapping[str, MetricModel]) -> None:
    """Every `--metric-model` metric must be a column (itself or its Ref- variant): InputError naming it."""
    for metric in models:
        if metric not in metrics and f"ref-{metric}" not in metrics:
            raise InputError(f"--metric-model {metric}=...: {metric} is not among the metrics "
                             f"({', '.join(metrics)}); add it to --metrics", parameter="metric_models")


def column_factory(base: ModelOptions, models: Mapping[str, MetricModel],
                   identities: dict[str, Any] | None = None) -> Callable[[str], Any]:
    """A scorer factory building each contrastive column's Scorer with its own model (`options_for`); records
    each model's identity by metric in `identities` (the provenance's `models`)."""
    def factory(metric: str) -> Any:
        from pacs.metric.scoring.model_options import build_scorer, model_identity

        scorer = build_scorer(metric, options_for(metric, base, models))
        if identities is not None:
            identities[metric] = model_identity(scorer.backbone)
        return scorer
    return factory


def column_record(metric: str, scorer: Any, models: Mapping[str, MetricModel], base: ModelOptions,
                  own_factory: bool = False) -> dict[str, Any]:
    """What the table records of a contrastive column: its model, family, how the family was established, `w`
    and where the model was given (`--metric-model SPEC`, `--checkpoint`, `--backbone`, the default CLIP, or the
    caller's own scorer factory)."""
    backbone = getattr(scorer, "backbone", None)
    model = model_of(metric, models)
    if own_factory:
        given = "the caller's scorer"
    elif model is not None:
        given = f"--metric-model {model.metric}={model.spec}"
    elif base.checkpoint:
        given = f"--checkpoint {base.checkpoint}"
    elif base.backbone:
        given = f"--backbone {base.backbone}"
    else:
        given = "the default model"
    w = getattr(scorer, "w", None)
    return {"model": getattr(backbone, "name", None), "family": getattr(backbone, "family", None),
            "family_source": getattr(backbone, "family_source", None),
            "w": float(w) if w is not None else None, "given": given,
            "checkpoint_sha256": (getattr(backbone, "source", None) or {}).get("sha256")}
