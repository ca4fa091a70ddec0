"""The captioning stages of the demo: grid features, XE, SCST with each reward, evaluation and gallery."""
from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from captioner.demo.config import DemoConfig
from captioner.demo.correlation import per_caption_text_metrics
from captioner.demo.data import DemoData
from captioner.demo.judge import highlight_spans, judge_caption
from captioner.modeling.features import FeatureCache, extract_features
from captioner.modeling.model import CaptionerConfig
from captioner.modeling.train_scst import SCSTConfig, train_scst
from captioner.modeling.train_xe import XEConfig, generate_captions, train_xe
from captioner.modeling.training import ScheduleConfig, process_state
from captioner.modeling.vocab import build_vocab, load_vocab
from metric.common.io import finite_or_none, write_json_atomic, write_text_atomic

logger = logging.getLogger(__name__)

BIG = 10**9  # "never" for checkpoint intervals: the demo's stages are short and cached as a whole


def reward_slug(spec: str) -> str:
    """Folder/log name of a reward ('pac-s++' stays readable; only path-unsafe characters are replaced)."""
    return "".join(ch if ch.isalnum() or ch in "-+_." else "_" for ch in spec.lower())


def extract_all_features(data: DemoData, backbone: Any, folder: Path, accelerator: Any = None) -> dict:
    """Stage `features`: grid features (pre-ln_post ViT tokens) of every image, with the pre-trained CLIP.

    With an `accelerator` (accelerate process state) the extraction is split over its processes.
    """
    images = {image_id: path for split in data.splits for image_id, path in data.image_paths(split).items()}
    cache = extract_features(backbone, images, folder / "cache", batch_size=128, shard_size=4096,
                             accelerator=accelerator)
    return {"images": len(cache), "tokens": cache.num_tokens, "feature_dim": cache.feature_dim}


def open_features(folder: Path) -> FeatureCache:
    """The feature cache written by the features stage."""
    return FeatureCache(folder / "cache")


def run_xe(config: DemoConfig, data: DemoData, features: FeatureCache, folder: Path, logs: Path,
           clip_checkpoint: Path, micro_batch_size: int) -> dict:
    """Stage `xe`: vocabulary and cross-entropy training of the captioner on the reference captions.

    Runs on every process (`micro_batch_size` per process); only the main process writes files. The checkpoint
    records `clip_checkpoint` as its feature source, so `pacs caption` can re-create the features.
    """
    stage = config.xe
    train_items, val_items = data.splits["train"], data.splits["val"]
    vocab = build_vocab("word", [c for item in train_items for c in item.references], min_count=1,
                        max_length=stage.max_length)
    main = process_state().is_main_process
    if main:
        vocab.save(folder / "vocab.json")
    model_config = CaptionerConfig(d_model=stage.d_model, n_heads=stage.n_heads, encoder_layers=stage.encoder_layers,
                                   decoder_layers=stage.decoder_layers, ffn_dim=stage.ffn_dim, dropout=stage.dropout)
    xe = XEConfig(output_dir=str(folder), max_steps=stage.steps, batch_size=stage.batch_size,
                  micro_batch_size=micro_batch_size,
                  schedule=ScheduleConfig(warmup_steps=stage.warmup_steps, constant_until=int(stage.steps * 0.6),
                                          decay_until=stage.steps, peak_lr=stage.lr, final_lr=stage.lr / 10),
                  eval_every=stage.val_every, val_beam_size=1, val_batch_size=100, val_max_images=stage.val_images,
                  save_every=BIG, log_every=stage.log_every, seed=config.seed, tensorboard=False)
    result = train_xe(xe, model_config, vocab, features,
                      [(item.image_id, caption) for item in train_items for caption in item.references],
                      {item.image_id: item.references for item in val_items},
                      feature_source={"backbone": "", "checkpoint": str(Path(clip_checkpoint).resolve())})
    if main:
        shutil.copyfile(folder / "log.csv", logs / "xe.csv")
        shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    losses = result.losses
    return {"steps": result.steps, "loss_first": losses[0], "loss_last": float(np.mean(losses[-10:])),
            "best_val_cider": finite_or_none(result.best_score), "best_step": result.best_step}  # null: none


MONITOR_COLUMNS = ("Judge-acc", "C", "CLIP-S", "PAC-S++", "RefPAC-S++", "Length")


