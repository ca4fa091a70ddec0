"""The captioning stages of the demo: grid features, XE, SCST with each reward, evaluation and gallery."""
from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pacs.captioner.demo.config import DemoConfig
from pacs.captioner.demo.data import DemoData
from pacs.captioner.demo.judge import Judgement, highlight_spans, judge_values
from pacs.captioner.demo.world import ptb_tokenize_world
from pacs.captioner.demo.xe_settings import BIG, finish_xe, xe_trainer_config
from pacs.captioner.modeling.features import FeatureCache, extract_features
from pacs.captioner.modeling.hacking_monitor import read_monitor_rows
from pacs.captioner.modeling.model import CaptionerConfig
from pacs.captioner.modeling.train_scst import SCSTConfig, gaming_thresholds, train_scst
from pacs.captioner.modeling.train_xe import generate_captions, train_xe
from pacs.captioner.modeling.training_setup import process_state
from pacs.captioner.modeling.vocab import build_vocab, load_vocab
from pacs.captioner.orchestration import guard_choice
from pacs.captioner.orchestration.judge_correlation import per_caption_text_metrics
from pacs.captioner.orchestration.judge_monitor import JUDGE_MONITOR_FILE, JudgeMonitor, policy_captioner
from pacs.captioner.orchestration.reward_record import announce_reward
from pacs.eval.columns import JUDGE_COLUMNS, table_columns
from pacs.metric.common.io import finite_or_none, write_json_atomic
from pacs.rewards.slug import reward_slug

if TYPE_CHECKING:
    from pacs.eval.system_scoring import RowScores

logger = logging.getLogger(__name__)


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
           clip_checkpoint: Path, micro_batch_size: int, seed: int | None = None) -> dict:
    """Stage `xe`: vocabulary and cross-entropy training of the captioner on the reference captions.

    Runs on every process (`micro_batch_size` per process); only the main process writes files. The checkpoint
    records `clip_checkpoint` as its feature source, so `pacs caption` can re-create the features. `seed` (default
    `config.seed`): the training seed.
    """
    train_items, val_items = data.splits["train"], data.splits["val"]
    vocab = build_vocab("word", [c for item in train_items for c in item.references], min_count=1,
                        max_length=config.model.max_length)
    if process_state().is_main_process:
        vocab.save(folder / "vocab.json")
    sizes = config.model
    model_config = CaptionerConfig(d_model=sizes.d_model, n_heads=sizes.n_heads, encoder_layers=sizes.encoder_layers,
                                   decoder_layers=sizes.decoder_layers, ffn_dim=sizes.ffn_dim, dropout=sizes.dropout)
    result = train_xe(xe_trainer_config(config, folder, micro_batch_size, seed), model_config, vocab, features,
                      [(item.image_id, caption) for item in train_items for caption in item.references],
                      {item.image_id: item.references for item in val_items},
                      feature_source={"backbone": "", "checkpoint": str(Path(clip_checkpoint).resolve())})
    return finish_xe(result, folder, logs)


def judge_monitor(data: DemoData, features: FeatureCache | None, scorers: Mapping[str, Any], vocab: Any, out: Path,
                  every: int, n_images: int, last_step: int,
                  captioner: Callable[[Any, list[str]], dict[str, str]] | None = None) -> JudgeMonitor:
    """The judge's curve of a demo SCST stage (`pacs.captioner.orchestration.judge_monitor`) on the first `n_images`
    validation images; `captioner` (model, image ids) -> greedy captions, default pacs' captioner over `features`."""
    ids = [item.image_id for item in data.splits["val"][:n_images]]
    scenes = data.scenes()

    def judge(image_ids: Sequence[str], captions: Sequence[str]) -> dict[str, np.ndarray]:
        return judge_values(list(captions), [scenes[i] for i in image_ids])[0]

    def greedy(model: Any, image_ids: list[str]) -> dict[str, str]:
        return generate_captions(model, vocab, features, image_ids, beam_size=1, batch_size=100)

    return JudgeMonitor(ids, data.references(), {i: str(data.image_path(i)) for i in ids}, scorers, judge,
                        captioner or greedy, out, every, last_step, process_state().is_main_process)


