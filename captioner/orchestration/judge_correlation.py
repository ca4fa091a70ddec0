"""How well each metric agrees with an exact judge of captions: candidates of varied quality per image, scored by
CLIP-S, RefCLIP-S, PAC-S++, RefPAC-S++, BLEU-4, CIDEr-D and the length, then Kendall τ of each against the judge
and the paired bootstrap of τb(PAC-S++) − τb(CLIP-S) over images (PAC-S++ Table 8's comparison).

One stage for every run that has such a judge: the demo's `correlation` stage (on the world's validation images)
and a recipe's `correlation/<set>` (`evaluation.correlation`, on a test set whose data set registers
`candidates`, `pacs.captioner.orchestration.data_sources`: the demo world). The data set makes the candidates and
the judge's verdicts; this module scores and correlates them and writes the stage's files.
"""
from __future__ import annotations

import csv
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from annotated_types import Ge, Le

from pacs.eval.correlation import kendall
from pacs.eval.intervals import bootstrap, group_rows, percentile_interval
from pacs.metric.common.config import MAX_RESAMPLES, PositiveInt
from pacs.metric.common.io import atomic_path, csv_cells, finite_or_none, write_json_atomic

logger = logging.getLogger(__name__)

CONTRASTIVE = {"clip-s": ("clip", False), "ref-clip-s": ("clip", True), "pac-s++": ("pac-s++", False),
               "ref-pac-s++": ("pac-s++", True)}
"""Correlation column: (scorer family, with references)."""
LONG_KINDS = ("paragraph", "paragraph-late-error")
"""Candidate kinds of multi-sentence captions (the long-caption subset's rows)."""
PAIRS = (("pac-s++", "clip-s"), ("ref-pac-s++", "ref-clip-s"))
"""(metric, baseline) pairs whose Kendall tau_b difference the correlation stage bootstraps (PAC-S++ Table 8)."""


@dataclass
class CorrelationConfig:
    """Candidates of varied quality per image, scored by every metric and the judge."""

    n_images: Annotated[PositiveInt, Le(20_000)] = 300  # the first images of the split (at most all of them)
    candidates_per_image: Annotated[int, Ge(2), Le(100)] = 5  # the held-out reference and at least one corruption
    long_captions: bool = True  # + a correct paragraph and one whose last sentence names an absent shape, per image
    bootstrap_resamples: Annotated[PositiveInt, Le(MAX_RESAMPLES)] = 1000  # paired bootstrap over images of tau_b(PAC-S++) − tau_b(CLIP-S)


@dataclass(frozen=True)
class Candidates:
    """Scored candidates: `rows` (`image_id`, `kind`, `caption`, `judge`), each row's references (the image's
    references the candidate is not one of) and image file."""

    rows: list[dict[str, Any]]
    references: list[list[str]]
    images: list[str]


def per_caption_text_metrics(candidates: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, np.ndarray]:
    """Per-caption BLEU-4 (pycocoevalcap) and CIDEr-D (pacs.eval.cider) of lower-cased, space-tokenised captions."""
    from pycocoevalcap.bleu.bleu import Bleu

    from pacs.eval.cider import cider_d

    cands = [" ".join(c.lower().split()) for c in candidates]
    refs = [[" ".join(r.lower().split()) for r in rs] for rs in references]
    gts = {i: refs[i] for i in range(len(cands))}
    res = {i: [cands[i] if cands[i] else "."] for i in range(len(cands))}
    _, per_caption = Bleu(4).compute_score(gts, res, verbose=0)
    cider = cider_d(cands, refs, tokenized=True)  # already lower-cased and split: scored as given
    return {"bleu4": np.asarray(per_caption[3], dtype=float), "cider": np.asarray(cider, dtype=float)}


def contrastive_metrics(scorers: Mapping[str, Any], images: Sequence[str], candidates: Sequence[str],
                        references: Sequence[Sequence[str]], keys: Sequence[str],
                        truncated: dict[str, list[bool]] | None = None) -> dict[str, np.ndarray]:
    """CLIP-S, RefCLIP-S, PAC-S++ and RefPAC-S++ per caption (pacs.metric.scoring.scorer.Scorer), those of the
    families `scorers` has. `truncated`, when given, receives each family's per-candidate truncation flags."""
    out = {}
    for name, (family, with_refs) in CONTRASTIVE.items():
        if family not in scorers:
            continue
        result = scorers[family].score(list(images), list(candidates), references=list(references) if with_refs
                                       else None, keys=list(keys))
        out[name] = np.asarray(result.scores, dtype=float)
        if truncated is not None:
            truncated[family] = list(result.truncated)
    return out


