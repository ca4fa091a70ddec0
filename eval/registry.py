"""One registry of every metric name pacs knows (text, contrastive, fluency, baseline): docs/data_layouts.md."""
from __future__ import annotations

from dataclasses import dataclass

from pacs.metric.common.errors import InputError
from pacs.metric.common.suggest import known_hint
from pacs.metric.scoring.registry import METRICS as CONTRASTIVE_METRICS


@dataclass(frozen=True)
class EvalMetric:
    """A metric name and how it is computed.

    kind: `text` (pycocoevalcap / fast CIDEr-D, per caption, needs references), `contrastive` (metric/,
    needs images and a model), `fluency` (corpus-level only: Rep-n, %Incorrect, grammar) or `baseline`
    (`length`, per caption).
    """

    name: str
    kind: str
    reference_based: bool
    per_caption: bool
    needs_java: bool = False
    description: str = ""


def _build() -> dict[str, EvalMetric]:
    """Every metric, keyed by its canonical lower-case name."""
    entries = [EvalMetric(f"bleu{k}", "text", True, True, False, f"BLEU-{k} (pycocoevalcap)") for k in range(1, 5)]
    entries += [
        EvalMetric("meteor", "text", True, True, True, "METEOR 1.5 (pycocoevalcap jar)"),
        EvalMetric("rouge", "text", True, True, False, "ROUGE-L (pycocoevalcap)"),
        EvalMetric("cider", "text", True, True, False, "CIDEr-D (pacs fast implementation = pycocoevalcap)"),
        EvalMetric("spice", "text", True, True, True, "SPICE (pycocoevalcap jar + CoreNLP 3.6.0)"),
    ]
    entries += [EvalMetric(spec.name, "contrastive", spec.reference_based, True, False,
                           f"{spec.name} (metric/, family {spec.family})") for spec in CONTRASTIVE_METRICS.values()]
    entries += [EvalMetric(f"rep{k}", "fluency", False, False, False, f"Rep-{k}: mean repeated {k}-grams")
                for k in range(1, 5)]
    entries += [
        EvalMetric("incorrect", "fluency", False, False, False, "%Incorrect: captions ending on a function word"),
        EvalMetric("grammar", "fluency", False, False, False, "grammar-error rate (%), backend named"),
        EvalMetric("length", "baseline", False, True, False, "caption length in words (longer = better)"),
    ]
    return {entry.name: entry for entry in entries}


METRICS: dict[str, EvalMetric] = _build()
# The spellings papers and other toolkits use for the same metrics.
ALIASES: dict[str, str] = {
    **{f"bleu-{k}": f"bleu{k}" for k in range(1, 5)}, **{f"bleu_{k}": f"bleu{k}" for k in range(1, 5)},
    **{f"rep-{k}": f"rep{k}" for k in range(1, 5)},
    "rouge-l": "rouge", "rouge_l": "rouge", "rougel": "rouge", "cider-d": "cider", "ciderd": "cider",
    "%incorrect": "incorrect",
}
TEXT_METRICS = tuple(name for name, m in METRICS.items() if m.kind == "text")


def get_metric(name: str) -> EvalMetric:
    """Look a metric up by name or alias (`BLEU-4`, `ROUGE-L`, `CIDEr-D`, ...), case-insensitively.

    InputError listing the known names otherwise.
    """
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if key not in METRICS:
        raise InputError(f"unknown metric {name!r} {known_hint(key, [*METRICS, *ALIASES], sep=' ')}")
    return METRICS[key]


def parse_metric_list(text: str | list[str]) -> list[str]:
    """Canonical names of a comma-separated list (or a list); unknown names raise InputError, duplicates kept once."""
    items = text.split(",") if isinstance(text, str) else list(text)
    names = [get_metric(item).name for item in items if str(item).strip()]
    if not names:
        raise InputError("no metric given")
    return list(dict.fromkeys(names))