def run_scst(config: DemoConfig, data: DemoData, features: FeatureCache | None, reward: Any, spec: str, xe_folder: Path,
             folder: Path, logs: Path, micro_batch_size: int, scorers: Mapping[str, Any] | None = None,
             kl_coef: float | None = None, seed: int | None = None, mix_normalisation: str = "weighted_sum",
             guard: Mapping[str, Any] | None = None, label: str | None = None) -> dict:
    """Stage `scst-<reward>`: SCST from the XE captioner with one reward (beam samples, mean baseline).

    Runs on every process (`micro_batch_size` per process); only the main process writes files. With `scorers`
    the model is also scored on held-out validation images every `scst.judge_monitor_every` steps
    (`logs/scst_val-<reward>.csv`; its step 0 is the XE model, also written to `logs/scst_val.reference.json`).
    `seed` (default `config.seed`): the training seed. `mix_normalisation` (`scst.normalised_rewards`):
    `normalize_then_sum` normalises each reward component within the image's k samples first (`pacs.rewards.mix`).
    A transformers captioner (`captioner.kind`) trains as a `pacs.captioner.demo.hf_captioner` policy (no `features`).
    `guard` (`guard_choice` settings, e.g. `{"cider_anchor": 0.5}`; `kl_coef` alone: `{"kl_coef": kl_coef}`) makes it
    a guarded run, named `label` (default `guarded_label(spec, kl_coef)`); `spec` then already carries the guard's
    reward terms (`GuardedScstConfig.reward_spec`).
    """
    if guard is None and kl_coef is not None:
        guard = {"kl_coef": kl_coef}
    stage, guarded = config.scst, guard is not None
    guards: dict[str, Any] = {"monitor_every": stage.monitor_every,  # the hacking monitor, every run
                              "monitor_images": stage.monitor_images}
    if guard is not None:  # docs/demo.md "Guards": the recipe's SCST guard keys, the checkpoint chosen on validation
        guards.update(guard_choice.scst_keys(guard),
                      monitor_every=config.guarded.monitor_every or stage.monitor_every,
                      monitor_images=config.guarded.monitor_images or stage.monitor_images)
        kl_coef = guards.get("kl_coef")
    scst = SCSTConfig(output_dir=str(folder), reward=spec, lr=stage.lr, batch_size=stage.batch_size,
                      micro_batch_size=micro_batch_size, max_steps=stage.max_steps, epochs=BIG, samples=stage.samples,
                      k=stage.k, max_length=config.model.max_length, baseline=stage.baseline,
                      save_every=BIG, log_every=stage.log_every, seed=config.seed if seed is None else seed,
                      trackers=[], mix_normalisation=mix_normalisation, **guards)
    label = label or (guarded_label(spec, kl_coef) if guarded else reward_slug(spec))
    if mix_normalisation != "weighted_sum":
        label = normalised_label(spec)
    shown = f"scst-{label}" if seed is None else f"scst-{label} (seed {seed})"
    exact = announce_reward(shown, spec, mix_normalisation, kl_coef, process_state().is_main_process)
    policy, captioner = None, None
    if config.captioner.transformers:
        from pacs.captioner.demo import hf_captioner

        policy = hf_captioner.load_policy(config, data, xe_folder / "best", process_state().device, scst.seed)
        captioner = policy_captioner(policy)
    monitor = None
    if scorers is not None and stage.judge_monitor_every:
        vocab = None if policy is not None else load_vocab(xe_folder / "vocab.json")
        monitor = judge_monitor(data, features, scorers, vocab, folder / JUDGE_MONITOR_FILE, stage.judge_monitor_every,
                                stage.judge_monitor_images, stage.max_steps, captioner)
    validation = {item.image_id: item.references for item in data.splits["val"]} if stage.monitor_every else None
    result = train_scst(scst, xe_folder / "best", features,
                        [(item.image_id, item.references) for item in data.splits["train"]], reward,
                        on_step=monitor, validation=validation, policy=policy)
    if process_state().is_main_process:
        shutil.copyfile(folder / "log.csv", logs / f"scst-{label}.csv")
        if monitor is not None and monitor.rows:
            shutil.copyfile(folder / JUDGE_MONITOR_FILE, logs / f"scst_val-{label}.csv")
            write_json_atomic(logs / "scst_val.reference.json", {"label": "xe", "values": monitor.reference()})
        publish_hacking_curves(folder / "monitor.csv", logs, label)
        shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    summary = {"steps": result.steps, "loss_first": result.losses[0], "loss_last": result.losses[-1],
               # did the reward vary within the k samples? (pacs.captioner.modeling.reward_spread; read by the findings)
               "zero_spread_fraction": result.zero_spread_fraction,
               "degenerate_reward": result.degenerate_warning is not None,
               "degenerate_warning": result.degenerate_warning, "reward": exact}
    if guarded:
        summary.update(kl_coef=kl_coef, best_step=result.best_step, best_val_cider=finite_or_none(result.best_score),
                       model=str(result.selected_dir.relative_to(folder)))
        if set(guard) != {"kl_coef"}:  # what the choice among the guard's settings reads (validation only)
            step = result.best_step if result.best_dir is not None else \
                result.kept_step if result.kept_dir is not None else result.steps
            summary.update(guard=dict(guard), stopped_step=result.stopped_step,
                           **guard_choice.evidence(read_monitor_rows(folder / "monitor.csv"), step,
                                                   gaming_thresholds(scst)))
    return summary


