"""A self-contained HTML report of a run directory that tells the run's story at a glance.

The page, top to bottom: the headline (two or three sentences generated from the findings by
`pacs.eval.report_story`: the best reward by the judge or, without one, by the chosen metric; which rewards were
gamed and how; whether the KL guards held) and the paper figure (`pacs.eval.report_figures`: each system's change
against the baseline with its interval, per-seed points and the oracle's gain marked, beside each reward's own gain
against the quality gain, gaming as the shaded quadrant), both in the first screen; then one system table (the
system-level table when results.json has one, else the results table; a column printed alike on every row, or blank
on every row, is folded into a note under it), each reward's own gain and every row's change against the baseline,
the findings ranked (robust first, fragile and seed-dependent marked, by their `replication`), the warnings, the
gallery (every system's caption and the references; a photograph scaled down, a rendered scene enlarged), the
training curves (the seed they show named, one legend outside the panels), the metric-vs-judge scatter plots (a
hexbin beyond `SCATTER_HEXBIN_ABOVE` points) and the provenance (`pacs.eval.report_provenance`: pacs version and
git commit, command, date, wall time, machine, seeds, config.yaml). Row labels are unique on every table and plot
(`report_figures.unique_labels`: two runs of one reward are told apart by their row names).

The run-directory layout it reads (every part optional; a missing part is shown as absent):

    results.json              {"columns": [metric, ...], "rows": [{"model": name, metric: value, ...}], ...}
    logs/<stage>.csv          training curves: a `step` column (else the row number) and any numeric columns;
                              stages named `<group>-<variant>.csv` (e.g. `scst-cider.csv`) are drawn together,
                              one line per variant, one panel per column
    logs/<group>.reference.json   optional {"label": "xe", "values": {column: value}}: a dashed reference line
                              in that group's panels (e.g. the XE model's value in the SCST curves)
    correlation/correlation.json  {metric: {"tau_b": ..., "tau_c": ..., "n": ...}}
    correlation/scores.csv    one row per judged caption: a `judge` column (the ground truth) and one column per metric
    gallery.json              [{"image_id", "image": path relative to the run dir, "references": [...],
                                "captions": {model: {"caption", "scores": {metric: value}, "verdict",
                                                     "highlights": [[start, end, kind], ...]}}}]
                              highlights mark character spans of the caption (kind `absent`: a shape that is
                              not in the image; `dangling`: a cut-off ending); a filter shows only the images
                              whose models' verdicts disagree
    results.json may also hold per row "delta"/"ci" ({column: value} / {column: [low, high]}: the change
    against the baseline row and its 95% interval), "reward_gains" and "findings" (sentences): all shown; a
    null cell (the human row's B-4) is shown as '-'; and "system_table" (the layout of `pacs.eval.system_table`:
    {"header", "metrics", "baseline", "rows": [{"system", "values", "ci", "delta", "delta_ci"}]}), shown as the
    "System-level table" section: values with intervals, differences against the baseline row and the heat map
    of `plot_system_table` (`system_table_section`, the body of `system_table_html`'s page).
    provenance.json / config.yaml  the run's provenance (written by `pacs train`) and its settings

Images and plots are embedded as base64 data URIs, so the page is one file with no external resources. The page
records a digest of everything it was built from (`report_digest`: the files above, the stage records, the
gallery images, the title and the code of this module and of the report_* modules beside it);
`write_report(..., reuse=True)` keeps a page whose digest still matches. Every file it reads, gallery images included, must resolve (symlinks included)
inside the run directory; a gallery entry whose image leads elsewhere (`../x`, an absolute path, a symlink
pointing outside) is an InputError naming the entry, and no page is written (`pacs.eval.report_inputs`).
"""
from __future__ import annotations

import base64
import hashlib
import html
import io
import logging
import math
import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from scipy import stats

from pacs.eval import report_figures as _figures
from pacs.eval import report_inputs as _inputs
from pacs.eval import report_provenance as _provenance
from pacs.eval import report_story as _story
from pacs.eval.report_inputs import (  # noqa: F401 (the readers are part of this module's interface)
    CURVE_SKIP_COLUMNS,
    CURVE_X_COLUMNS,
    gallery_image,
    input_file,
    load_correlation,
    load_curves,
    load_gallery,
    load_references,
    load_results,
    report_inputs,
)
from pacs.eval.report_inputs import finite_number as _number
from pacs.eval.report_inputs import read_input_json as _read_json
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import write_text_atomic

logger = logging.getLogger(__name__)

