"""Stage `correlation`: how well CLIP-S, PAC-S++ and text metrics agree with the exact judge (Kendall tau)."""
from __future__ import annotations

import csv
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from pacs.captioner.demo.candidates import LONG_KINDS, candidates_for, long_candidates_for
from pacs.captioner.demo.config import DemoConfig
from pacs.captioner.demo.data import DemoData
from pacs.captioner.demo.judge import judge_caption
from pacs.eval.intervals import bootstrap, group_rows, percentile_interval
from pacs.metric.common.io import atomic_path, csv_cells, finite_or_none, write_json_atomic

logger = logging.getLogger(__name__)

CONTRASTIVE = {"clip-s": ("clip", False), "ref-clip-s": ("clip", True), "pac-s++": ("pac-s++", False),
               "ref-pac-s++": ("pac-s++", True)}


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
    """CLIP-S, RefCLIP-S, PAC-S++ and RefPAC-S++ per caption (pacs.metric.scoring.scorer.Scorer).

    `truncated`, when given, receives each family's per-candidate truncation flags."""
    out = {}
    for name, (family, with_refs) in CONTRASTIVE.items():
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


def kendall(values: np.ndarray, judge: np.ndarray) -> dict[str, float | None]:
    """Kendall tau_b and tau_c (x100, scipy) of a metric against the judge; None (null) where undefined (constant)."""
    return {"tau_b": finite_or_none(100 * stats.kendalltau(values, judge, variant="b").statistic),
            "tau_c": finite_or_none(100 * stats.kendalltau(values, judge, variant="c").statistic), "n": len(values)}


def _tau(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def run_correlation(config: DemoConfig, data: DemoData, scorers: Mapping[str, Any], folder: Path) -> dict:
    """Score candidates of varied quality on validation images with every metric and the judge."""
    items = data.splits["val"][: config.correlation.n_images]
    rng = np.random.default_rng([config.seed, 7])
    rows: list[dict[str, Any]] = []
    for item in items:
        chosen = candidates_for(item, items, rng, config.correlation.candidates_per_image)
        if config.correlation.long_captions:
            chosen += long_candidates_for(item, rng)
        for kind, caption in chosen:
            judgement = judge_caption(caption, item.scene)
            rows.append({"image_id": item.image_id, "kind": kind, "caption": caption, "judge": judgement.score})
    references = [data.references()[r["image_id"]][1:] for r in rows]  # the first reference is a candidate
    candidates = [r["caption"] for r in rows]
    images = [str(data.image_path(r["image_id"])) for r in rows]
    keys = [r["image_id"] for r in rows]
    truncated: dict[str, list[bool]] = {}
    metrics = {**contrastive_metrics(scorers, images, candidates, references, keys, truncated),
               **per_caption_text_metrics(candidates, references),
               "length": np.asarray([len(c.split()) for c in candidates], dtype=float)}
    if config.correlation.long_captions:  # the same metrics with every sentence read (`--long-captions chunk`)
        chunked = contrastive_metrics(chunking_scorers(scorers), images, candidates, references, keys)
        metrics.update({f"{name} chunk": values for name, values in chunked.items()})
    judge = np.asarray([r["judge"] for r in rows], dtype=float)
    summary = {name: kendall(values, judge) for name, values in metrics.items()}
    long_rows = np.asarray([r["kind"] in LONG_KINDS for r in rows])
    for name, values in metrics.items():
        for row, value in zip(rows, values):
            row[name] = round(float(value), 6)
    for row, cut in zip(rows, truncated.get("clip", [False] * len(rows))):
        row["truncated"] = int(cut)
    columns = ["image_id", "kind", "caption", "judge", *metrics, "truncated"]
    with atomic_path(folder / "scores.csv") as tmp, open(tmp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(csv_cells(row) for row in rows)  # captions are never live spreadsheet formulas
    write_json_atomic(folder / "correlation.json", summary)
    if long_rows.any():
        write_json_atomic(folder / "long_captions.json", long_caption_summary(metrics, judge, long_rows, truncated))
    comparisons = compare_taus(metrics, judge, keys, PAIRS, config.correlation.bootstrap_resamples, config.seed)
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
            "tau_b": {name: {"truncate": kendall(metrics[name][long_rows], judge[long_rows])["tau_b"],
                             "chunk": kendall(metrics[f"{name} chunk"][long_rows], judge[long_rows])["tau_b"]}
                      for name in names}}


PAIRS = (("pac-s++", "clip-s"), ("ref-pac-s++", "ref-clip-s"))
"""(metric, baseline) pairs whose Kendall tau_b difference the correlation stage bootstraps (PAC-S++ Table 8)."""


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
        return 100 * float(stats.kendalltau(values[rows], judge[rows], variant="b").statistic)

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