def publish_hacking_curves(monitor_csv: Path, logs: Path, label: str) -> None:
    """Copy a run's hacking-monitor CSV to `logs/hacking-<label>.csv` (one report panel per column, one line per
    run) and its step-0 row (the XE model) to `logs/hacking.reference.json` (the reference line)."""
    if not monitor_csv.is_file():
        return
    shutil.copyfile(monitor_csv, logs / f"hacking-{label}.csv")
    lines = monitor_csv.read_text(encoding="utf-8").splitlines()
    if len(lines) < 2:
        return
    header, first = lines[0].split(","), lines[1].split(",")
    row = dict(zip(header, first))
    if row.get("step") not in ("0", "0.0"):
        return
    values = {}
    for column, value in row.items():
        if column == "step":
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number):
            values[column] = number
    write_json_atomic(logs / "hacking.reference.json", {"label": "xe", "values": values})


def guarded_label(spec: str, kl_coef: float) -> str:
    """Stage / log name of a guarded run: `<reward slug>-kl<coef>` (e.g. `clip-s-kl0.1`)."""
    return f"{reward_slug(spec)}-kl{kl_coef:g}"


def normalised_label(spec: str) -> str:
    """Stage / log name of an SCST run on the normalised mix of `spec` (`scst.normalised_rewards`):
    `<reward slug>-norm` (e.g. `cider_1_pac-s++_0.5-norm`)."""
    return f"{reward_slug(spec)}-norm"


def normalised_model_name(spec: str) -> str:
    """The table row of an SCST run on the normalised mix of `spec`: `scst <spec> norm`."""
    return f"scst {spec} norm"


def choose_guarded(summaries: Mapping[float, Mapping[str, Any]]) -> float:
    """The KL coefficient whose selected checkpoint has the best validation CIDEr-D (ties: the smaller one)."""
    scored = {coef: s.get("best_val_cider") for coef, s in summaries.items()}
    finite = {coef: value for coef, value in scored.items() if value is not None}
    if not finite:
        raise ValueError(f"no guarded run has a finite validation CIDEr-D: {scored}")
    return min(finite, key=lambda coef: (-finite[coef], coef))