class ScstMonitor:
    """`train_scst`'s `on_step`: every `every` steps (and at step 0, the XE model), greedy captions of the first
    validation images scored by the judge, CIDEr-D and the contrastive metrics, appended to a curve CSV."""

    def __init__(self, data: DemoData, features: FeatureCache, scorers: Mapping[str, Any], vocab: Any, out: Path,
                 every: int, n_images: int, last_step: int) -> None:
        self.data, self.features, self.scorers, self.vocab, self.out = data, features, scorers, vocab, out
        self.every, self.last_step = every, last_step
        self.ids = [item.image_id for item in data.splits["val"][:n_images]]
        self.rows: list[dict[str, float]] = _read_curve(out)  # a resumed stage keeps the rows before its step
        self.first_call = True

    def __call__(self, step: int, model: Any) -> None:
        """Score the model at `step` when it is due (main process only; the others go on)."""
        if self.first_call:
            self.rows = [row for row in self.rows if row["step"] < step]
            self.first_call = False
        if not process_state().is_main_process or not self.ids or (step % self.every and step != self.last_step):
            return
        captions = generate_captions(model, self.vocab, self.features, self.ids, beam_size=1, batch_size=100)
        for scorer in self.scorers.values():  # each row from empty caches: the same batches after a resume
            scorer.clear_caches()
        self.rows.append({"step": step, **monitor_scores(captions, self.data, self.scorers)})
        columns = ["step", *MONITOR_COLUMNS]
        lines = [",".join(columns)] + [",".join(f"{row[c]:.6g}" for c in columns) for row in self.rows]
        write_text_atomic(self.out, "\n".join(lines) + "\n")


