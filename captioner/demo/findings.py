"""What the demo's run found, from its numbers: paired bootstrap intervals of (SCST − XE) for every column and
for each reward's own value, and plain-language findings derived from those intervals by fixed rules.

Intervals: `captioner.orchestration.eval_intervals` (the images of the test split resampled with replacement by
`eval.correlation.bootstrap`; 95% percentile interval). A difference "holds" when its interval excludes 0;
otherwise it is "within noise". The findings are generated from these rules only, never written by hand.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from captioner.orchestration.eval_intervals import add_intervals, paired_interval
from metric.common.errors import InputError
from rewards.registry import parse_reward_spec

BASELINE = "xe"
# reward term -> (table column, factor from the column to the reward's own scale)
REWARD_COLUMNS: dict[str, tuple[str, float]] = {"cider": ("C", 0.01), "clip-s": ("CLIP-S", 1.0),
                                                "pac-s++": ("PAC-S++", 1.0), "ref-clip-s": ("RefCLIP-S", 1.0),
                                                "ref-pac-s++": ("RefPAC-S++", 1.0)}
# columns where an increase means a worse caption (for the "gamed" rule)
DEGENERATE_SIGNS: dict[str, tuple[int, str]] = {"Length": (-1, "shorter captions"),
                                                "Rep-2": (1, "more repeated word pairs"),
                                                "%Incorrect": (1, "more cut-off endings"),
                                                "Halluc.": (1, "more absent shapes named")}


def scst_model_name(spec: str) -> str:
    """The table's row name of the SCST model trained with reward `spec`."""
    return f"scst {spec}"


def reward_values(spec: str, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per-image value of reward `spec` (a mix: the weighted sum of its terms) from a model's per-image columns."""
    total = None
    for name, weight in parse_reward_spec(spec):
        if name not in REWARD_COLUMNS:
            raise InputError(f"scst.rewards: no table column for reward term {name!r} "
                             f"(known: {', '.join(REWARD_COLUMNS)})")
        column, factor = REWARD_COLUMNS[name]
        term = weight * factor * np.asarray(values[column], dtype=np.float64)
        total = term if total is None else total + term
    assert total is not None  # parse_reward_spec never returns no term
    return total


def add_row_intervals(rows: list[dict[str, Any]], per_image: Mapping[str, Mapping[str, np.ndarray]],
                      image_ids: Sequence[str], n_resamples: int, seed: int) -> None:
    """Set `row["delta"]` (row − XE) and `row["ci"]` (its paired bootstrap 95% interval) on every SCST row."""
    keyed = {(name, None): {"image_ids": list(image_ids), "values": dict(values)} for name, values in per_image.items()}
    add_intervals(rows, keyed, baseline=BASELINE, n_resamples=n_resamples, seed=seed)
    base = next(r for r in rows if r["model"] == BASELINE)
    for row in rows:
        if "ci" in row:
            row["delta"] = {c: float(row[c] - base[c]) for c in row["ci"]}


def reward_gains(specs: Sequence[str], per_image: Mapping[str, Mapping[str, np.ndarray]], n_resamples: int,
                 seed: int) -> list[dict[str, Any]]:
    """For each reward: its own test value under XE and under its SCST model, the difference and its interval."""
    gains = []
    for spec in specs:
        xe = reward_values(spec, per_image[BASELINE])
        scst = reward_values(spec, per_image[scst_model_name(spec)])
        interval = paired_interval({"reward": scst}, {"reward": xe}, n_resamples, seed)["reward"]
        gains.append({"reward": spec, "xe": float(xe.mean()), "scst": float(scst.mean()),
                      "delta": float(scst.mean() - xe.mean()), "ci": [float(v) for v in interval]})
    return gains


def direction(interval: Sequence[float]) -> int:
    """+1 when a 95% interval lies above 0, −1 when below, 0 when it contains 0 (within noise)."""
    low, high = interval
    return 1 if low > 0 else -1 if high < 0 else 0


def signed(value: float) -> str:
    """A signed number with 3 significant-ish digits (+12.5, +1.23, +0.012)."""
    size = abs(value)
    return f"{value:+.1f}" if size >= 10 else f"{value:+.2f}" if size >= 1 else f"{value:+.3f}"


def _change(delta: float, interval: Sequence[float], unit: str = "") -> str:
    return f"{signed(delta)}{unit} [{signed(interval[0])}, {signed(interval[1])}]"


def findings(rows: Sequence[Mapping[str, Any]], gains: Sequence[Mapping[str, Any]]) -> list[str]:
    """Plain-language findings, one sentence per rule, generated from the intervals (see module doc)."""
    by_model = {row["model"]: row for row in rows}
    out: list[str] = []
    learned = [g["reward"] for g in gains if direction(g["ci"]) > 0]
    flat = [g["reward"] for g in gains if direction(g["ci"]) <= 0]
    if gains:
        sentence = (f"SCST raised its own reward on the test split (95% interval above 0) for "
                    f"{_names(learned)}" if learned else "SCST raised no reward on the test split beyond noise")
        out.append(sentence + (f"; not for {_names(flat)}." if flat and learned else "."))
    helped, hurt, same = [], [], []
    for gain in gains:
        row = by_model.get(scst_model_name(gain["reward"]), {})
        if "Judge-acc" not in row.get("ci", {}):
            continue
        text = f"{gain['reward']} ({_change(row['delta']['Judge-acc'], row['ci']['Judge-acc'], ' pts')})"
        {1: helped, -1: hurt, 0: same}[direction(row["ci"]["Judge-acc"])].append(text)
    if helped:
        out.append(f"Judge accuracy rose beyond noise under {_names(helped)}.")
    if hurt:
        out.append(f"Judge accuracy fell beyond noise under {_names(hurt)}.")
    if same:
        out.append(f"Judge accuracy changed within noise under {_names(same)}.")
    for gain in gains:
        row = by_model.get(scst_model_name(gain["reward"]), {})
        ci = row.get("ci", {})
        if direction(gain["ci"]) <= 0 or "Judge-acc" not in ci or direction(ci["Judge-acc"]) > 0:
            continue
        signs = [f"{label} ({_change(row['delta'][column], ci[column])} {column})"
                 for column, (sign, label) in DEGENERATE_SIGNS.items()
                 if column in ci and direction(ci[column]) == sign]
        if signs:
            out.append(f"{gain['reward']} was gamed: its reward rose ({_change(gain['delta'], gain['ci'])}) while "
                       f"judge accuracy did not, with {_names(signs)}.")
    for row in rows:
        ci = row.get("ci")
        if ci:
            noise = [c for c, interval in ci.items() if direction(interval) == 0]
            if noise:
                out.append(f"{row['model']}: within noise against XE: {', '.join(noise)}".rstrip(".") + ".")
    return out


def _names(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def delta_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Markdown: per SCST row and column, (row − XE) and its paired bootstrap 95% interval."""
    lines = ["| Δ vs xe | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row in rows:
        if row.get("ci"):
            cells = [_change(row["delta"][c], row["ci"][c]) if c in row["ci"] else "" for c in columns]
            lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def gains_table(gains: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: each reward's own test value under XE and under its SCST model, with the interval of the gain."""
    lines = ["| reward | xe | scst | Δ [95% interval] |", "|---|---|---|---|"]
    lines += [f"| {g['reward']} | {g['xe']:.4f} | {g['scst']:.4f} | {_change(g['delta'], g['ci'])} |" for g in gains]
    return "\n".join(lines) + "\n"