STYLE = """
body{font-family:system-ui,Arial,sans-serif;margin:2em;max-width:1200px;color:#222}
h1{margin-bottom:0}table{border-collapse:collapse;margin:1em 0}
th,td{border:1px solid #bbb;padding:3px 6px;text-align:right;font-size:13px}th{background:#eee}
td.name,th.name{text-align:left;white-space:nowrap}td.ci-up{background:#dbeafe}td.ci-down{background:#ffedd5}.absent{color:#888;font-style:italic}
td.ci-better{background:#dcfce7}td.ci-worse{background:#fee2e2}th small{font-weight:normal;color:#555}
.gallery{display:flex;flex-wrap:wrap;gap:12px}.card{border:1px solid #ccc;padding:8px;width:360px}
.card img.pixel{image-rendering:pixelated;width:128px;height:128px}.card img.photo{max-width:100%;height:auto;display:block}.verdict-correct{color:#080}
.verdict-wrong{color:#b00}.verdict-incomplete{color:#b70}.card td{text-align:left;font-size:90%}
.plot{max-width:100%}mark.hl-absent{background:#f8b4b4}mark.hl-dangling{background:#fde68a}
.findings li{margin:3px 0}#story{margin:0.6em 0 1em}#headline{font-size:16px;line-height:1.45;margin:0.4em 0 0.6em;max-width:1100px}
#story-figure{max-width:100%;max-height:460px}.note{color:#555;font-size:12px}td.prov{text-align:left;font-family:monospace}
.badge{font-size:11px;padding:0 4px;border-radius:3px;background:#dcfce7}.rank-fragile .badge{background:#fef3c7}
.rank-seed-dependent .badge{background:#fee2e2}#provenance td{font-size:12px}pre{font-size:11px;overflow:auto;max-height:400px}#delta-table td,#delta-table th{font-size:11px;padding:2px 4px}
"""
DIGEST_META = "pacs-report-inputs"
FILTER_SCRIPT = """<script>function pacsFilter(box){document.querySelectorAll('.gallery .card').forEach(c=>{
c.style.display=(box.checked&&c.dataset.disagree!=='1')?'none':'';});}</script>"""


_plain_text = _figures.plain_text


def _png_data_uri(figure_or_bytes: Any) -> str:
    if isinstance(figure_or_bytes, bytes):
        raw = figure_or_bytes
    else:
        buffer = io.BytesIO()
        figure_or_bytes.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
        plt.close(figure_or_bytes)
        raw = buffer.getvalue()
    return "data:image/png;base64," + base64.b64encode(raw).decode("ascii")


@_plain_text
def plot_curves(group: str, columns: dict[str, dict[str, tuple[list[float], list[float]]]],
                reference: tuple[str, dict[str, float]] | None = None, seed: str | None = None) -> str:
    """One figure per log group: a panel per column, a line per variant, a dashed line for the reference value
    of a column when given, one legend for the figure outside the panels (it never covers a line), the seed the
    curves are from in the title; returned as a data URI."""
    names = list(columns)
    n_cols = min(3, len(names))
    n_rows = math.ceil(len(names) / n_cols)
    figure, axes = plt.subplots(n_rows, n_cols, figsize=(4.2 * n_cols, 3.0 * n_rows), squeeze=False)
    legend: dict[str, Any] = {}
    for axis, name in zip(axes.flat, names):
        for variant, (xs, ys) in sorted(columns[name].items()):
            colour = f"C{sorted({v for c in columns.values() for v in c}).index(variant) % 10}"
            (line,) = axis.plot(xs, ys, label=variant, linewidth=1.2, color=colour)
            legend.setdefault(variant, line)
        if reference is not None and name in reference[1]:
            line = axis.axhline(reference[1][name], color="black", linestyle="--", linewidth=1.0, label=reference[0])
            legend.setdefault(reference[0], line)
        axis.set_title(name)
        axis.set_xlabel("step")
    for axis in list(axes.flat)[len(names):]:
        axis.axis("off")
    figure.suptitle(group + (f" — {seed}" if seed else ""))
    figure.tight_layout()
    if len(legend) > 1 or reference is not None:
        figure.legend(list(legend.values()), list(legend), loc="upper left", bbox_to_anchor=(1.0, 0.95),
                      fontsize=8, frameon=False)
    return _png_data_uri(figure)


SCATTER_HEXBIN_ABOVE = 400
"""A metric-vs-judge panel with more points than this is a hexbin (counts on a log scale), fewer an alpha scatter:
thousands of points drawn one by one smear into stripes."""


@_plain_text
def plot_correlation(summary: dict[str, Any], columns: dict[str, list[float]]) -> str | None:
    """Scatter of every metric against the `judge` column (Kendall tau_b in the titles); None without data."""
    if "judge" not in columns:
        return None
    metrics = [c for c in columns if c != "judge"]
    if not metrics:
        return None
    n_cols = min(4, len(metrics))
    n_rows = math.ceil(len(metrics) / n_cols)
    figure, axes = plt.subplots(n_rows, n_cols, figsize=(3.4 * n_cols, 3.0 * n_rows), squeeze=False)
    judge = columns["judge"]
    for axis, metric in zip(axes.flat, metrics):
        tau = (summary.get(metric) or {}).get("tau_b") if isinstance(summary.get(metric), dict) else None
        if tau is None:
            tau = 100 * stats.kendalltau(columns[metric], judge, variant="b").statistic
        if len(judge) > SCATTER_HEXBIN_ABOVE:
            axis.hexbin(judge, columns[metric], gridsize=28, bins="log", mincnt=1, cmap="Blues", linewidths=0)
        else:
            axis.scatter(judge, columns[metric], s=8, alpha=0.35, linewidths=0)
        axis.set_title(f"{metric}  (tau_b={tau:.1f})", fontsize=9)
        axis.set_xlabel("judge score")
    for axis in list(axes.flat)[len(metrics):]:
        axis.axis("off")
    figure.tight_layout()
    return _png_data_uri(figure)


