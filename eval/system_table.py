"""System-level tables: many captioners (and a human baseline) scored on the same images with every metric.

`build_system_table(request)` loads every system (`pacs.eval.system_inputs`), scores them with shared state
(`pacs.eval.system_scoring`: each image encoded once, one CIDEr-D scorer per reference configuration), adds the
human row (`pacs.eval.human_baseline`), per-row bootstrap 95% intervals over images, a paired bootstrap against
the baseline row and, per column, whether the best row is separated from the runner-up (`pacs.eval.intervals`: every
row is resampled with the same image indices), and returns the JSON table; `table_text`, `table_csv` render it,
`write_table` writes JSON / CSV / PNG / HTML / LaTeX / Markdown, every one with the same row labels (`pacs.eval.system_inputs.row_label`).
"""
from __future__ import annotations

import csv
import io
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pacs.eval import columns as col
from pacs.eval.human_baseline import PROTOCOL_EQUAL_REFS, PROTOCOL_PAPERS, hold_out_references
from pacs.eval.intervals import LEVEL, best_rows, bootstrap, confidence_interval, two_sided_p_value
from pacs.eval.system_inputs import HUMAN_LABEL, HUMAN_ROW, load_systems, parse_candidate_specs, row_label
from pacs.eval.system_scoring import RowScores, ScoringOptions, SharedScoring, corpus_bleu, score_rows
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import csv_cells, nonfinite_to_none
from pacs.metric.scoring.model_options import ModelOptions, scoring_conventions

log = logging.getLogger(__name__)

DEFAULT_EVALUATE_METRICS = ("bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge", "cider", "spice",
                            "rep1", "rep2", "rep3", "rep4", "incorrect", "grammar")
DEFAULT_BOOTSTRAP = 1000
#: how each metric's interval is obtained (the JSON's bootstrap.methods)
METHODS = {
    "bleu": "corpus BLEU recomputed on every resample (pycocoevalcap's formula over the resampled captions' "
            "n-gram statistics)",
    "cider": "mean of per-caption CIDEr-D over the resample, document frequencies of the full image set "
             "(--bootstrap-recompute-corpus recomputes them per resample: a full CIDEr-D run per resample)",
    "cider-recomputed": "corpus CIDEr-D recomputed on every resample (document frequencies of the resampled "
                        "images' references, repeats counted, as pycocoevalcap would on that data)",
    "meteor": "mean of per-caption METEOR over the resample (approximation: the jar's corpus aggregate is "
              "recomputed per resample only with --bootstrap-recompute-corpus)",
    "meteor-recomputed": "corpus METEOR recomputed on every resample (the jar's aggregate of the resampled "
                         "captions' sufficient statistics, pacs.eval.meteor_stats)",
    "mean": "mean of per-caption values over the resample (the row's value is that mean)",
}


def default_metrics(images: str | None, checkpoint: str | None, backbone: str | None,
                    metric_models: Any = None) -> list[str]:
    """The metrics `pacs evaluate` runs without --metrics (contrastive ones with --images and a model, or with
    `--metric-model METRIC=SPEC` each such metric and its Ref- variant, reference-based ones first)."""
    from pacs.eval.metric_models import parse_metric_models

    metrics = list(DEFAULT_EVALUATE_METRICS)
    given = parse_metric_models(metric_models)
    if given:  # without --images, the contrastive columns' refusal names what is missing
        free = [m.removeprefix("ref-") for m in given]
        metrics += [f"ref-{m}" for m in dict.fromkeys(free)] + list(dict.fromkeys(free))
    elif images and (checkpoint or backbone):
        metrics += ["pac-s++", "ref-pac-s++"] if checkpoint else ["clip-s", "ref-clip-s"]
    return metrics