def caption_test_set(model_folder: Path, data: DemoData, features: FeatureCache, beam_size: int) -> dict[str, str]:
    """Beam-search captions of every test image by the captioner in `model_folder`."""
    from pacs.captioner.modeling.checkpoints import load_captioner

    model, vocab, _ = load_captioner(model_folder, process_state().device)  # the run's device (demo.device)
    ids = [item.image_id for item in data.splits["test"]]
    return generate_captions(model, vocab, features, ids, beam_size=beam_size, batch_size=100, progress=True)


#: the table's columns computed by `pacs.eval.system_table` (each: the eval metric and its factor to the column's scale)
SYSTEM_COLUMNS: dict[str, tuple[str, float]] = {
    "B-4": ("bleu4", 100.0), "C": ("cider", 100.0), "CLIP-S": ("clip-s", 1.0), "PAC-S++": ("pac-s++", 1.0),
    "RefCLIP-S": ("ref-clip-s", 1.0), "RefPAC-S++": ("ref-pac-s++", 1.0), "Rep-1": ("rep1", 1.0),
    "Rep-2": ("rep2", 1.0), "Rep-3": ("rep3", 1.0), "Rep-4": ("rep4", 1.0), "%Incorrect": ("incorrect", 1.0),
    "Length": ("length", 1.0)}
DEMO_COLUMNS = table_columns((*SYSTEM_COLUMNS, *JUDGE_COLUMNS))
"""The demo table's columns: the ones of `pacs.eval.columns.TABLE_COLUMNS` it computes."""
#: every column of the table in its order, with where its values come from (judge columns: the demo's own, factor 1)
COLUMN_SOURCES: dict[str, tuple[str, float]] = {column: SYSTEM_COLUMNS.get(column, (column, 1.0))
                                                 for column in DEMO_COLUMNS}


def evaluate_model(captions: Mapping[str, str], data: DemoData, scorers: Mapping[str, Any]
                   ) -> tuple[dict, dict, dict[str, np.ndarray]]:
    """The SCST monitor's quick row of one set of captions (B-4 and C on lower-cased, space-tokenised text, no Java
    call; CLIP-S, PAC-S++, Ref-variants, Rep-n, %Incorrect, judge, length), per-caption details and the per-image
    values of every column (each column is their mean). The evaluate stage's table is `evaluate_systems`'."""
    from pacs.captioner.orchestration.evaluation import contrastive_per_image
    from pacs.eval.fluency import ends_incorrectly, repetitions

    ids = list(captions)
    references = data.references()
    scenes = data.scenes()
    texts = [captions[i] for i in ids]
    text = per_caption_text_metrics(texts, [references[i] for i in ids])
    judged, judgements = judge_values(texts, [scenes[i] for i in ids])
    paths = {i: str(data.image_path(i)) for i in ids}
    values: dict[str, np.ndarray] = {"B-4": 100 * text["bleu4"], "C": 100 * text["cider"]}
    values.update(contrastive_per_image(captions, references, paths, scorers))
    for n in range(1, 5):
        values[f"Rep-{n}"] = np.asarray([repetitions(c, n) for c in texts], dtype=float)
    values["%Incorrect"] = 100.0 * np.asarray([ends_incorrectly(c) for c in texts], dtype=float)
    values.update(judged)
    values["Length"] = np.asarray([len(c.split()) for c in texts], dtype=float)
    row = {column: float(np.mean(v)) for column, v in values.items()}
    per_caption = {i: {"judge": j.score, "verdict": j.verdict, "cider": float(c),
                       "highlights": [list(span) for span in highlight_spans(captions[i], scenes[i])]}
                   for i, j, c in zip(ids, judgements, text["cider"])}
    return row, per_caption, values