def _format(value: Any) -> str:
    number = _number(value)
    if number is None:
        return html.escape(str(value))
    return f"{number:.2f}" if abs(number) < 1000 else f"{number:.0f}"


_signed = _story.signed


def _interval_cell(delta: Any, interval: Any, column: str | None = None, scale: float = 1.0) -> str:
    """A change and its interval (times `scale`), classed `ci-up` / `ci-down` when the interval excludes 0 and
    `ci-better` / `ci-worse` by the column's direction (`pacs.eval.columns`: a rise of Rep-n or %Incorrect is worse;
    length has none)."""
    from pacs.eval import columns

    if _number(delta) is None or not isinstance(interval, (list, tuple)) or len(interval) != 2:
        return "<td></td>"
    low, high = (_number(v) for v in interval)
    if low is None or high is None:
        return "<td></td>"
    kind = "up" if low > 0 else "down" if high < 0 else "noise"
    sign = columns.direction(column) if column is not None else columns.HIGHER
    if kind != "noise" and sign != columns.NEITHER:
        kind += " ci-better" if (kind == "up") == (sign == columns.HIGHER) else " ci-worse"
    return (f'<td class="ci-{kind}">{_signed(float(delta) * scale)}<br><small>[{_signed(low * scale)}, '
            f"{_signed(high * scale)}]</small></td>")


def _cell(row: dict[str, Any], column: str) -> str:
    """A results-table cell: the value, '-' for a blank one (null: the human row's B-4), '' when absent."""
    if column in row and row[column] is None:
        return "-"
    return _format(row.get(column, ""))


def _fold_note(constant: dict[str, str], empty: list[str]) -> str:
    """The note under a table naming the columns left out of it: printed alike on every row, or with no value."""
    parts = []
    if constant:
        parts.append("equal on every row that has a value, so not shown as columns: " + ", ".join(
            f"{html.escape(c)} {v}" for c, v in constant.items()))
    if empty:
        parts.append("no value on any row (not computed in this run): " + ", ".join(html.escape(c) for c in empty))
    return f'<p class="note" id="folded-columns">{"; ".join(parts)}.</p>' if parts else ""


def _results_table(columns: list[str], rows: list[dict[str, Any]]) -> str:
    """The results table (`#results-table`): constant and empty columns folded into a note, labels unique."""
    shown, constant, empty = _figures.constant_columns(columns, rows, _cell)
    labels = _row_labels(rows)
    head = '<th class="name">model</th>' + "".join(f"<th>{html.escape(c)}</th>" for c in shown)
    body = "".join('<tr><td class="name">' + html.escape(label) + "</td>"
                   + "".join(f"<td>{_cell(r, c)}</td>" for c in shown) + "</tr>" for r, label in zip(rows, labels))
    return (f'<table class="results" id="results-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
            + _fold_note(constant, empty))


def _row_labels(rows: list[dict[str, Any]]) -> list[str]:
    """Each row's unique label: its model, with its test set (a recipe's rows) or its position when shared."""
    return _figures.unique_labels([str(r.get("model")) for r in rows],
                                  [str(r["test_set"]) if r.get("test_set") else None for r in rows])


def _gains_html(gains: Any) -> str:
    """Each reward's own value under the baseline (XE, or a transformers run's `init`) and under its SCST row
    (`#reward-gains`), one row per SCST row: two runs of one reward (a mix summed or normalised) are told apart by
    their row names."""
    if not isinstance(gains, list) or not gains:
        return ""
    gains = [g for g in gains if isinstance(g, dict)]
    base = str(gains[0].get("baseline", "xe")) if gains else "xe"
    labels = _figures.unique_labels([str(g.get("model") or g.get("reward")) for g in gains],
                                    [str(g.get("reward")) for g in gains])
    lines = "".join(f'<tr><td class="name">{html.escape(label)}</td><td class="name">{html.escape(str(g.get("reward")))}'
                    f'</td><td>{_format(g.get(base))}</td><td>{_format(g.get("scst"))}</td>'
                    f'{_interval_cell(g.get("delta"), g.get("ci"), g.get("reward"))}</tr>'
                    for g, label in zip(gains, labels))
    return ("<h3>Each reward's own value on the test split</h3>"
            '<table id="reward-gains"><thead><tr><th class="name">system</th><th class="name">reward</th>'
            f"<th>{html.escape(base)}</th><th>scst</th><th>Δ [95% interval]</th></tr></thead><tbody>{lines}</tbody></table>")


