"""The report's paper figure: each system's change against the baseline with its interval (a forest plot: per-seed
points where there are seeds, the oracle's gain marked) beside each reward's own gain against the quality gain
(gaming is the quadrant where the reward rose and quality did not). Drawn with matplotlib as PNG bytes.

Its inputs are results.json's rows (`delta`, `ci`, `delta_per_seed` per column), `reward_gains` (each SCST row's
own reward on the test split: `xe`, `scst`, `delta`, `ci`) and `oracle`; `forest_rows` and `gain_points` pick what
is drawn, so a test can check the figure's data without reading pixels.
"""
from __future__ import annotations

import functools
import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from pacs.eval.report_inputs import finite_number

T = TypeVar("T")


def plain_text(plot: Callable[..., T]) -> Callable[..., T]:
    """Draw with matplotlib's math text and TeX off: system names, metric and column names are the user's text and
    appear as written (a name such as ``$\\foo$`` is not parsed as math, which would fail the whole plot)."""
    @functools.wraps(plot)
    def plain(*args: Any, **kwargs: Any) -> T:
        with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
            return plot(*args, **kwargs)
    return plain


def png(figure: Any, dpi: int = 80) -> bytes:
    """The figure as PNG bytes (closed afterwards)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def unique_labels(labels: Sequence[str], hints: Sequence[str | None] | None = None) -> list[str]:
    """`labels` made unique: a label shared by several rows gets its hint (`hints[i]`, e.g. the stage name) in
    brackets, and one still shared after that its position (#1, #2, ...)."""
    hints = list(hints) if hints is not None else [None] * len(labels)
    out = list(labels)
    for index, label in enumerate(labels):
        if labels.count(label) > 1 and hints[index] and hints[index] != label:
            out[index] = f"{label} [{hints[index]}]"
    shared = {label for label in out if out.count(label) > 1}
    seen: dict[str, int] = {}
    for index, label in enumerate(out):
        if label in shared:
            seen[label] = seen.get(label, 0) + 1
            out[index] = f"{label} #{seen[label]}"
    return out


def _interval(value: Any) -> tuple[float, float] | None:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    low, high = (finite_number(v) for v in value)
    return None if low is None or high is None else (low, high)


def forest_rows(rows: Sequence[Mapping[str, Any]], column: str) -> list[dict[str, Any]]:
    """The rows a forest plot of `column` draws: {label, delta, ci, per_seed} of every row with a change and an
    interval in `column`, in table order, labels unique."""
    drawn = []
    for row in rows:
        delta = finite_number((row.get("delta") or {}).get(column)) if isinstance(row.get("delta"), Mapping) else None
        interval = _interval((row.get("ci") or {}).get(column)) if isinstance(row.get("ci"), Mapping) else None
        if delta is None or interval is None:
            continue
        seeds = (row.get("delta_per_seed") or {}).get(column) if isinstance(row.get("delta_per_seed"), Mapping) \
            else None
        per_seed = [v for v in (finite_number(x) for x in seeds or []) if v is not None]
        drawn.append({"label": str(row.get("model")), "delta": delta, "ci": interval, "per_seed": per_seed})
    for item, label in zip(drawn, unique_labels([d["label"] for d in drawn])):
        item["label"] = label
    return drawn


Z_95 = 1.959964
"""The normal quantile of a 95% interval: a gain's standard error is its interval's half-width over this."""


def gain_points(gains: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]], column: str
                ) -> list[dict[str, Any]]:
    """The points of the reward-gain vs quality-gain plot: {label, x, x_ci, y, y_ci} per reward gain whose row has
    a change and interval in `column` (the quality axis). Rewards live on different scales (CIDEr-D in tens, a
    cosine in hundredths, and a reward can sit near 0 under XE), so x is the reward's own gain in standard errors
    (the gain over its 95% interval's half-width / `Z_95`: beyond noise past ±1.96), its interval likewise; a
    gain whose interval has no width is left out."""
    by_model = {str(r.get("model")): r for r in rows}
    points = []
    for gain in gains:
        model = str(gain.get("model") or gain.get("reward"))
        delta, interval = finite_number(gain.get("delta")), _interval(gain.get("ci"))
        row = by_model.get(model) or by_model.get(f"scst {gain.get('reward')}")
        if row is None or delta is None or interval is None or not interval[1] > interval[0]:
            continue
        quality = forest_rows([row], column)
        if not quality:
            continue
        scale = 2 * Z_95 / (interval[1] - interval[0])
        points.append({"label": str(row.get("model")), "x": delta * scale,
                       "x_ci": (interval[0] * scale, interval[1] * scale),
                       "y": quality[0]["delta"], "y_ci": quality[0]["ci"]})
    for item, label in zip(points, unique_labels([p["label"] for p in points])):
        item["label"] = label
    return points


