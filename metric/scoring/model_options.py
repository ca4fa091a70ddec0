"""The model options of every scoring entry point (checkpoint, backbone, w, device, ...) as one dataclass."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.scoring.registry import check_metric_family, default_w, metric_spec

if TYPE_CHECKING:  # torch and open_clip load only when a model is built
    from pacs.metric.models.backbones import Backbone
    from pacs.metric.scoring.scorer import Scorer

DEFAULT_CLIP_BACKBONE = "ViT-B-32/openai"

#: Where the defaults live. `ModelOptions`' own are the command line's and the tables' (`pacs score`, `correlate`,
#: `evaluate`, `pacs.eval.correlate`); the library entry points (`pacs.metric.score`, the torchmetrics classes and
#: the contrastive rewards) differ only in these (`library_options`). `score()` also defaults `score` and
#: `long_captions` to None: a given Scorer keeps its own per call.
LIBRARY_DEFAULTS: dict[str, Any] = {"device": "cpu"}


@dataclass
class ModelOptions:
    """Which model scores and how: what `pacs score --checkpoint/--backbone/...` and `correlate(...)` take."""

    checkpoint: str | None = field(default=None, metadata={
        "help": "official PAC-S / PAC-S++ file, open_clip state dict, pacs checkpoint or adapter folder"})
    backbone: str | None = field(default=None, metadata={
        "help": f"open_clip model name with an optional pretrained tag or local weights file "
                f"(default for clip-s: {DEFAULT_CLIP_BACKBONE})"})
    arch: str | None = field(default=None, metadata={"help": "architecture override for checkpoint files"})
    family: str | None = field(default=None, metadata={
        "help": "the checkpoint's family where its metadata, LoRA keys or file name do not establish it"})
    allow_family_mismatch: bool = field(default=False, metadata={
        "help": "score even when the metric contradicts the checkpoint's established family"})
    w: float | None = field(default=None, metadata={"help": "score weight w (default: the metric's)"})
    device: str = field(default="auto", metadata={"help": "torch device: auto (the process's: cuda, mps or cpu), "
                                                          "cpu, cuda, cuda:1, ..."})
    batch_size: int = field(default=64, metadata={"help": "images / texts per forward pass"})
    cache_dir: str | None = field(default=None, metadata={"help": "persistent image-embedding cache folder"})
    lora_mode: str = field(default="official", metadata={"help": "PAC-S++ LoRA deltas: official, all or none"})
    dtype: str = field(default="fp32", metadata={"help": "compute precision of the towers: fp32, bf16 or fp16"})
    score: str = field(default="cosine", metadata={
        "help": "score convention: cosine (w·max(cos, 0), the papers') or sigmoid (the model's calibrated "
                "sigmoid(scale·cos + bias); SigLIP-style models only)"})
    long_captions: str = field(default="truncate", metadata={
        "help": "captions longer than the text context: truncate (the papers') or chunk (sentence pieces, "
                "mean of their normalised embeddings)"})
    workers: int | str = field(default="auto", metadata={
        "help": "threads decoding images ahead of the model: auto (one per CPU core), 0 or 1 (serial) or N; "
                "the scores do not depend on it"})
    decode: str = field(default="cpu", metadata={
        "help": "image decoding: cpu (PIL, the official code's exact path) or gpu (nvJPEG + antialiased resize "
                "on CUDA; scores deviate slightly, docs/performance.md)"})

    @classmethod
    def from_mapping(cls, values: Any) -> ModelOptions:
        """The options found (as attributes or keys) in `values`; absent or None ones keep their defaults."""
        get = values.get if isinstance(values, dict) else (lambda name, default=None: getattr(values, name, default))
        found = {}
        for option in fields(cls):
            value = get(option.name, None)
            if value is not None:
                found[option.name] = value
        return cls(**found)


def load_model(options: ModelOptions, metric: str | None = None) -> Backbone:
    """Load the backbone the options name (CLIP-S falls back to ViT-B-32/openai).

    With `metric`, a contradiction between the metric's family and the checkpoint's established family raises
    `FamilyMismatchError` unless `allow_family_mismatch`.
    """
    from pacs.metric.models.factory import load_backbone

    backbone, checkpoint = options.backbone, options.checkpoint
    if backbone is None and checkpoint is None:
        family = metric_spec(metric).family if metric else "clip"
        if family != "clip":
            raise MissingResourceError(
                f"{metric} needs its checkpoint: pass checkpoint= (an official PAC-S / PAC-S++ file or a "
                f"pacs checkpoint)", parameter="checkpoint")
        backbone = DEFAULT_CLIP_BACKBONE
    loaded = load_backbone(backbone=backbone, checkpoint=checkpoint, arch=options.arch,
                           device=options.device or "auto", lora_mode=options.lora_mode or "official",
                           family=options.family)
    if metric is not None:
        check_metric_family(metric, loaded, bool(options.allow_family_mismatch))
    return loaded


def build_scorer(metric: str | None, options: ModelOptions | None = None, model: Backbone | Scorer | None = None,
                 progress: bool = True) -> Scorer:
    """The Scorer of `metric` from the model options: the one builder behind every scoring entry point.

    `model` is an already-loaded `Backbone` (wrapped in a new Scorer) or `Scorer` (returned as it is, its caches,
    `score` and `long_captions` kept; the options' `score` / `long_captions` are only checked) given as
    `backbone=` to a library entry point (`library_options`); a `Backbone` carrying LoRA adapters is scored on a
    merged copy of its weights (`pacs.metric.models.lora.merged_for_inference`; the model given is not changed).
    Either way the metric's family is checked against the model's (a `metric` of None checks nothing); w =
    `options.w`, else the metric's default for this model, else the model family's. Every option is checked before
    a model is loaded.
    """
    # deferred: torch and open_clip load only when a model is built
    from pacs.metric.models.backbones import Backbone
    from pacs.metric.models.lora import merged_for_inference
    from pacs.metric.scoring.conventions import calibration, check_long_captions, check_score_kind
    from pacs.metric.scoring.scorer import Scorer

    options = options if options is not None else ModelOptions()
    name = metric_spec(metric).name if metric is not None else None  # unknown names fail before any model loads
    batch_size = 64 if options.batch_size is None else options.batch_size
    if int(batch_size) < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    if model is None and options.backbone is not None and not isinstance(options.backbone, str):
        model = options.backbone
    if model is not None:
        if not isinstance(model, (Backbone, Scorer)):
            raise InputError(f"backbone= must be an open_clip NAME[/PRETRAINED], a Backbone or a Scorer, "
                             f"got {type(model).__name__}")
        if options.checkpoint is not None or options.arch is not None or options.family is not None:
            kind = type(model).__name__
            raise InputError(f"pass either a loaded {kind} or checkpoint= / arch= / family=, not both: they load a "
                             f"model, which cannot be combined with an already-loaded {kind} given as backbone=")
        # a LoRA model (e.g. one being trained) is scored on a merged copy: frozen passes need no adapters
        loaded = model.backbone if isinstance(model, Scorer) else merged_for_inference(model)
        if name is not None:
            check_metric_family(name, loaded, bool(options.allow_family_mismatch), option="allow_family_mismatch=True")
        if isinstance(model, Scorer):
            check_long_captions(options.long_captions)
            if check_score_kind(options.score) == "sigmoid":
                calibration(model.backbone)
            return model
    else:
        check_score_kind(options.score)
        check_long_captions(options.long_captions)
        check_input_pipeline(options)  # before the model is loaded
        loaded = load_model(options, name)
    w = options.w if options.w is not None else (default_w(name, loaded) if name else None)
    return Scorer(loaded, w=w, batch_size=batch_size, device=options.device or "auto", cache_dir=options.cache_dir,
                  dtype=options.dtype or "fp32", score=options.score or "cosine",
                  long_captions=options.long_captions or "truncate", workers=options.workers,
                  decode=options.decode or "cpu", progress=progress,
                  cast_weights=loaded is not model)  # loaded here or merged into a copy: nobody else runs it


def library_options(where: str, values: Mapping[str, Any],
                    defaults: Mapping[str, Any] = LIBRARY_DEFAULTS) -> tuple[ModelOptions, Any]:
    """(ModelOptions, loaded model or None) from a library entry point's keywords over its `defaults`.

    A `backbone=` that is not a name (a loaded `Backbone` or `Scorer`) comes back apart, for `build_scorer`'s
    `model`; a path-like `checkpoint` becomes a string. A keyword that is no `ModelOptions` field is a TypeError
    naming it and the known ones (`where` names the entry point).
    """
    known = [option.name for option in fields(ModelOptions)]
    unknown = [key for key in values if key not in known]
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r} "
                        f"(model options: {', '.join(known)})")
    chosen = {**defaults, **values}
    model = chosen.get("backbone")
    if model is not None and not isinstance(model, str):
        chosen["backbone"] = None
    else:
        model = None
    if chosen.get("checkpoint") is not None:
        chosen["checkpoint"] = os.fspath(chosen["checkpoint"])
    return ModelOptions(**chosen), model


def check_input_pipeline(options: ModelOptions) -> None:
    """InputError in one line for a bad `workers` value or `decode gpu` without CUDA (before any model loads)."""
    from pacs.metric.common.device import resolve_device
    from pacs.metric.common.parallel import resolve_workers
    from pacs.metric.models.tensor_decode import check_decode

    resolve_workers(options.workers, "--workers")
    check_decode(options.decode or "cpu", resolve_device(options.device or "auto"), "--decode")


def model_identity(backbone: Backbone) -> dict[str, Any]:
    """A model's identity for provenance: name, family, how the family was established, checkpoint sha256."""
    return {"backbone": backbone.name, "family": backbone.family, "family_source": backbone.family_source,
            "model_fingerprint": backbone.fingerprint, "checkpoint_sha256": backbone.source.get("sha256")}


def model_provenance(scorer: Scorer) -> dict[str, Any]:
    """Provenance fields describing the scorer's model: name, family, fingerprint, checkpoint sha256."""
    backbone = scorer.backbone
    return {"backbone": backbone.name, "family": backbone.family, "family_source": backbone.family_source,
            "model_fingerprint": backbone.fingerprint,
            "checkpoint_sha256": backbone.source.get("sha256"), "model_source": backbone.source,
            "open_clip_config": backbone.open_clip_config, "score": getattr(scorer, "score_kind", "cosine"),
            "long_captions": getattr(scorer, "long_captions", "truncate")}


def scoring_conventions(model: ModelOptions) -> dict[str, str]:
    """`{"score", "long_captions"}`: the canonical score convention and long-caption mode of the model options
    (what every contrastive column of a table used; recorded in its provenance `config`)."""
    from pacs.metric.scoring.conventions import check_long_captions, check_score_kind

    return {"score": check_score_kind(model.score), "long_captions": check_long_captions(model.long_captions)}