def _delta_html(columns: list[str], rows: list[dict[str, Any]], baseline: str) -> str:
    """Every row's change against the baseline with its interval (`#delta-table`), on the columns where some
    change is not 0 (a column equal on every row changes by 0 everywhere)."""
    with_ci = [r for r in rows if isinstance(r.get("ci"), dict)]
    if not with_ci:
        return ""
    def printed(row: dict[str, Any], column: str) -> str:
        delta, interval = _number((row.get("delta") or {}).get(column)), row["ci"].get(column)
        if delta is None or not isinstance(interval, list) or None in (_number(v) for v in interval):
            return ""
        return " ".join(_signed(v) for v in (delta, *interval))

    zero = " ".join([_signed(0.0)] * 3)
    shown = [c for c in columns if any(printed(r, c) not in ("", zero) for r in with_ci)]  # else no change shows
    head = '<th class="name">model</th>' + "".join(f"<th>{html.escape(c)}</th>" for c in shown)
    lines = "".join('<tr><td class="name">' + html.escape(label) + "</td>"
                    + "".join(_interval_cell((r.get("delta") or {}).get(c), r["ci"].get(c), c) for c in shown)
                    + "</tr>" for r, label in zip(with_ci, _row_labels(with_ci)))
    return (f"<h3>Change against {html.escape(baseline)} (paired bootstrap 95% interval; coloured when it excludes "
            f'0)</h3><table id="delta-table"><thead><tr>{head}</tr></thead><tbody>{lines}</tbody></table>')


def _findings_html(extra: dict[str, Any]) -> str:
    """The findings ranked (`#findings`): robust first, then fragile (marked), then seed-dependent; and the
    replication paragraph."""
    parts = []
    found = extra.get("findings")
    if isinstance(found, list) and found:
        badges = {_story.ROBUST: "robust", _story.FRAGILE_RANK: "fragile", _story.SEED_DEPENDENT_RANK: "seed-dependent",
                  _story.UNRATED: ""}
        items = "".join(f'<li class="rank-{kind}">' + (f'<span class="badge">{badges[kind]}</span> ' if badges[kind]
                                                       else "") + f"{html.escape(_finding_line(line))}</li>"
                        for line, kind in _story.ranked_findings(found))
        parts.append("<p>Ranked by how likely an independent replication (another machine, other seeds) reaches the "
                     f'same verdict: robust first, fragile marked.</p><ul class="findings" id="findings">{items}</ul>')
    replication = extra.get("replication")
    if isinstance(replication, dict) and isinstance(replication.get("text"), str):
        parts.append(f'<p id="replication">{html.escape(replication["text"])}</p>')
    return "".join(parts)


def _story_html(extra: dict[str, Any], columns: list[str], rows: list[dict[str, Any]]) -> str:
    """The top of the page: the headline (`#headline`, from the findings) and the paper figure (`#story-figure`)."""
    column = _figures.headline_column(rows, [*_story.HEADLINE_COLUMNS, *columns])  # else the table's first with one
    sentences = _story.headline({**extra, "rows": rows}, column)
    text = (" ".join(html.escape(s) for s in sentences) if sentences
            else '<span class="absent">No findings or intervals in this run to state a headline from.</span>')
    figure = ""
    if column is not None:
        png = _figures.story_figure(rows, extra.get("reward_gains") or [], column,
                                    str(extra.get("baseline") or "xe"), extra.get("oracle"), extra.get("seeds") or [])
        if png:
            figure = f'<img id="story-figure" class="plot" alt="each system against the baseline" src="{_png_data_uri(png)}">'
    return f'<section id="story"><p id="headline">{text}</p>{figure}</section>'


def _finding_line(finding: Any) -> str:
    """A finding as printed: a record's `text` (results.json `findings: [{subject, claim, holds, interval, text}]`)
    or the sentence itself."""
    return str(finding.get("text", finding)) if isinstance(finding, dict) else str(finding)


SEED_PLOT_COLUMNS = ("Judge-acc", "C", "PAC-S++", "Rep-2", "Length")
"""The columns whose per-seed changes the report draws (those a row has)."""


@_plain_text
def plot_seed_deltas(rows: list[dict[str, Any]], seeds: list[Any]) -> str | None:
    """One panel per column of `SEED_PLOT_COLUMNS`: every row's change against the baseline in each seed (dots,
    `delta_per_seed`) and its 95% interval over seeds and images (bar, `ci`); None with fewer than 2 seeds."""
    drawn = [r for r in rows if isinstance(r.get("delta_per_seed"), dict) and isinstance(r.get("ci"), dict)]
    columns = [c for c in SEED_PLOT_COLUMNS if any(c in r["delta_per_seed"] and c in r["ci"] for r in drawn)]
    if len(seeds) < 2 or not drawn or not columns:
        return None
    figure, axes = plt.subplots(1, len(columns), figsize=(3.2 * len(columns), 0.35 * len(drawn) + 1.4),
                                squeeze=False, sharey=True)
    names = [str(r["model"]) for r in drawn]
    for axis, column in zip(axes.flat, columns):
        for y, row in enumerate(drawn):
            if column not in row["ci"] or column not in row["delta_per_seed"]:
                continue
            low, high = row["ci"][column]
            axis.plot([low, high], [y, y], color="0.6", linewidth=3, solid_capstyle="butt")
            for index, value in enumerate(row["delta_per_seed"][column]):
                axis.plot([value], [y], "o", markersize=4, color=f"C{index % 10}",
                          label=f"seed {seeds[index]}" if y == 0 else None)
        axis.axvline(0.0, color="black", linewidth=0.8)
        axis.set_title(f"Δ {column}")
    axes[0][0].set_yticks(range(len(names)), names, fontsize=7)
    axes[0][0].invert_yaxis()
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)  # off the dots
    figure.tight_layout()
    return _png_data_uri(figure)