@dataclass
class SystemEvaluation:
    """The evaluate stage's scoring of every model and the human row, through `pacs.eval.system_table`."""

    table: dict[str, Any]  # the JSON `pacs evaluate --candidates ... --human-baseline --out` writes
    scores: dict[str, RowScores]  # per row: eval metrics' per-caption values, plus the judge columns
    captions: dict[str, dict[str, str]]  # per row: {image_id: caption} (the human row: its held-out references)
    judgements: dict[str, dict[str, Judgement]]
    candidate_files: dict[str, Path]
    references_file: Path

    @property
    def image_ids(self) -> list[str]:
        """The test images, in table order."""
        return list(self.table["images"]["ids"])

    def row(self, name: str) -> dict[str, float | None]:
        """The demo table's row `name`: every column on its scale (B-4 of the human row: None)."""
        values = self.scores[name].values
        return {column: None if values.get(metric) is None else factor * float(values[metric])
                for column, (metric, factor) in COLUMN_SOURCES.items()}

    def per_image(self, name: str) -> dict[str, np.ndarray]:
        """Per-image values (table image order) of every column that is a mean of them (all but B-4)."""
        per_row = self.scores[name].per_row
        return {column: factor * per_row[metric] for column, (metric, factor) in COLUMN_SOURCES.items()
                if metric in per_row}


def display_table(evaluation: SystemEvaluation, rows: Sequence[Mapping[str, Any]],
                  intervals: Mapping[str, Mapping[str, Any]], columns: Sequence[str]) -> dict[str, Any]:
    """The demo's table in `pacs.eval.system_table`'s JSON layout (what `pacs.eval.report.plot_system_table` and
    `system_table_section` draw): every row on the demo's columns (judge columns included) with its own interval
    and its paired difference against the human row (`intervals`: `findings.paired_intervals` against it)."""
    from pacs.eval.system_inputs import HUMAN_ROW

    table = evaluation.table
    out_rows = []
    for row in rows:
        name = row["model"]
        own = intervals.get(name, {})
        out_rows.append({"system": name, "kind": HUMAN_ROW if name == HUMAN_ROW else "system",
                         "values": {c: row.get(c) for c in columns}, "ci": dict(own.get("value_ci", {})),
                         **({"delta": dict(own["delta"]), "delta_ci": dict(own["ci"])} if "delta" in own else {})})
    return {"header": f"{table['header']}; Judge-acc, Judge and Halluc.: the demo's judge on every row's captions",
            "systems": [r["system"] for r in out_rows], "metrics": list(columns), "baseline": HUMAN_ROW,
            "rows": out_rows, "human_baseline": table["human_baseline"], "images": {"n": table["images"]["n"]}}


def write_system_inputs(captions: Mapping[str, Mapping[str, str]], data: DemoData, folder: Path
                        ) -> tuple[dict[str, Path], Path]:
    """`folder/systems/<slug>.json` ({image_id: caption}) per model and `folder/references.json` (the test split's
    references): the inputs `pacs evaluate --candidates NAME=FILE ... --references FILE` reads."""
    references = data.references()
    files = {}
    for name, model_captions in captions.items():
        files[name] = folder / "systems" / f"{reward_slug(name.replace(' ', '-'))}.json"
        write_json_atomic(files[name], dict(model_captions))
    reference_file = folder / "references.json"
    write_json_atomic(reference_file, {item.image_id: list(references[item.image_id]) for item in data.splits["test"]})
    return files, reference_file