@dataclass
class TableRequest:
    """A system-level table to build: systems, references, metrics and every option, typed."""

    #: `NAME=FILE` strings, or `{name: captions in memory or FILE}` (`pacs.eval.system_inputs.parse_candidate_specs`)
    candidates: Any
    #: the references file, or `{image_id: [reference, ...]}` in memory
    references: Any
    metrics: list[str]
    scoring: ScoringOptions = field(default_factory=lambda: ScoringOptions([]))
    model: ModelOptions = field(default_factory=ModelOptions)
    seed: int = 0
    bootstrap: int = DEFAULT_BOOTSTRAP
    human_baseline: bool = False
    equal_refs: bool = False
    skip_single_reference_images: bool = False
    baseline: str | None = None
    recompute_corpus: bool = False
    #: a model per contrastive column (`--metric-model METRIC=SPEC`, `pacs.eval.metric_models`): `METRIC=SPEC` strings
    #: or `{metric: SPEC}`; the columns without one use `model`
    metric_models: Any = None
    #: contrastive scorers by metric name, instead of the ones `model` builds (a caller holding its own models:
    #: the demo scores CLIP-S with its CLIP and PAC-S++ with its PAC-S++ model)
    scorer_factory: Callable[[str], Any] | None = None
    #: the text metrics' tokenizer instead of pycocoevalcap's PTB tokenizer (Java): only one verified equal to it on
    #: the caller's texts (the demo world's `pacs.captioner.demo.world.ptb_tokenize_world`, tested against Java's)
    tokenizer: Callable[[list[str]], list[str]] | None = None


def bootstrap_method(metric: str, recompute_corpus: bool = False) -> str:
    """The key of `METHODS` for a metric."""
    if metric.startswith("bleu"):
        return "bleu"
    if metric in ("cider", "meteor") and recompute_corpus:
        return f"{metric}-recomputed"
    return metric if metric in ("cider", "meteor") else "mean"


def _mean(values: np.ndarray) -> float:
    """Mean, ignoring NaN (captions a metric did not score) only when there are any."""
    if np.isnan(values).any():
        return float(np.nanmean(values)) if (~np.isnan(values)).any() else float("nan")
    return float(values.mean())


def bootstrap_samples(scores: RowScores, metrics: list[str], n_resamples: int, seed: int,
                      recompute_corpus: bool = False) -> dict[str, np.ndarray]:
    """The row's statistic for every metric on `n_resamples` image resamples (`pacs.eval.intervals.bootstrap`);
    with `recompute_corpus`, corpus CIDEr-D (document frequencies included) and corpus METEOR (the jar's
    aggregate) are recomputed on each resample."""
    from pacs.eval.cider import CiderD
    from pacs.eval.meteor_stats import MeteorStats

    usable = [m for m in metrics if scores.values.get(m) is not None
              and (m in scores.per_row or (m.startswith("bleu") and scores.bleu is not None))]
    if not usable or n_resamples < 1 or scores.n_rows == 0:
        return {}

    recompute = [m for m in ("cider", "meteor") if recompute_corpus and m in usable and scores.tokens is not None]
    captions, references = scores.tokens if recompute else ([], [])

    def statistic(indices: np.ndarray) -> dict[str, float]:
        bleu = corpus_bleu(scores.bleu, indices) if scores.bleu is not None else None
        values = {m: float(bleu[int(m[-1]) - 1]) if m.startswith("bleu") else _mean(scores.per_row[m][indices])
                  for m in usable}
        if "cider" in recompute:
            values["cider"] = float(CiderD()([captions[i] for i in indices], [references[i] for i in indices]).mean())
        if "meteor" in recompute:
            values["meteor"] = jar.corpus([meteor_stats[i] for i in indices])
        return values

    if "meteor" not in recompute:
        return bootstrap(statistic, scores.n_rows, n_resamples, seed, description="bootstrap")
    with MeteorStats() as jar:
        meteor_stats = jar.stats(captions, references)
        return bootstrap(statistic, scores.n_rows, n_resamples, seed, description="bootstrap")


def _row(name: str, kind: str, file: str | None, scores: RowScores, ids: list[str]) -> dict[str, Any]:
    """The JSON row of one system before intervals."""
    return {"system": name, "kind": kind, "file": file, "values": dict(scores.values), "n": scores.n_rows,
            "n_empty": scores.n_empty, "grammar_backend": scores.grammar_backend,
            "unavailable": dict(scores.unavailable), "truncated_captions": dict(scores.truncated),
            "failed": {m: {"n": len(rows), "items": [ids[r] for r in rows]} for m, rows in scores.failed.items()}}


def _header(n_images: int, systems: list[Any], skipped_refs: list[str], protocol: str | None,
            baseline: str | None, n_resamples: int) -> str:
    """The table's header: images, skips, the human protocol and the baseline."""
    parts = [f"{n_images} images"]
    missing = {s.name: len(s.missing) for s in systems if s.missing}
    if missing:
        counts = ", ".join(f"{name}: {count}" for name, count in missing.items())
        parts.append(f"every system scored on the {n_images} images common to all (missing per system: {counts})")
    if skipped_refs:
        parts.append(f"{len(skipped_refs)} image(s) with fewer than 2 references skipped")
    if protocol == PROTOCOL_PAPERS:
        parts.append("human row: one reference per image against the others; systems against all references "
                     "(the papers' protocol); B-4 left out for humans")
    elif protocol == PROTOCOL_EQUAL_REFS:
        parts.append("human row: one reference per image against the others; every row against the same "
                     "remaining references (equal terms); B-4 left out for humans")
    if n_resamples:
        parts.append(f"95% bootstrap intervals over images ({n_resamples} resamples)"
                     + (f", differences against {baseline!r} paired" if baseline else ""))
    return "; ".join(parts)