def _correlation_html(correlation: tuple[dict[str, Any], dict[str, list[float]]] | None) -> str:
    if correlation is None:
        return '<p class="absent">No correlation/ folder in this run.</p>'
    summary, columns = correlation
    parts = []
    if summary:
        keys = sorted({k for v in summary.values() if isinstance(v, dict) for k in v})
        head = '<th class="name">metric</th>' + "".join(f"<th>{html.escape(k)}</th>" for k in keys)
        body = "".join('<tr><td class="name">' + html.escape(m) + "</td>"
                       + "".join(f"<td>{_format(v.get(k, ''))}</td>" for k in keys) + "</tr>"
                       for m, v in summary.items() if isinstance(v, dict))
        parts.append(f'<table class="correlation" id="correlation-table"><thead><tr>{head}</tr></thead>'
                     f"<tbody>{body}</tbody></table>")
    scatter = plot_correlation(summary, columns)
    if scatter:
        parts.append(f'<img class="plot" alt="correlation scatter plots" src="{scatter}">')
    return "".join(parts)


def highlight_caption(caption: str, spans: Any) -> str:
    """The caption as HTML with each `(start, end, kind)` character span wrapped in `<mark class="hl-KIND">`."""
    out, position = [], 0
    valid = sorted((int(a), int(b), str(k)) for a, b, k in (spans or []) if 0 <= int(a) < int(b) <= len(caption))
    for start, end, kind in valid:
        if start < position:  # overlapping spans: keep the first
            continue
        out.append(html.escape(caption[position:start]))
        out.append(f'<mark class="hl-{html.escape(kind)}">{html.escape(caption[start:end])}</mark>')
        position = end
    out.append(html.escape(caption[position:]))
    return "".join(out)


def _gallery_html(run_dir: Path, gallery: list[dict[str, Any]] | None) -> str:
    if gallery is None:
        return '<p class="absent">No gallery.json in this run.</p>'
    cards = []
    for index, entry in enumerate(gallery):
        image_id = html.escape(str(entry.get("image_id", "?")))
        image_html = '<p class="absent">image missing</p>'
        image_path = gallery_image(run_dir, index, entry)
        if image_path is not None:
            if image_path.is_file():
                kind, uri = _gallery_image_uri(image_path)
                image_html = f'<img class="{kind}" alt="{image_id}" src="{uri}">'
            else:
                logger.warning("gallery image %s is missing", image_path)
        refs = "".join(f"<li>{html.escape(r)}</li>" for r in entry.get("references", []))
        rows = []
        captions = entry.get("captions") or {}
        for model, info in captions.items():
            verdict = html.escape(str(info.get("verdict", "")))
            scores = ", ".join(f"{html.escape(k)} {_format(v)}" for k, v in (info.get("scores") or {}).items())
            text = highlight_caption(str(info.get("caption", "")), info.get("highlights"))
            rows.append(f'<tr><td><b>{html.escape(model)}</b></td><td class="caption">{text}'
                        f'<br><small>{scores}</small> <span class="verdict-{verdict}">{verdict}</span></td></tr>')
        disagree = int(len({str(info.get("verdict", "")) for info in captions.values()}) > 1)
        cards.append(f'<div class="card" data-disagree="{disagree}"><div>{image_html} <b>{image_id}</b></div>'
                     f"<small>references:</small><ul>{refs}</ul><table>{''.join(rows)}</table></div>")
    n_disagree = sum('data-disagree="1"' in card for card in cards)
    judged = any(info.get("verdict") for entry in gallery for info in (entry.get("captions") or {}).values())
    controls = "" if not judged else (f'<p><label><input type="checkbox" id="disagree-filter" onchange="pacsFilter(this)"> only the '
                f"{n_disagree} image(s) where the models' verdicts disagree</label> &nbsp; "
                '<mark class="hl-absent">absent shape</mark> <mark class="hl-dangling">dangling ending</mark></p>')
    return f'{FILTER_SCRIPT}{controls}<div class="gallery">{"".join(cards)}</div>'


GALLERY_PHOTO_PIXELS = 320
"""A gallery photograph is embedded at most this many pixels on its longer side (a JPEG); a small rendered image
(the demo world's 64-pixel scenes) is embedded as it is and drawn enlarged with its pixels kept sharp."""
PIXEL_ART_BELOW = 96