def chunking_scorers(scorers: Mapping[str, Any]) -> dict[str, Any]:
    """A `--long-captions chunk` Scorer on the same model, w and prompt as each of `scorers`."""
    from pacs.metric.scoring.scorer import Scorer

    return {family: Scorer(scorer.backbone, w=scorer.w, prompt=scorer.prompt, progress=False,
                           long_captions="chunk", device=str(scorer.device), dtype=scorer.dtype)
            for family, scorer in scorers.items()}


def kendall_record(values: np.ndarray, judge: np.ndarray) -> dict[str, float | None]:
    """Kendall tau_b and tau_c (x100) of a metric against the judge; None (null) where undefined (constant)."""
    return {"tau_b": finite_or_none(kendall(values, judge, "b")), "tau_c": finite_or_none(kendall(values, judge, "c")),
            "n": len(values)}


def _tau(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def correlate(candidates: Candidates, scorers: Mapping[str, Any], folder: Path, settings: CorrelationConfig,
              seed: int) -> dict[str, Any]:
    """Score `candidates` with every metric, correlate each with the judge; write the stage's files into
    `folder` (scores.csv, correlation.json, comparisons.json, long_captions.json when there are long rows)."""
    rows, references, images = [dict(row) for row in candidates.rows], candidates.references, candidates.images
    texts, keys = [r["caption"] for r in rows], [r["image_id"] for r in rows]
    truncated: dict[str, list[bool]] = {}
    metrics = {**contrastive_metrics(scorers, images, texts, references, keys, truncated),
               **per_caption_text_metrics(texts, references),
               "length": np.asarray([len(c.split()) for c in texts], dtype=float)}
    if settings.long_captions:  # the same metrics with every sentence read (`--long-captions chunk`)
        chunked = contrastive_metrics(chunking_scorers(scorers), images, texts, references, keys)
        metrics.update({f"{name} chunk": values for name, values in chunked.items()})
    judge = np.asarray([r["judge"] for r in rows], dtype=float)
    summary = {name: kendall_record(values, judge) for name, values in metrics.items()}
    long_rows = np.asarray([r["kind"] in LONG_KINDS for r in rows])
    for name, values in metrics.items():
        for row, value in zip(rows, values):
            row[name] = round(float(value), 6)
    flags = truncated.get("clip", truncated.get("pac-s++", [False] * len(rows)))
    for row, cut in zip(rows, flags):
        row["truncated"] = int(cut)
    columns = ["image_id", "kind", "caption", "judge", *metrics, "truncated"]
    with atomic_path(folder / "scores.csv") as tmp, open(tmp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(csv_cells(row) for row in rows)  # captions are never live spreadsheet formulas
    write_json_atomic(folder / "correlation.json", summary)
    if long_rows.any():
        write_json_atomic(folder / "long_captions.json", long_caption_summary(metrics, judge, long_rows, truncated))
    comparisons = compare_taus(metrics, judge, keys, PAIRS, settings.bootstrap_resamples, seed)
    write_json_atomic(folder / "comparisons.json", comparisons)
    for line in comparison_findings(comparisons):
        logger.info("%s", line)
    logger.info("correlation with the judge (Kendall tau_b x100): %s",
                ", ".join(f"{k} {_tau(v['tau_b'], 1)}" for k, v in summary.items()))
    return {"n_candidates": len(rows), "tau_b": {k: _tau(v["tau_b"], 2) for k, v in summary.items()}}


def long_caption_summary(metrics: Mapping[str, np.ndarray], judge: np.ndarray, long_rows: np.ndarray,
                         truncated: Mapping[str, Sequence[bool]]) -> dict[str, Any]:
    """Kendall tau of each contrastive metric, truncated and chunked, on the long candidates alone (+ counts)."""
    names = [name for name in CONTRASTIVE if f"{name} chunk" in metrics]
    return {"n_long": int(long_rows.sum()),
            "n_truncated": {family: int(sum(flags)) for family, flags in truncated.items()},
            "n_long_truncated": {family: int(np.asarray(flags, dtype=bool)[long_rows].sum())
                                 for family, flags in truncated.items()},
            "tau_b": {name: {"truncate": kendall_record(metrics[name][long_rows], judge[long_rows])["tau_b"],
                             "chunk": kendall_record(metrics[f"{name} chunk"][long_rows], judge[long_rows])["tau_b"]}
                      for name in names}}


def compare_taus(metrics: Mapping[str, np.ndarray], judge: np.ndarray, image_ids: Sequence[str],
                 pairs: Sequence[tuple[str, str]], n_resamples: int, seed: int) -> dict[str, Any]:
    """tau_b(metric) − tau_b(baseline) (x100) per pair with a paired bootstrap 95% interval over images.

    Every resample draws images with replacement and keeps all candidates of each drawn image (candidates of one
    image are not independent); both taus of a pair are computed on the same resample."""
    groups: dict[str, list[int]] = {}
    for index, image_id in enumerate(image_ids):
        groups.setdefault(image_id, []).append(index)
    members = list(groups.values())
    present = [(metric, baseline) for metric, baseline in pairs if metric in metrics and baseline in metrics]

    def tau(values: np.ndarray, rows: np.ndarray | slice) -> float:
        return kendall(values[rows], judge[rows], "b")

    def statistic(drawn: np.ndarray) -> dict[str, float]:
        rows = group_rows(members, drawn)
        return {f"{m} vs {b}": tau(metrics[m], rows) - tau(metrics[b], rows) for m, b in present}

    samples = bootstrap(statistic, len(members), n_resamples, [seed, 11], description="tau bootstrap")
    out: dict[str, Any] = {"n_resamples": n_resamples, "n_images": len(members)}
    for metric, baseline in present:
        key = f"{metric} vs {baseline}"
        delta = tau(metrics[metric], slice(None)) - tau(metrics[baseline], slice(None))
        deltas = np.asarray(samples.get(key, []), dtype=np.float64)
        deltas = deltas[np.isfinite(deltas)]  # a resample where a metric is constant has no tau
        low, high = percentile_interval(deltas, (2.5, 97.5))
        out[key] = {"delta_tau_b": finite_or_none(delta), "ci": [finite_or_none(low), finite_or_none(high)]}
    return out


def comparison_findings(comparisons: Mapping[str, Any]) -> list[str]:
    """One sentence per pair: beats / within noise of / below its baseline, by the bootstrap interval."""
    lines = []
    for name, entry in comparisons.items():
        if not isinstance(entry, dict):
            continue
        metric, baseline = name.split(" vs ")
        low, high = entry["ci"]
        if entry["delta_tau_b"] is None or low is None or high is None:
            lines.append(f"{metric} vs {baseline}: no tau_b difference (a metric is constant on these candidates)")
            continue
        verdict = ("beats" if low > 0 else "falls below" if high < 0 else "is within noise of")
        lines.append(f"{metric} {verdict} {baseline} against the judge: tau_b difference "
                     f"{entry['delta_tau_b']:+.1f} [{low:+.1f}, {high:+.1f}] (paired bootstrap over images, "
                     f"{comparisons['n_resamples']} resamples)")
    return lines


def read_correlation(folder: Path) -> dict[str, Any]:
    """What `correlate` wrote into `folder`: its Kendall table, paired comparisons and long-caption table
    (`correlation`, `comparisons`, `long_captions`; None for a file it did not write)."""
    def read(name: str) -> Any:
        path = folder / name
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    return {"correlation": read("correlation.json"), "comparisons": read("comparisons.json"),
            "long_captions": read("long_captions.json")}


def correlation_markdown(record: Mapping[str, Any], shown: str) -> str:
    """Kendall tau of every metric against the judge, the paired comparisons, and the long-caption subset of a
    correlation (`read_correlation`; `shown`: its folder as the text names it)."""
    lines = ["| metric | τb | τc |", "|---|---|---|"]
    lines += [f"| {name} | {_tau_cell(v.get('tau_b'))} | {_tau_cell(v.get('tau_c'))} |"
              for name, v in record["correlation"].items() if isinstance(v, dict)]
    parts = [f"Kendall ×100 of each metric against the judge (`{shown}/correlation.json`):\n\n"
             + "\n".join(lines) + "\n"]
    return "\n".join(parts + correlation_extras(record))


def correlation_extras(record: Mapping[str, Any]) -> list[str]:
    """The paired τb comparisons (PAC-S++ vs CLIP-S) and the long-caption table of a correlation
    (`read_correlation`)."""
    parts = []
    if record.get("comparisons") is not None:
        parts.append("".join(f"* {line}\n" for line in comparison_findings(record["comparisons"])))
    long = record.get("long_captions")
    if long is not None:
        rows = ["| metric | τb truncated | τb chunked |", "|---|---|---|"]
        rows += [f"| {name} | {_tau_cell(v['truncate'])} | {_tau_cell(v['chunk'])} |"
                 for name, v in long["tau_b"].items()]
        context = long["n_long_truncated"].get("clip", next(iter(long["n_long_truncated"].values()), 0))
        parts.append(f"On the {long['n_long']} long candidates alone ({context} "
                     "longer than the CLIP's text context), truncated vs chunked (`--long-captions chunk`):\n\n"
                     + "\n".join(rows) + "\n")
    return parts


def _tau_cell(value: Any) -> str:
    return "" if value is None else f"{value:.1f}"