def truncation_note(rows: list[dict[str, Any]], long_captions: str = "truncate") -> str | None:
    """The header's note on captions cut to a contrastive model's text context (None when none was cut).

    >>> truncation_note([{"system": "A", "truncated_captions": {"clip-s": 3, "ref-clip-s": 3}},
    ...                  {"system": "B", "truncated_captions": {"clip-s": 0}}])
    'captions cut to the text context (long_captions=truncate): A: clip-s 3, ref-clip-s 3'
    """
    cut = [(row["system"], counts) for row in rows
           if any((counts := row.get("truncated_captions") or {}).values())]
    if not cut:
        return None
    what = ("captions with a sentence longer than the text context (long_captions=chunk)" if long_captions == "chunk"
            else f"captions cut to the text context (long_captions={long_captions})")
    listed = "; ".join(f"{name}: " + ", ".join(f"{metric} {n}" for metric, n in counts.items() if n)
                       for name, counts in cut)
    return f"{what}: {listed}"


def _check_baseline(baseline: str | None, names: list[str]) -> str | None:
    """The baseline row's name (the human row by default when present); InputError for an unknown one."""
    if baseline is None:
        return HUMAN_ROW if HUMAN_ROW in names else None
    if baseline not in names:
        raise InputError(f"--baseline {baseline!r} is not a row of the table (rows: {', '.join(names)})",
                         parameter="baseline")
    return baseline


def add_table_intervals(rows: list[dict[str, Any]], scores: list[RowScores], metrics: list[str],
                        baseline: str | None, n_resamples: int, seed: int, recompute_corpus: bool = False
                        ) -> dict[str, dict[str, Any]]:
    """Per-row 95% intervals, the paired difference against the baseline row with its interval; returns, per ranked
    column, the best row and whether it is separated from the runner-up (`pacs.eval.intervals.best_rows`: the human
    row is not ranked)."""
    samples = [bootstrap_samples(s, metrics, n_resamples, seed, recompute_corpus) for s in scores]
    for row, own in zip(rows, samples):
        if row["kind"] == HUMAN_ROW:
            own.pop("bleu4", None)
        row["ci"] = {m: confidence_interval(values, LEVEL) for m, values in own.items()}
    best = {}
    for metric in metrics:
        ranked = [(row, own) for row, own in zip(rows, samples) if row["kind"] != HUMAN_ROW and metric in own]
        found = None if col.direction(metric) == col.NEITHER else best_rows(
            {row["system"]: row["values"].get(metric) for row, _ in ranked},
            {row["system"]: own[metric] for row, own in ranked}, col.direction(metric), LEVEL)
        if found is not None:
            best[metric] = found
    if baseline is None:
        return best
    index = [row["system"] for row in rows].index(baseline)
    base_values, base_samples = rows[index]["values"], samples[index]
    for row, own in zip(rows, samples):
        if row["system"] == baseline:
            continue
        both = [m for m in metrics if m in own and m in base_samples]
        row["delta"] = {m: row["values"][m] - base_values[m] for m in metrics
                        if row["values"].get(m) is not None and base_values.get(m) is not None}
        row["delta_ci"] = {m: confidence_interval(own[m] - base_samples[m], LEVEL) for m in both}
        row["p_value"] = {m: two_sided_p_value(own[m] - base_samples[m]) for m in both}
    return best