def _gallery_image_uri(path: Path) -> tuple[str, str]:
    """(CSS class, data URI) of a gallery image: `pixel` for a small rendered image (as it is), `photo` for a
    photograph (scaled down to `GALLERY_PHOTO_PIXELS`); a file PIL cannot read is embedded as it is."""
    from PIL import Image, UnidentifiedImageError

    raw = path.read_bytes()
    try:
        with Image.open(io.BytesIO(raw)) as image:
            if max(image.size) < PIXEL_ART_BELOW:
                return "pixel", _png_data_uri(raw)
            photo = image.convert("RGB")
            photo.thumbnail((GALLERY_PHOTO_PIXELS, GALLERY_PHOTO_PIXELS))
            buffer = io.BytesIO()
            photo.save(buffer, format="JPEG", quality=85)
    except (UnidentifiedImageError, OSError, ValueError):
        return "pixel", _png_data_uri(raw)
    return "photo", "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def report_digest(run_dir: str | os.PathLike, title: str | None = None) -> str:
    """SHA-256 over the report's input files (names and bytes), its title and the code that builds the page."""
    run_dir = Path(run_dir)
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for module in (_inputs, _figures, _story, _provenance):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(f"\0title\0{_title(run_dir, title)}".encode())
    for path in dict.fromkeys([*report_inputs(run_dir), *_provenance.provenance_files(run_dir)]):
        digest.update(f"\0{path.relative_to(run_dir).as_posix()}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _title(run_dir: Path, title: str | None) -> str:
    return title or f"pacs run: {run_dir.resolve().name}"


def recorded_digest(page: str | os.PathLike) -> str | None:
    """The input digest an existing report page records, or None (no page, or one written without it)."""
    path = Path(page)
    if not path.is_file():
        return None
    with open(path, encoding="utf-8", errors="replace") as handle:
        head = handle.read(2000)  # the digest is in <head>; the page itself may be megabytes of embedded images
    marker = f'<meta name="{DIGEST_META}" content="'
    start = head.find(marker)
    if start < 0:
        return None
    start += len(marker)
    return head[start:head.find('"', start)]


def build_report(run_dir: str | os.PathLike, title: str | None = None) -> str:
    """Return the HTML page describing the run in `run_dir`."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"run directory not found: {run_dir}")
    return _page(run_dir, title, report_digest(run_dir, title))


def _page(run_dir: Path, title: str | None, digest: str) -> str:
    """The HTML page of `run_dir`, recording `digest` (its `report_digest`): the headline and the paper figure first,
    then one system table, the changes, the findings ranked, curves, correlations, gallery and provenance."""
    curves = load_curves(run_dir)
    references = load_references(run_dir)
    results_path = _inputs.results_file(run_dir)  # results.json, or a recipe's eval/results.json, ...
    extra = _read_json(results_path) if results_path is not None else {}
    extra = extra if isinstance(extra, dict) else {}
    results = load_results(run_dir)  # checks the file's JSON types first: one line naming a bad key
    provenance = _provenance.load_provenance(run_dir, extra)
    seeds = [str(s) for s in provenance["seeds"]]
    shared = {path.stem for path in _inputs.stage_records(run_dir) if path.parent == run_dir / "stages"}
    curve_html = "".join(f'<h3>{html.escape(g)}</h3><img class="plot" alt="{html.escape(g)} curves" '
                         f'src="{plot_curves(g, cols, references.get(g), _curve_seed(g, shared, seeds))}">'
                         for g, cols in curves.items())
    columns, rows = results if results is not None else ([], [])
    warnings = _inputs.load_warnings(run_dir)
    system = _system_section(extra)
    if system:
        table_html = system[0][1]
    elif results is not None:
        table_html = _results_table(columns, rows)
    else:
        table_html = '<p class="absent">No results.json in this run.</p>'
    seeds_plot = plot_seed_deltas(rows, extra.get("seeds") or [])
    changes = "".join([
        _gains_html(extra.get("reward_gains")),
        _delta_html(columns, rows, str(extra.get("baseline", "baseline"))),
        ("<h3>Every seed's change against the baseline (dots: one per seed; bar: the 95% interval over seeds and "
         f'images)</h3><img id="seed-deltas" class="plot" src="{seeds_plot}" alt="per-seed changes">'
         if seeds_plot is not None else "")])
    findings_html = _findings_html(extra)
    sections = [
        ("System table" if system else "Results", table_html),
        *([("Changes against the baseline", changes)] if changes else []),
        *([("What the run found", findings_html)] if findings_html else []),
        *([("Warnings", '<ul class="findings" id="warnings">' + "".join(
            f"<li><b>{html.escape(stage)}</b>: {html.escape(line)}</li>" for stage, line in warnings) + "</ul>")]
          if warnings else []),
        ("Gallery", _gallery_html(run_dir, load_gallery(run_dir))),
        ("Training curves", curve_html or '<p class="absent">No logs/*.csv in this run.</p>'),
        ("Metric vs ground truth", _correlation_html(load_correlation(run_dir))),
        ("Provenance", _provenance_html(provenance)),
    ]
    title = _title(run_dir, title)
    body = "".join(f"<h2>{name}</h2>{content}" for name, content in sections)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="{DIGEST_META}" content="{digest}"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{_story_html(extra, columns, rows)}{body}"
            "</body></html>\n")


def _curve_seed(group: str, shared: set[str], seeds: list[str]) -> str | None:
    """Which seed a curve group shows: logs/ holds the first seed's per-seed stages (XE, SCST and their monitors;
    a recipe over several seeds names each line's seed itself); a stage run once (`stages/<group>.json`: the
    metric's clip / pacs) is no seed's."""
    if group in shared or not seeds:
        return None
    return f"seed {seeds[0]}" + (f" (the first of seeds {', '.join(seeds)})" if len(seeds) > 1 else "")


def _provenance_html(found: dict[str, Any]) -> str:
    """The provenance section (`#provenance`): version, commit, command, date, wall time, machine, seeds, config."""
    lines = "".join(f'<tr><td class="name">{html.escape(label)}</td><td class="prov">{html.escape(value)}</td></tr>'
                    for label, value in _provenance.provenance_summary(found))
    config = (f"<details><summary>config.yaml</summary><pre>{html.escape(found['config'])}</pre></details>"
              if found["config"] else '<p class="absent">No config.yaml in this run.</p>')
    return f'<table id="provenance"><tbody>{lines}</tbody></table>{config}'


def _system_section(extra: dict[str, Any]) -> list[tuple[str, str]]:
    """The page's "System-level table" section when results.json holds one (`system_table`, in the layout of
    `pacs.eval.system_table`: the demo's rows and the human row): header, values with intervals, differences against
    the baseline row and the normalised heat map (`plot_system_table`); none otherwise."""
    table = extra.get("system_table")
    if not isinstance(table, dict):
        return []
    rows, metrics = table.get("rows"), table.get("metrics")
    if not isinstance(rows, list) or not isinstance(metrics, list) or not all(
            isinstance(r, dict) and "system" in r and isinstance(r.get("values"), dict) for r in rows):
        raise InputError("results.json: 'system_table' must be {'metrics': [...], 'rows': [{'system', 'values'}]}")
    def printed(row: dict[str, Any], metric: str) -> str | None:
        value = _number(row["values"].get(metric))
        return None if value is None else _format(value * _column_scale(table, metric))

    shown, constant, empty = _figures.constant_columns(metrics, rows, printed)
    labels = _figures.unique_labels([str(r["system"]) for r in rows])
    folded = {**table, "metrics": shown, "rows": [{**r, "system": label} for r, label in zip(rows, labels)]}
    section = system_table_section(folded, plot_system_table(folded) if shown else None, "system-delta-table")
    return [("System-level table", section + _fold_note(constant, empty))]


def write_report(run_dir: str | os.PathLike, out: str | os.PathLike | None = None, reuse: bool = False) -> Path:
    """Write the report of `run_dir` to `out` (default `run_dir/report.html`) atomically; return its path.

    With `reuse`, an existing page whose recorded input digest equals the current one is kept as it is.
    """
    run_dir = Path(run_dir)
    target = Path(out) if out else run_dir / "report.html"
    if not run_dir.is_dir():
        raise InputError(f"run directory not found: {run_dir}")
    if not _inputs.has_results(run_dir):
        raise InputError(f"{run_dir} holds no pacs results (no {', '.join(_inputs.RESULT_FILES)}, "
                         f"{_inputs.TRAIN_LOG}, logs/*.csv, <stage>/log.csv, correlation/ or gallery.json): "
                         "is it a run directory? Nothing was written")
    digest = report_digest(run_dir)
    if reuse and recorded_digest(target) == digest:
        logger.info("report %s is up to date (same inputs), kept", target)
        return target
    write_text_atomic(target, _page(run_dir, None, digest))
    return target


# ------------------------------------------------------------------------------------------------ system tables
def _column_scale(table: dict[str, Any], metric: str) -> float:
    """The printed scale of a column (`columns[m].printed_scale`: 100 for text metrics; 1 when not recorded)."""
    return float(((table.get("columns") or {}).get(metric) or {}).get("printed_scale") or 1.0)


def _column_model(table: dict[str, Any], metric: str) -> str | None:
    """`model (family, w=W)` of a contrastive column that records one; None otherwise."""
    record = (table.get("columns") or {}).get(metric) or {}
    if not record.get("model"):
        return None
    w = f", w={record['w']:g}" if record.get("w") is not None else ""
    return f"{record['model']} ({record.get('family') or 'family not established'}{w})"


def normalised_columns(table: dict[str, Any]) -> list[list[float]]:
    """Rows × metrics of a system table, each metric scaled to [0, 1] over the rows from its worst (0) to its best
    (1) row value by the metric's direction (`pacs.eval.columns`: lower is better for Rep-n, %Incorrect, grammar; length,
    which has no better direction, from lowest to highest); NaN where blank, 0.5 for a metric equal on every row."""
    from pacs.eval import columns

    metrics, rows = table["metrics"], table["rows"]
    grid = [[_number(row["values"].get(m)) for m in metrics] for row in rows]
    out = [[float("nan")] * len(metrics) for _ in rows]
    for column, metric in enumerate(metrics):
        values = [line[column] for line in grid if line[column] is not None]
        if not values:
            continue
        low, high = min(values), max(values)
        lower_is_better = columns.direction(metric) == columns.LOWER
        for index, line in enumerate(grid):
            if line[column] is not None:
                share = 0.5 if high == low else (line[column] - low) / (high - low)
                out[index][column] = 1.0 - share if lower_is_better and high != low else share
    return out


@_plain_text
def plot_system_table(table: dict[str, Any]) -> bytes:
    """A heat map of a system table (rows × metrics, each metric from its worst to its best row, the values written
    in the cells on their printed scale: text metrics ×100; each contrastive column's model and w under its name)
    as PNG bytes."""
    import numpy as np

    from pacs.eval import columns

    metrics, rows = table["metrics"], table["rows"]
    grid = np.ma.masked_invalid(np.array(normalised_columns(table), dtype=float).reshape(len(rows), len(metrics)))
    figure, axis = plt.subplots(figsize=(1.0 + 0.9 * len(metrics), 1.2 + 0.45 * len(rows)))
    colours = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    axis.imshow(grid, cmap=colours, vmin=0.0, vmax=1.0, aspect="auto")
    labels = []
    for metric in metrics:
        arrow = " ↓" if columns.direction(metric) == columns.LOWER else ""
        scaled = " ×100" if _column_scale(table, metric) != 1.0 else ""
        model = _column_model(table, metric)
        labels.append(f"{metric}{arrow}{scaled}" + (f"\n{model}" if model else ""))
    axis.set_xticks(range(len(metrics)), labels, rotation=45, ha="right", fontsize=7)
    axis.set_yticks(range(len(rows)), [str(r["system"]) for r in rows], fontsize=8)
    for i, row in enumerate(rows):
        for j, metric in enumerate(metrics):
            value = _number(row["values"].get(metric))
            if value is not None:
                value *= _column_scale(table, metric)
            text = "-" if value is None else (f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}")
            shade = grid[i, j]
            colour = "white" if shade is np.ma.masked or shade < 0.5 else "black"
            axis.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
    axis.set_title("each metric from its worst (dark) to its best (light) row value (↓: lower is better; length: "
                   "lowest to highest)", fontsize=8)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def system_table_section(table: dict[str, Any], png: bytes | None = None, delta_id: str = "delta-table") -> str:
    """HTML of a system table: header, values with intervals (`#system-table`; text metrics ×100, each contrastive
    column's model, family and w under its name), differences against the baseline (`#DELTA_ID`, coloured better
    / worse by the metric's direction when the paired interval excludes 0) and the heat map (`#system-plot`)."""
    from pacs.eval import columns

    metrics, rows = table["metrics"], table["rows"]

    def header(metric: str) -> str:
        notes = [note for note in (
            "×100" if _column_scale(table, metric) != 1.0 else None,
            "lower is better" if columns.direction(metric) == columns.LOWER else None,
            _column_model(table, metric)) if note]
        return f"<th>{html.escape(metric)}" + "".join(f"<br><small>{html.escape(n)}</small>" for n in notes) + "</th>"

    head = '<th class="name">system</th>' + "".join(header(m) for m in metrics)

    def value_cell(row: dict[str, Any], metric: str) -> str:
        interval = (row.get("ci") or {}).get(metric)
        value, scale = _number(row["values"].get(metric)), _column_scale(table, metric)
        if value is None:
            return "<td>-</td>"
        bounds = [_number(v) for v in interval] if isinstance(interval, list) and len(interval) == 2 else None
        extra = (f"<br><small>[{_format(bounds[0] * scale)}, {_format(bounds[1] * scale)}]</small>"
                 if bounds and None not in bounds else "")
        return f"<td>{_format(value * scale)}{extra}</td>"

    body = "".join('<tr><td class="name">' + html.escape(str(r["system"])) + "</td>"
                   + "".join(value_cell(r, m) for m in metrics) + "</tr>" for r in rows)
    parts = [f"<p>{html.escape(str(table.get('header', '')))}</p>",
             f'<table class="results" id="system-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>']
    baseline = table.get("baseline")
    paired = [r for r in rows if r.get("delta_ci")]
    if baseline and paired:
        lines = "".join('<tr><td class="name">' + html.escape(str(r["system"])) + "</td>"
                        + "".join(_interval_cell((r.get("delta") or {}).get(m), r["delta_ci"].get(m), m,
                                                 _column_scale(table, m)) for m in metrics)
                        + "</tr>" for r in paired)
        parts.append(f"<h3>Difference against {html.escape(str(baseline))} (paired bootstrap 95% interval; "
                     f"coloured when it excludes 0: green better, red worse by the metric's direction)</h3>"
                     f'<table id="{delta_id}"><thead><tr>{head}</tr></thead><tbody>{lines}</tbody></table>')
    if png:
        parts.append(f'<img class="plot" id="system-plot" alt="normalised system table" src="{_png_data_uri(png)}">')
    return "".join(parts)


def system_table_html(table: dict[str, Any], png: bytes | None = None) -> str:
    """A self-contained HTML page of a system table: header, values with intervals, differences against the
    baseline (coloured when the paired interval excludes 0) and the normalised heat map."""
    title = "pacs system-level table"
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{STYLE}</style></head><body><h1>{title}</h1>{system_table_section(table, png)}</body></html>\n")