def _read_curve(path: Path) -> list[dict[str, float]]:
    """The rows of a monitor CSV written before (none when absent)."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines:
        return []
    columns = lines[0].split(",")
    try:
        return [dict(zip(columns, map(float, line.split(",")))) for line in lines[1:] if line]
    except ValueError:
        logger.warning("%s is not a monitor curve; starting it again", path)
        return []


def monitor_scores(captions: Mapping[str, str], data: DemoData, scorers: Mapping[str, Any]) -> dict[str, float]:
    """The monitored columns (means over the captions) of a set of validation captions."""
    row, _, _ = evaluate_model(captions, data, scorers)
    return {column: row[column] for column in MONITOR_COLUMNS}


def run_scst(config: DemoConfig, data: DemoData, features: FeatureCache, reward: Any, spec: str, xe_folder: Path,
             folder: Path, logs: Path, micro_batch_size: int, scorers: Mapping[str, Any] | None = None) -> dict:
    """Stage `scst-<reward>`: SCST from the XE captioner with one reward (beam samples, mean baseline).

    Runs on every process (`micro_batch_size` per process); only the main process writes files. With `scorers`
    the model is also scored on held-out validation images every `scst.monitor_every` steps
    (`logs/scst_val-<reward>.csv`; its step 0 is the XE model, also written to `logs/scst_val.reference.json`).
    """
    stage = config.scst
    scst = SCSTConfig(output_dir=str(folder), reward=spec, lr=stage.lr, batch_size=stage.batch_size,
                      micro_batch_size=micro_batch_size, max_steps=stage.steps, epochs=BIG, samples=stage.samples,
                      k=stage.beam_size, max_length=config.xe.max_length, baseline=stage.baseline,
                      save_every=BIG, log_every=stage.log_every, seed=config.seed, tensorboard=False)
    monitor = None
    if scorers is not None and stage.monitor_every:
        monitor = ScstMonitor(data, features, scorers, load_vocab(xe_folder / "vocab.json"), folder / "monitor.csv",
                              stage.monitor_every, stage.monitor_images, stage.steps)
    result = train_scst(scst, xe_folder / "best", features,
                        [(item.image_id, item.references) for item in data.splits["train"]], reward,
                        on_step=monitor)
    if process_state().is_main_process:
        shutil.copyfile(folder / "log.csv", logs / f"scst-{reward_slug(spec)}.csv")
        if monitor is not None and monitor.rows:
            shutil.copyfile(folder / "monitor.csv", logs / f"scst_val-{reward_slug(spec)}.csv")
            reference = {c: monitor.rows[0][c] for c in MONITOR_COLUMNS} if monitor.rows[0]["step"] == 0 else {}
            write_json_atomic(logs / "scst_val.reference.json", {"label": "xe", "values": reference})
        shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    return {"steps": result.steps, "loss_first": result.losses[0], "loss_last": result.losses[-1]}


def caption_test_set(model_folder: Path, data: DemoData, features: FeatureCache, beam_size: int) -> dict[str, str]:
    """Beam-search captions of every test image by the captioner in `model_folder`."""
    from captioner.modeling.checkpoints import load_captioner

    model, vocab, _ = load_captioner(model_folder)
    ids = [item.image_id for item in data.splits["test"]]
    return generate_captions(model, vocab, features, ids, beam_size=beam_size, batch_size=100, progress=True)


def evaluate_model(captions: Mapping[str, str], data: DemoData, scorers: Mapping[str, Any]
                   ) -> tuple[dict, dict, dict[str, np.ndarray]]:
    """The table row of one model (B-4, C, CLIP-S, PAC-S++, Ref-variants, Rep-n, %Incorrect, judge), per-caption
    details for the gallery, and the per-image values (caption order) of every column: each column is their mean."""
    from captioner.orchestration.evaluation import contrastive_per_image
    from eval.fluency import ends_incorrectly, repetitions

    ids = list(captions)
    references = data.references()
    scenes = data.scenes()
    texts = [captions[i] for i in ids]
    text = per_caption_text_metrics(texts, [references[i] for i in ids])
    judgements = [judge_caption(captions[i], scenes[i]) for i in ids]
    paths = {i: str(data.image_path(i)) for i in ids}
    values: dict[str, np.ndarray] = {"B-4": 100 * text["bleu4"], "C": 100 * text["cider"]}
    values.update(contrastive_per_image(captions, references, paths, scorers))
    for n in range(1, 5):
        values[f"Rep-{n}"] = np.asarray([repetitions(c, n) for c in texts], dtype=float)
    values["%Incorrect"] = 100.0 * np.asarray([ends_incorrectly(c) for c in texts], dtype=float)
    values["Judge-acc"] = 100.0 * np.asarray([j.is_correct for j in judgements], dtype=float)
    values["Judge"] = 100.0 * np.asarray([j.score for j in judgements], dtype=float)
    values["Halluc."] = 100.0 * np.asarray([j.hallucinated > 0 for j in judgements], dtype=float)
    values["Length"] = np.asarray([len(c.split()) for c in texts], dtype=float)
    row = {column: float(np.mean(v)) for column, v in values.items()}
    per_caption = {i: {"judge": j.score, "verdict": j.verdict, "cider": float(c),
                       "highlights": [list(span) for span in highlight_spans(captions[i], scenes[i])]}
                   for i, j, c in zip(ids, judgements, text["cider"])}
    return row, per_caption, values


def write_gallery(run_dir: Path, data: DemoData, captions: Mapping[str, Mapping[str, str]],
                  per_caption: Mapping[str, Mapping[str, dict]], scorers: Mapping[str, Any], size: int) -> None:
    """gallery.json (+ gallery/<id>.png) for the report: each test image with every model's caption and scores."""
    ids = [item.image_id for item in data.splits["test"][:size]]
    (run_dir / "gallery").mkdir(exist_ok=True)
    references = data.references()
    entries = []
    for image_id in ids:
        target = run_dir / "gallery" / f"{image_id}.png"
        shutil.copyfile(data.image_path(image_id), target)
        entry: dict[str, Any] = {"image_id": image_id, "image": f"gallery/{image_id}.png",
                                 "references": references[image_id], "captions": {}}
        for model, model_captions in captions.items():
            caption = model_captions[image_id]
            scores = {"judge": per_caption[model][image_id]["judge"], "C": 100 * per_caption[model][image_id]["cider"]}
            for name, family in (("CLIP-S", "clip"), ("PAC-S++", "pac-s++")):
                result = scorers[family].score([str(data.image_path(image_id))], [caption], keys=[image_id])
                scores[name] = float(result.scores[0])
            entry["captions"][model] = {"caption": caption, "scores": scores,
                                        "verdict": per_caption[model][image_id]["verdict"],
                                        "highlights": per_caption[model][image_id]["highlights"]}
        entries.append(entry)
    write_json_atomic(run_dir / "gallery.json", entries)