def _forest(axis: Any, drawn: list[dict[str, Any]], column: str, baseline: str, oracle: str | None,
            seeds: Sequence[Any]) -> None:
    for y, item in enumerate(drawn):
        is_oracle = item["label"] == oracle
        colour = "#b45309" if is_oracle else "#1f4e99"
        axis.plot(item["ci"], [y, y], color=colour, linewidth=2.5, solid_capstyle="butt", alpha=0.55)
        axis.plot([item["delta"]], [y], "D" if is_oracle else "s", color=colour, markersize=6)
        for index, value in enumerate(item["per_seed"] if len(item["per_seed"]) > 1 else []):
            axis.plot([value], [y], "o", markersize=3.5, color=f"C{(index + 2) % 10}", alpha=0.9,
                      label=f"seed {seeds[index]}" if y == 0 and index < len(seeds) else None)
        if is_oracle:
            axis.axvline(item["delta"], color=colour, linestyle=":", linewidth=1.2, label="oracle's gain")
    axis.axvline(0.0, color="black", linewidth=0.8)
    axis.set_yticks(range(len(drawn)), [d["label"] for d in drawn], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel(f"Δ {column} against {baseline} (95% interval)", fontsize=9)
    axis.set_title(f"Change in {column} against {baseline}", fontsize=10)
    handles, labels = axis.get_legend_handles_labels()
    if handles:
        axis.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.16), ncol=4,
                    frameon=False)


def _quadrant(axis: Any, points: list[dict[str, Any]], column: str, oracle: str | None) -> None:
    xs = [p["x_ci"][i] for p in points for i in (0, 1)] + [0.0]
    ys = [p["y_ci"][i] for p in points for i in (0, 1)] + [0.0]
    pad_x = 0.08 * (max(xs) - min(xs) or 1.0)
    pad_y = 0.08 * (max(ys) - min(ys) or 1.0)
    x_range = (min(xs) - pad_x, max(xs) + pad_x)
    y_range = (min(ys) - pad_y, max(ys) + pad_y)
    if x_range[1] > 0 and y_range[0] < 0:  # reward up, quality down: the gaming quadrant
        axis.fill_between([0, x_range[1]], y_range[0], 0, color="#fecaca", alpha=0.6, linewidth=0)
        axis.text(x_range[1], y_range[0], "gamed: reward up,\nquality down ", ha="right", va="bottom",
                  fontsize=8, color="#991b1b")
    if x_range[1] > 0 and y_range[1] > 0:
        axis.fill_between([0, x_range[1]], 0, y_range[1], color="#dcfce7", alpha=0.6, linewidth=0)
        axis.text(x_range[1], y_range[1], "aligned: both up ", ha="right", va="top", fontsize=8, color="#166534")
    for index, point in enumerate(points):
        is_oracle = point["label"] == oracle
        colour = "#b45309" if is_oracle else f"C{index % 10}"
        axis.errorbar([point["x"]], [point["y"]], xerr=[[point["x"] - point["x_ci"][0]], [point["x_ci"][1] - point["x"]]],
                      yerr=[[point["y"] - point["y_ci"][0]], [point["y_ci"][1] - point["y"]]], fmt="D" if is_oracle
                      else "o", color=colour, markersize=5, elinewidth=1, capsize=2)
        axis.annotate(point["label"] + (" (oracle)" if is_oracle else ""), (point["x"], point["y"]),
                      textcoords="offset points", xytext=(4, 4), fontsize=7, color=colour)
    axis.axhline(0.0, color="black", linewidth=0.8)
    axis.axvline(0.0, color="black", linewidth=0.8)
    axis.set_xlim(*x_range)
    axis.set_ylim(*y_range)
    for edge in (-Z_95, Z_95):
        axis.axvline(edge, color="0.5", linestyle=":", linewidth=0.8)
    axis.set_xlabel("own reward's gain in standard errors (dotted: ±1.96, beyond noise; 95% interval)", fontsize=9)
    axis.set_ylabel(f"Δ {column}", fontsize=9)
    axis.set_title(f"Reward gain vs quality gain ({column})", fontsize=10)


@plain_text
def story_figure(rows: Sequence[Mapping[str, Any]], gains: Sequence[Mapping[str, Any]], column: str,
                 baseline: str, oracle: str | None = None, seeds: Sequence[Any] = ()) -> bytes | None:
    """The paper figure: the forest plot of `column` and, when reward gains can be paired with it, the reward-gain
    vs quality-gain plot; None when no row has an interval in `column`."""
    drawn = forest_rows(rows, column)
    if not drawn:
        return None
    points = gain_points(gains, rows, column)
    height = max(2.6, min(4.6, 0.28 * len(drawn) + 1.4))
    panels = 2 if points else 1
    figure, axes = plt.subplots(1, panels, figsize=(6.6 * panels, height), squeeze=False,
                                gridspec_kw={"width_ratios": [1.15, 1.0][:panels]})
    _forest(axes[0][0], drawn, column, baseline, oracle, seeds)
    if points:
        _quadrant(axes[0][1], points, column, oracle)
    figure.tight_layout()
    return png(figure)


def headline_column(rows: Sequence[Mapping[str, Any]], preferred: Sequence[str]) -> str | None:
    """The first of `preferred` that some row has a change and an interval in."""
    for column in preferred:
        if forest_rows(rows, column):
            return column
    return None


def constant_columns(columns: Sequence[str], rows: Sequence[Mapping[str, Any]], printed: Callable[[Any, str], str | None]
                     ) -> tuple[list[str], dict[str, str], list[str]]:
    """(columns shown, {constant column: its printed value}, empty columns): `printed(row, column)` is a cell as
    the table prints it (None: blank). A column printed alike on every row that has a value (two at least) is
    constant (a reader sees one number repeated: `%Incorrect 0.00`); one blank on every row is empty."""
    shown, constant, empty = [], {}, []
    for column in columns:
        cells = [cell for cell in (printed(row, column) for row in rows) if cell not in (None, "", "-")]
        if not cells:
            empty.append(column)
        elif len(cells) > 1 and len(set(cells)) == 1:
            constant[column] = cells[0]
        else:
            shown.append(column)
    return shown, constant, empty