def build_system_table(request: TableRequest, row_scores: list[RowScores] | None = None) -> dict[str, Any]:
    """Score every system (and the human baseline) on the same images; the JSON table `pacs evaluate` writes.

    `row_scores`, when given, receives every row's `RowScores` (table order: per-caption values, BLEU statistics)
    for a caller that adds its own columns or paired comparisons with `add_table_intervals`.
    """
    from pacs.eval.metric_models import check_columns, column_factory, parse_metric_models
    from pacs.metric.common.provenance import provenance
    from pacs.metric.common.seeding import seed_everything
    from pacs.metric.scoring.score_inputs import load_references

    seed_everything(request.seed)
    conventions = scoring_conventions(request.model)  # a bad score / long_captions fails before any work
    if request.bootstrap < 0:
        raise InputError(f"--bootstrap must be >= 0, got {request.bootstrap}", parameter="bootstrap")
    metric_models = parse_metric_models(request.metric_models)
    check_columns(list(request.metrics), metric_models)
    if request.equal_refs and not request.human_baseline:
        raise InputError("--human-baseline-equal-refs needs --human-baseline", parameter="human_baseline")
    specs = parse_candidate_specs(request.candidates)
    clash = next((spec.name for spec in specs if spec.name in (HUMAN_ROW, HUMAN_LABEL)), None)
    if request.human_baseline and clash is not None:  # "Humans" is the human row's printed label
        raise InputError(f"system name {clash!r} is the human baseline's row: name that system otherwise",
                         parameter="candidates")
    in_memory = isinstance(request.references, Mapping)
    references = (load_references("references (in memory)", dict(request.references)) if in_memory
                  else load_references(request.references))
    systems, common = load_systems(specs, references, request.scoring.skip_missing_images)
    human, protocol, skipped_refs = None, None, []
    if request.human_baseline:
        human = hold_out_references(common, references, request.seed, request.skip_single_reference_images)
        skipped_refs = human.skipped
        if skipped_refs:
            keep = set(human.held_out)
            common = [key for key in common if key in keep]
            for system in systems:
                rows = [(i, c) for i, c in zip(system.ids, system.captions) if i in keep]
                system.ids, system.captions = [i for i, _ in rows], [c for _, c in rows]
            if not common:
                raise InputError("no image with 2 or more references is left for the human baseline")
        protocol = PROTOCOL_EQUAL_REFS if request.equal_refs else PROTOCOL_PAPERS
    full_refs = [list(references[key]) for key in common]
    system_refs, system_key = full_refs, "all references"
    if human is not None and request.equal_refs:
        system_refs, system_key = [human.remaining[key] for key in common], "remaining references"
    models: dict[str, Any] = {}
    shared = SharedScoring(ScoringOptions(**{**request.scoring.__dict__, "metrics": list(request.metrics)}),
                           request.scorer_factory or column_factory(request.model, metric_models, models),
                           request.tokenizer)
    if shared.needs_tokens:  # one PTB call for every caption and reference of the table
        shared.tokenize([c for s in systems for c in s.captions] + [r for refs in full_refs for r in refs])
    rows, scores = [], []
    for system in systems:
        result = score_rows(shared, common, system.captions, system_refs, system_key)
        rows.append(_row(system.name, "system", None if system.path is None else str(system.path), result, common))
        rows[-1]["n_missing_images"] = len(system.missing)
        scores.append(result)
    if human is not None:
        result = score_rows(shared, common, [human.captions[k] for k in common],
                            [human.remaining[k] for k in common], "remaining references")
        if "bleu4" in result.values:
            result.values["bleu4"] = None  # B-4 left out for humans, as in the papers
        rows.append(_row(HUMAN_ROW, HUMAN_ROW, None, result, common))
        scores.append(result)
    if row_scores is not None:
        row_scores.extend(scores)
    names = [row["system"] for row in rows]
    baseline = _check_baseline(request.baseline, names)
    best = add_table_intervals(rows, scores, list(request.metrics), baseline, request.bootstrap, request.seed,
                               request.recompute_corpus)
    backends = {row["grammar_backend"] for row in rows if row["grammar_backend"]}
    header = _header(len(common), systems, skipped_refs, protocol, baseline, request.bootstrap)
    note = truncation_note(rows, conventions["long_captions"])
    table = {
        "header": header if note is None else f"{header}; {note}",
        "systems": names, "metrics": list(request.metrics), "baseline": baseline, "rows": rows,
        "columns": column_records(shared, list(request.metrics), metric_models, request.model,
                                  request.scorer_factory is not None),
        "values_are": "raw: text metrics (BLEU, METEOR, ROUGE-L, CIDEr-D, SPICE) as fractions; printed tables, "
                      "LaTeX, Markdown, HTML and PNG multiply each value by its column's printed_scale",
        "images": {"n": len(common), "ids": common,
                   "missing": {s.name: {"n": len(s.missing), "ids": s.missing} for s in systems},
                   "skipped_single_reference": {"n": len(skipped_refs), "ids": skipped_refs}},
        "human_baseline": None if human is None else {"protocol": protocol, "seed": human.seed,
                                                      "held_out": human.held_out},
        "bootstrap": {"n": request.bootstrap, "seed": request.seed, "level": LEVEL,
                      "methods": {m: METHODS[bootstrap_method(m, request.recompute_corpus)]
                                  for m in request.metrics}},
        #: per ranked column with resamples: the best row, the runner-up, the paired interval of their difference
        #: (by the column's direction), whether it excludes 0, and the rows the paper tables print in bold
        "best": best,
        "grammar_backend": next(iter(backends)) if len(backends) == 1 else sorted(backends) or None,
        "provenance": provenance(seed=request.seed, w=request.model.w, config={
            "candidates": [f"{s.name}={s.source}" for s in specs], "references": "in memory" if in_memory else str(request.references),
            "metrics": list(request.metrics), "images": str(request.scoring.images or "") or None,
            "checkpoint": request.model.checkpoint, "backbone": request.model.backbone,
            "metric_models": {m: model.spec for m, model in metric_models.items()},
            "human_baseline": protocol, "bootstrap": request.bootstrap,
            "skip_missing_images": request.scoring.skip_missing_images,
            "grammar_backend": request.scoring.grammar_backend, **conventions}, models=models),
    }
    return nonfinite_to_none(table)


