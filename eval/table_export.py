"""A system table as a paper's table: LaTeX (booktabs) and Markdown (`pacs evaluate --latex / --markdown`).

Columns are grouped as in PAC-S Tab. 7 / PAC-S++ Tab. 6: reference-based (BLEU, METEOR, ROUGE-L, CIDEr-D,
SPICE and the Ref- scores), reference-free (CLIP-S, PAC-S, PAC-S++), then fluency (Rep-n, %Incorrect,
grammar, length), each group in the table's column order, headed by the papers' labels (B-4, M, C, S,
RefPAC-S, ...). Values are printed on the papers' scales (text metrics ×100 with one decimal, contrastive
scores with three, the others with two); with `intervals`, each cell also carries its 95% bootstrap interval
(`row["ci"]`, on the same scale). Bold, in a table with bootstrap resamples (`table["best"]`,
`pacs.eval.intervals.best_rows`): the best row of a column alone when its paired 95% interval against the
runner-up excludes 0, otherwise every row whose paired interval with the best includes 0; without resamples, the
best printed value (ties all bold). The human row is not ranked; lower is better for Rep-n, %Incorrect and grammar,
marked ↓; length is not ranked. Rows are labelled as in every other form of the table
(`pacs.eval.system_inputs.row_label`), escaped (LaTeX specials, Markdown punctuation). Each contrastive column's
model, family and `w` are listed under the table.
"""
from __future__ import annotations

import re
from typing import Any

from pacs.eval import columns as col
from pacs.eval.system_inputs import HUMAN_ROW, row_label

_LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                   "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_MARKDOWN_SPECIALS = re.compile(r"([\\`*_\[\]<>|~])")


def latex_escape(text: str) -> str:
    """`text` with LaTeX's special characters escaped (control characters shown as `\\x..`)."""
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in str(text))
    return "".join(_LATEX_SPECIALS.get(c, c) for c in text)


def markdown_escape(text: str) -> str:
    """`text` with Markdown's punctuation backslash-escaped (so `|` cannot end a cell, `*` cannot bold)."""
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in str(text))
    return _MARKDOWN_SPECIALS.sub(r"\\\1", text)


def digits(metric: str) -> int:
    """Decimals of a column: 1 for text metrics (×100), 3 for contrastive scores, 2 otherwise."""
    if col.printed_scale(metric) != 1.0:
        return 1
    return 3 if col.group(metric) != "fluency" else 2


def ordered_columns(table: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """`[(group, [metric, ...]), ...]`: the table's metrics by group (the papers' order), each in table order."""
    groups = [(name, [m for m in table["metrics"] if col.group(m) == name]) for name in col.GROUPS]
    return [(name, metrics) for name, metrics in groups if metrics]


def _scale(table: dict[str, Any], metric: str) -> float:
    return float(((table.get("columns") or {}).get(metric) or {}).get("printed_scale") or 1.0)


def _printed(value: Any, table: dict[str, Any], metric: str) -> str | None:
    return None if value is None else f"{float(value) * _scale(table, metric):.{digits(metric)}f}"


def printed_cells(table: dict[str, Any]) -> dict[str, dict[str, str | None]]:
    """`{system: {metric: printed value or None}}` on the papers' scales."""
    return {row["system"]: {metric: _printed(row["values"].get(metric), table, metric) for metric in table["metrics"]}
            for row in table["rows"]}


def printed_intervals(table: dict[str, Any]) -> dict[str, dict[str, str | None]]:
    """`{system: {metric: "[low, high]" or None}}`: each cell's 95% interval on the papers' scales."""
    out: dict[str, dict[str, str | None]] = {}
    for row in table["rows"]:
        out[row["system"]] = {}
        for metric in table["metrics"]:
            pair = (row.get("ci") or {}).get(metric)
            low, high = (_printed(pair[0], table, metric), _printed(pair[1], table, metric)) if pair else (None, None)
            out[row["system"]][metric] = None if low is None or high is None else f"[{low}, {high}]"
    return out


def best_cells(table: dict[str, Any]) -> dict[str, set[str]]:
    """`{metric: {systems in bold}}` over the rows other than the human row: the rows of `table["best"][metric]`
    (the noise-aware rule) where the table has it, else those with the best printed value (empty for a column
    without direction or values)."""
    cells = printed_cells(table)
    ranked = [row["system"] for row in table["rows"] if row.get("kind") != HUMAN_ROW]
    records = table.get("best") or {}
    best: dict[str, set[str]] = {}
    for metric in table["metrics"]:
        if (records.get(metric) or {}).get("rows"):
            best[metric] = set(records[metric]["rows"])
            continue
        sign = col.direction(metric)
        values = {name: float(cells[name][metric]) for name in ranked if cells[name][metric] is not None}
        if sign == col.NEITHER or not values:
            best[metric] = set()
            continue
        top = max(sign * v for v in values.values())
        best[metric] = {name for name, v in values.items() if sign * v == top}
    return best


def _models_note(table: dict[str, Any]) -> list[str]:
    """One line per contrastive column: `LABEL: model (family, w=W)`."""
    lines = []
    for metric in table["metrics"]:
        record = (table.get("columns") or {}).get(metric) or {}
        if record.get("model"):
            family = record.get("family") or "family not established"
            w = f", w={record['w']:g}" if record.get("w") is not None else ""
            lines.append(f"{col.label(metric)}: {record['model']} ({family}{w})")
    return lines


def _header_label(metric: str) -> str:
    return col.label(metric) + (" ↓" if col.direction(metric) == col.LOWER else "")


def _bold_note(table: dict[str, Any]) -> str:
    """What bold means in this table (the noise-aware rule with resamples, the best printed value without)."""
    if table.get("best"):
        return ("bold: the best per column when its paired 95% interval against the runner-up excludes 0, "
                "otherwise every row not separated from the best (human row not ranked)")
    return "best per column in bold (human row not ranked)"


def _interval_note(intervals: bool) -> str:
    return "; each value followed by its 95% bootstrap interval" if intervals else ""


def table_latex(table: dict[str, Any], intervals: bool = False) -> str:
    """The table as a LaTeX `tabular` (needs `\\usepackage{booktabs}`): group headers with `\\cmidrule`, one row
    per system (the human row after a rule), bold by `best_cells`, with `intervals` each cell's 95% interval in
    `\\scriptsize` after its value."""
    groups = ordered_columns(table)
    metrics = [m for _, ms in groups for m in ms]
    cells, best = printed_cells(table), best_cells(table)
    extra = printed_intervals(table) if intervals else None
    spec = "l" + "".join("c" * len(ms) for _, ms in groups)
    lines = [f"% pacs system-level table: {latex_escape(table.get('header', ''))}",
             f"% needs \\usepackage{{booktabs}}; text metrics x100; {_bold_note(table)}{_interval_note(intervals)}",
             *[f"% {latex_escape(line)}" for line in _models_note(table)],
             f"\\begin{{tabular}}{{{spec}}}", "\\toprule"]
    spans, rules, start = [], [], 2
    for name, ms in groups:
        spans.append(f"\\multicolumn{{{len(ms)}}}{{c}}{{{col.GROUP_TITLES[name]}}}")
        rules.append(f"\\cmidrule(lr){{{start}-{start + len(ms) - 1}}}")
        start += len(ms)
    lines.append(" & " + " & ".join(spans) + " \\\\")
    lines.append(" ".join(rules))
    labels = [latex_escape(col.label(m)) + (" $\\downarrow$" if col.direction(m) == col.LOWER else "")
              for m in metrics]
    lines.append("Model & " + " & ".join(labels) + " \\\\")
    lines.append("\\midrule")
    for row in table["rows"]:
        name = row["system"]
        if row.get("kind") == HUMAN_ROW:
            lines.append("\\midrule")
        values = _row_values(cells[name], metrics, best, name, "\\textbf{{{}}}",
                             None if extra is None else extra[name], " {{\\scriptsize {}}}")
        label = latex_escape(row_label(row))
        lines.append(f"{label} & " + " & ".join(values) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def table_markdown(table: dict[str, Any], intervals: bool = False) -> str:
    """The table as Markdown: the column groups on a line above, one row per system, bold by `best_cells`, with
    `intervals` each cell's 95% interval after its value."""
    groups = ordered_columns(table)
    metrics = [m for _, ms in groups for m in ms]
    cells, best = printed_cells(table), best_cells(table)
    extra = printed_intervals(table) if intervals else None
    group_line = " · ".join(f"{col.GROUP_TITLES[name]}: " + ", ".join(col.label(m) for m in ms)
                            for name, ms in groups)
    bold = (_bold_note(table).replace(" (human row not ranked)", ", human row not ranked")
            if table.get("best") else "best per column in bold, human row not ranked")
    lines = [f"Columns: {group_line} (text metrics ×100; ↓ lower is better; {bold}{_interval_note(intervals)})", "",
             "| Model | " + " | ".join(_header_label(m) for m in metrics) + " |",
             "|---|" + "---:|" * len(metrics)]
    for row in table["rows"]:
        name = row["system"]
        values = _row_values(cells[name], metrics, best, name, "**{}**", None if extra is None else extra[name],
                             " {}")
        label = markdown_escape(row_label(row))
        lines.append(f"| {label} | " + " | ".join(values) + " |")
    notes = _models_note(table)
    if notes:
        lines += ["", "Models: " + "; ".join(markdown_escape(line) for line in notes) + "."]
    return "\n".join(lines) + "\n"


def _row_values(row_cells: dict, metrics: list[str], best: dict, name: str, bold: str,
                row_intervals: dict | None = None, interval: str = " {}") -> list[str]:
    """One system's printed cells in column order: `-` for a missing value, `bold` around a bold value, its
    interval (formatted by `interval`) after it when `row_intervals` has one."""
    out = []
    for metric in metrics:
        value = row_cells[metric]
        if value is None:
            out.append("-")
            continue
        cell = bold.format(value) if name in best[metric] else value
        shown = (row_intervals or {}).get(metric)
        out.append(cell + (interval.format(shown) if shown else ""))
    return out
