"""What a table column means: its paper label, its direction (is higher better?), its printed scale and its group.

Text metrics (BLEU, METEOR, ROUGE-L, CIDEr-D, SPICE) are computed as fractions and printed ×100, as the papers
and the demo print them (the JSON keeps the raw value and records the scale). Rep-n, %Incorrect and the grammar
error rate are better when lower; length has no better direction. Columns are grouped as the papers group
them (PAC-S Tab. 7, PAC-S++ Tab. 6): reference-based (text metrics and Ref- scores), reference-free (CLIP-S,
PAC-S, PAC-S++), then fluency (Rep-n, %Incorrect, grammar, length).

A column may be named by its metric (`bleu4`, `ref-pac-s++`) or by its paper label (`B-4`, `RefPAC-S++`,
the demo's columns); an unknown name is taken as higher-is-better, scale 1.

`TABLE_COLUMNS` is the one order of every column a results table can show (a recipe's evaluation, the demo's
system-level table, a pooled or compared table); each table shows the ones its run computes (`table_columns`).

>>> label("bleu4"), label("ref-pac-s++"), direction("rep2"), direction("%Incorrect"), printed_scale("cider")
('B-4', 'RefPAC-S++', -1, -1, 100.0)
>>> group("meteor"), group("ref-clip-s"), group("PAC-S"), group("incorrect")
('reference-based', 'reference-based', 'reference-free', 'fluency')
"""
from __future__ import annotations

from collections.abc import Iterable

from pacs.eval.registry import get_metric
from pacs.metric.common.errors import InputError

HIGHER, LOWER, NEITHER = 1, -1, 0
GROUPS = ("reference-based", "reference-free", "fluency")
GROUP_TITLES = {"reference-based": "Reference-based", "reference-free": "Reference-free", "fluency": "Fluency"}
TEXT_SCALE = 100.0

LABELS: dict[str, str] = {
    **{f"bleu{k}": f"B-{k}" for k in range(1, 5)}, "meteor": "M", "rouge": "R", "cider": "C", "spice": "S",
    "clip-s": "CLIP-S", "ref-clip-s": "RefCLIP-S", "pac-s": "PAC-S", "ref-pac-s": "RefPAC-S",
    "pac-s++": "PAC-S++", "ref-pac-s++": "RefPAC-S++", **{f"rep{k}": f"Rep-{k}" for k in range(1, 5)},
    "incorrect": "%Incorrect", "grammar": "Grammar", "length": "Length"}
TABLE_COLUMNS: tuple[str, ...] = (
    "B-4", "M", "C", "S", "CLIP-S", "PAC-S++", "RefCLIP-S", "RefPAC-S++", "Rep-1", "Rep-2", "Rep-3", "Rep-4",
    "%Incorrect", "Judge-acc", "Judge", "Halluc.", "Length")
"""Every results-table column, in the order every table shows them (PAC-S++ Table 10's: text metrics, the
reference-free scores, their reference-based variants, fluency; then the demo judge's columns and length)."""


JUDGE_COLUMNS: tuple[str, ...] = ("Judge-acc", "Judge", "Halluc.")
"""The columns an exact judge of captions adds (the demo world's, `pacs.captioner.demo.judge`): the percentage of
captions it finds correct, its mean score x 100, and the percentage that name an object the image lacks."""


def table_columns(computed: Iterable[str]) -> list[str]:
    """The columns of `TABLE_COLUMNS` that a run computes, in the table's order (an unknown name is an error)."""
    computed = set(computed)
    unknown = sorted(computed - set(TABLE_COLUMNS))
    if unknown:
        raise ValueError(f"not results-table columns: {', '.join(unknown)} (pacs.eval.columns.TABLE_COLUMNS)")
    return [column for column in TABLE_COLUMNS if column in computed]


_BY_LABEL = {text.lower(): name for name, text in LABELS.items()}
#: metrics (or other columns, by label) where a lower value is better
LOWER_IS_BETTER = frozenset({"rep1", "rep2", "rep3", "rep4", "incorrect", "grammar", "halluc."})
#: columns with no better direction
NO_DIRECTION = frozenset({"length"})


def canonical(name: str) -> str:
    """The metric name of a column named by metric, alias or paper label; the lower-cased name otherwise."""
    key = str(name).strip().lower()
    if key in _BY_LABEL:
        return _BY_LABEL[key]
    try:
        return get_metric(key).name
    except InputError:
        return key


def label(name: str) -> str:
    """The paper's label of a column (`bleu4` -> `B-4`); an unknown name as given."""
    return LABELS.get(canonical(name), str(name))


def direction(name: str) -> int:
    """`HIGHER` (1) when a higher value is better, `LOWER` (-1) when a lower one is, `NEITHER` (0) for length."""
    key = canonical(name)
    if key in LOWER_IS_BETTER:
        return LOWER
    return NEITHER if key in NO_DIRECTION else HIGHER


def printed_scale(name: str) -> float:
    """The factor printed tables apply to a metric's raw value: 100 for text metrics, 1 otherwise."""
    try:
        return TEXT_SCALE if get_metric(canonical(name)).kind == "text" else 1.0
    except InputError:
        return 1.0


def group(name: str) -> str:
    """`reference-based`, `reference-free` or `fluency` (an unknown column: `fluency`, shown last)."""
    try:
        metric = get_metric(canonical(name))
    except InputError:
        return "fluency"
    if metric.kind in ("text", "contrastive"):
        return "reference-based" if metric.reference_based else "reference-free"
    return "fluency"


def better(name: str, value: float, other: float) -> bool:
    """True when `value` is strictly better than `other` in the column's direction (never for length)."""
    sign = direction(name)
    return sign != NEITHER and sign * (value - other) > 0