def evaluate_systems(captions: Mapping[str, Mapping[str, str]], data: DemoData, scorers: Mapping[str, Any],
                     folder: Path, seed: int, n_resamples: int) -> SystemEvaluation:
    """Every model's test captions and the human baseline in one `pacs.eval.system_table` call (the code path of
    `pacs evaluate --candidates NAME=FILE ... --human-baseline`: each image encoded once for all rows), then the
    judge's columns per row. The table (+ CSV, heat map, HTML) is written to `folder/system_table.*`."""
    from pacs.eval.human_baseline import recompute_from_held_out
    from pacs.eval.system_inputs import HUMAN_ROW
    from pacs.eval.system_scoring import ScoringOptions
    from pacs.eval.system_table import TableRequest, build_system_table, write_table
    from pacs.metric.scoring.registry import METRICS

    files, reference_file = write_system_inputs(captions, data, folder)
    metrics = [metric for metric, _ in SYSTEM_COLUMNS.values()]
    image_map = {item.image_id: str(data.image_path(item.image_id)) for item in data.splits["test"]}

    def factory(metric: str) -> Any:
        """The demo's scorer of the metric's family (one per family: each image encoded once)."""
        return scorers[METRICS[metric].family]

    request = TableRequest(candidates=[f"{name}={path}" for name, path in files.items()],
                           references=str(reference_file), metrics=metrics,
                           scoring=ScoringOptions(metrics=metrics, image_map=image_map), seed=seed,
                           bootstrap=n_resamples, human_baseline=True, scorer_factory=factory,
                           tokenizer=ptb_tokenize_world)  # the PTB tokenization of the world's captions, no Java
    row_scores: list[RowScores] = []
    table = build_system_table(request, row_scores)
    write_table(table, str(folder / "system_table.json"), png_path=str(folder / "system_table.png"),
                html_path=str(folder / "system_table.html"))
    ids = list(table["images"]["ids"])
    human, _ = recompute_from_held_out(table["human_baseline"]["held_out"], data.references())
    all_captions = {name: {i: model_captions[i] for i in ids} for name, model_captions in captions.items()}
    all_captions[HUMAN_ROW] = {i: human[i] for i in ids}
    scenes = data.scenes()
    scores, judgements = {}, {}
    for row, result in zip(table["rows"], row_scores):
        name = row["system"]
        values, judged = judge_values([all_captions[name][i] for i in ids], [scenes[i] for i in ids])
        for column, per_image in values.items():
            result.per_row[column] = per_image
            result.values[column] = float(per_image.mean())
        scores[name], judgements[name] = result, dict(zip(ids, judged))
    return SystemEvaluation(table, scores, all_captions, judgements, files, reference_file)


def write_gallery(run_dir: Path, data: DemoData, evaluation: SystemEvaluation, size: int) -> None:
    """gallery.json (+ gallery/<id>.png) for the report: each test image with every row's caption (the human row's
    held-out reference included), its verdict, the judge's highlights and its scores from the table."""
    ids = [item.image_id for item in data.splits["test"][:size]]
    (run_dir / "gallery").mkdir(exist_ok=True)
    references = data.references()
    scenes = data.scenes()
    position = {image_id: index for index, image_id in enumerate(evaluation.image_ids)}
    entries = []
    for image_id in ids:
        target = run_dir / "gallery" / f"{image_id}.png"
        shutil.copyfile(data.image_path(image_id), target)
        entry: dict[str, Any] = {"image_id": image_id, "image": f"gallery/{image_id}.png",
                                 "references": references[image_id], "captions": {}}
        for model, model_captions in evaluation.captions.items():
            caption = model_captions[image_id]
            judgement = evaluation.judgements[model][image_id]
            per_image = evaluation.per_image(model)
            scores = {"judge": judgement.score,
                      **{column: float(per_image[column][position[image_id]]) for column in GALLERY_SCORES}}
            entry["captions"][model] = {"caption": caption, "scores": scores, "verdict": judgement.verdict,
                                        "highlights": [list(span) for span in highlight_spans(caption,
                                                                                              scenes[image_id])]}
        entries.append(entry)
    write_json_atomic(run_dir / "gallery.json", entries)


#: the per-caption scores the gallery shows next to the judge's
GALLERY_SCORES = ("C", "CLIP-S", "PAC-S++")