def column_records(shared: SharedScoring, metrics: list[str], metric_models: dict[str, Any], model: ModelOptions,
                   own_factory: bool = False) -> dict[str, dict[str, Any]]:
    """Per column: its paper label, group, direction, printed scale and, for a contrastive column, the model,
    family and `w` that scored it (`pacs.eval.metric_models.column_record`)."""
    from pacs.eval import columns
    from pacs.eval.metric_models import column_record
    from pacs.eval.registry import get_metric

    names = {columns.HIGHER: "higher", columns.LOWER: "lower", columns.NEITHER: None}
    records = {}
    for metric in metrics:
        record: dict[str, Any] = {"label": columns.label(metric), "group": columns.group(metric),
                                  "better": names[columns.direction(metric)],
                                  "printed_scale": columns.printed_scale(metric)}
        suite = shared.suite
        if get_metric(metric).kind == "contrastive" and suite is not None and metric not in suite.unavailable:
            record.update(column_record(metric, suite.scorer(metric), metric_models, model, own_factory))
        records[metric] = record
    return records


# ------------------------------------------------------------------------------------------------ rendering
def printed_scale(table: dict[str, Any], metric: str) -> float:
    """The factor a printed table applies to a column's raw values (`columns[m].printed_scale`; 1 for a table
    that records none, e.g. the demo's, whose columns are already on their printed scale)."""
    return float(((table.get("columns") or {}).get(metric) or {}).get("printed_scale") or 1.0)


def printed_value(value: Any, scale: float = 1.0, digits: int | None = None) -> str:
    """A printed cell: the value times its scale with 2 decimals (text metrics ×100: 57.10), 3 on scale 1
    (0.572); '-' for none."""
    if value is None:
        return "-"
    if digits is None:
        digits = 2 if scale != 1.0 else 3
    return f"{float(value) * scale:.{digits}f}"


def _interval(pair: Any, scale: float = 1.0) -> str:
    if not pair or pair[0] is None:
        return ""
    return f"[{printed_value(pair[0], scale)}, {printed_value(pair[1], scale)}]"


def _delta(row: dict[str, Any], metric: str, scale: float) -> str:
    """A printed difference against the baseline and its paired interval ('' when none)."""
    if metric not in row.get("delta", {}):
        return ""
    digits = 2 if scale != 1.0 else 3
    return f"{row['delta'][metric] * scale:+.{digits}f} " + _interval(row.get("delta_ci", {}).get(metric), scale)


def labelled(table: dict[str, Any]) -> dict[str, Any]:
    """The table with every row's `system` replaced by its `row_label` (what the HTML page and the plot draw)."""
    return {**table, "rows": [{**row, "system": row_label(row)} for row in table["rows"]],
            "baseline": next((row_label(r) for r in table["rows"] if r["system"] == table.get("baseline")),
                             table.get("baseline"))}


def table_text(table: dict[str, Any]) -> str:
    """The printed table: the header, the values, the intervals and the differences against the baseline (text
    metrics ×100; every column at least two spaces from the next; rows by `row_label`)."""
    metrics, rows = table["metrics"], table["rows"]
    width = max(len("system"), *(len(row_label(r)) for r in rows)) + 2
    scales = {m: printed_scale(table, m) for m in metrics}
    lines = [table["header"]]

    def block(title: str, cell: Any, skip: str | None = None) -> None:
        shown = [r for r in rows if r["system"] != skip]
        cells = {m: [cell(r, m) for r in shown] for m in metrics}
        sizes = {m: max(len(m), *(len(c) for c in cells[m])) + 2 for m in metrics}
        lines.append(title)
        lines.append("system".ljust(width) + "".join(m.rjust(sizes[m]) for m in metrics))
        for index, row in enumerate(shown):
            lines.append(row_label(row).ljust(width) + "".join(cells[m][index].rjust(sizes[m]) for m in metrics))

    block("values", lambda r, m: printed_value(r["values"].get(m), scales[m]))
    if any(r.get("ci") for r in rows):
        block("95% intervals", lambda r, m: _interval(r.get("ci", {}).get(m), scales[m]))
    if table.get("baseline"):
        block(f"difference against {labelled(table)['baseline']} [paired 95% interval]",
              lambda r, m: _delta(r, m, scales[m]), skip=table["baseline"])
    scaled = [m for m in metrics if scales[m] != 1.0]
    if scaled:
        lines.append(f"({', '.join(scaled)} ×100; the JSON keeps the raw values)")
    return "\n".join(lines)


def table_csv(table: dict[str, Any]) -> str:
    """One CSV row per system: n, then per metric its value, interval, difference, its interval and p-value (text
    cells neutralised against formula injection: `pacs.metric.common.io.csv_cell`)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    columns = ["system", "kind", "n"]
    for m in table["metrics"]:
        columns += [m, f"{m}_ci_low", f"{m}_ci_high", f"{m}_delta", f"{m}_delta_ci_low", f"{m}_delta_ci_high",
                    f"{m}_p_value"]
    writer.writerow(csv_cells(columns))  # names are the user's: a leading = + - @ cannot become a formula

    def text(value: Any) -> str:
        return "" if value is None else repr(float(value))

    for row in table["rows"]:
        cells = [row["system"], row["kind"], str(row["n"])]
        for m in table["metrics"]:
            ci = (row.get("ci") or {}).get(m) or [None, None]
            dci = (row.get("delta_ci") or {}).get(m) or [None, None]
            cells += [text(row["values"].get(m)), text(ci[0]), text(ci[1]), text((row.get("delta") or {}).get(m)),
                      text(dci[0]), text(dci[1]), text((row.get("p_value") or {}).get(m))]
        writer.writerow(csv_cells(cells))
    return buffer.getvalue()


def write_table(table: dict[str, Any], json_path: str | None = None, csv_path: str | None = None,
                png_path: str | None = None, html_path: str | None = None, latex_path: str | None = None,
                markdown_path: str | None = None, paper_intervals: bool = False) -> list[Path]:
    """Write the table as JSON, CSV (next to the JSON when no CSV path is given), PNG plot, HTML page, LaTeX and
    Markdown (`pacs.eval.table_export`, with `paper_intervals` each cell's 95% interval; each file atomically, all
    rendered before the first is written); the paths written."""
    from pacs.metric.common.io import atomic_path, write_json_atomic, write_text_atomic

    if json_path and not csv_path:
        csv_path = str(Path(json_path).with_suffix(".csv"))
    rendered: dict[str, Any] = {}
    if csv_path:
        rendered["csv"] = table_csv(table)
    if latex_path or markdown_path:
        from pacs.eval.table_export import table_latex, table_markdown

        rendered["latex"] = table_latex(table, paper_intervals)
        rendered["markdown"] = table_markdown(table, paper_intervals)
    if png_path or html_path:
        from pacs.eval.report import plot_system_table, system_table_html

        png = plot_system_table(labelled(table))
        rendered["png"] = png
        if html_path:
            rendered["html"] = system_table_html(labelled(table), png)
    written = []
    if json_path:
        write_json_atomic(json_path, table)
        written.append(Path(json_path))
    if csv_path:
        write_text_atomic(csv_path, rendered["csv"])
        written.append(Path(csv_path))
    if png_path:
        with atomic_path(Path(png_path)) as tmp:
            Path(tmp).write_bytes(rendered["png"])
        written.append(Path(png_path))
    if html_path:
        write_text_atomic(html_path, rendered["html"])
        written.append(Path(html_path))
    for path, key in ((latex_path, "latex"), (markdown_path, "markdown")):
        if path:
            write_text_atomic(path, rendered[key])
            written.append(Path(path))
    return written
