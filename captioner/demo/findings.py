"""What the demo's run found, from its numbers: paired bootstrap intervals of (SCST − XE) for every column and
for each reward's own value, and plain-language findings derived from those intervals by fixed rules.

Intervals: the table's rows through `eval.system_table.add_intervals` (the images of the test split resampled
with replacement by `eval.correlation.bootstrap`, the same resamples for every row; corpus BLEU-4 recomputed on
each; 95% percentile interval), each reward's own value through `captioner.orchestration.eval_intervals` (the same
resampler and seed, so the same resamples). A difference "holds" when its interval excludes 0; otherwise it is
"within noise". The human row (a held-out reference per image) never enters the SCST-vs-XE rules; one line
compares it with the best SCST model by the judge (`human_finding`). The findings are generated from these rules
only, never written by hand.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from captioner.orchestration.eval_intervals import paired_interval
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
# the learned (and CIDEr-D) columns the human line compares with the judge
LEARNED_COLUMNS = ("C", "CLIP-S", "PAC-S++", "RefCLIP-S", "RefPAC-S++")


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


def paired_intervals(scores: Mapping[str, Any], names: Sequence[str], baseline: str,
                     columns: Mapping[str, tuple[str, float]], n_resamples: int, seed: int
                     ) -> dict[str, dict[str, dict[str, Any]]]:
    """`{name: {"value_ci": {column: [low, high]}, "delta": {column: row − baseline}, "ci": {column: [low, high]}}}`:
    every row's own 95% interval and, for every row but the baseline, its difference with the baseline and the
    paired interval of that difference. The bootstrap is `eval.system_table.add_intervals`'s (the same image
    resamples for every row; corpus BLEU recomputed on each), on `scores[name]` (`RowScores`); `columns` maps a
    column to its metric in the scores and the factor to the column's scale."""
    from eval.system_inputs import HUMAN_ROW
    from eval.system_table import add_intervals

    rows = [{"system": name, "kind": HUMAN_ROW if name == HUMAN_ROW else "system",
             "values": dict(scores[name].values)} for name in names]
    add_intervals(rows, [scores[name] for name in names], [metric for metric, _ in columns.values()], baseline,
                  n_resamples, seed)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        own = row.get("ci", {})
        out[row["system"]] = {"value_ci": {c: [factor * float(v) for v in own[m]] for c, (m, factor) in columns.items()
                                           if m in own}}
        if row["system"] == baseline:
            continue
        delta, ci = row.get("delta", {}), row.get("delta_ci", {})
        both = [(c, m, factor) for c, (m, factor) in columns.items() if m in delta and m in ci]
        out[row["system"]]["delta"] = {c: factor * float(delta[m]) for c, m, factor in both}
        out[row["system"]]["ci"] = {c: [factor * float(v) for v in ci[m]] for c, m, factor in both}
    return out


def add_row_intervals(rows: list[dict[str, Any]], scores: Mapping[str, Any], columns: Mapping[str, tuple[str, float]],
                      n_resamples: int, seed: int) -> None:
    """Set `row["delta"]` (row − XE) and `row["ci"]` (its paired bootstrap 95% interval, `paired_intervals`) on
    every SCST row; the XE and human rows get none (the human row never enters the SCST-vs-XE findings)."""
    from eval.system_inputs import HUMAN_ROW

    names = [row["model"] for row in rows if row["model"] != HUMAN_ROW]
    intervals = paired_intervals(scores, names, BASELINE, columns, n_resamples, seed)
    for row in rows:
        found = intervals.get(row["model"], {})
        if "delta" in found:
            row["delta"], row["ci"] = found["delta"], found["ci"]


def reward_gains(specs: Sequence[str], per_image: Mapping[str, Mapping[str, np.ndarray]], n_resamples: int,
                 seed: int, models: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """For each reward: its own test value under XE and under its SCST model, the difference and its interval.

    `models` maps a reward to the row of its model when that is not `scst_model_name(spec)` (a guarded run)."""
    gains = []
    for spec in specs:
        model = (models or {}).get(spec, scst_model_name(spec))
        xe = reward_values(spec, per_image[BASELINE])
        scst = reward_values(spec, per_image[model])
        interval = paired_interval({"reward": scst}, {"reward": xe}, n_resamples, seed)["reward"]
        gains.append({"reward": spec, "model": model, "xe": float(xe.mean()), "scst": float(scst.mean()),
                      "delta": float(scst.mean() - xe.mean()), "ci": [float(v) for v in interval]})
    return gains


def guarded_model_name(reward: str) -> str:
    """The table's row name of the guarded SCST model of `reward` (KL to XE, coefficient chosen on validation)."""
    return f"scst {reward} +KL"


def guarded_findings(rows: Sequence[Mapping[str, Any]], gains: Sequence[Mapping[str, Any]],
                     choices: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One sentence per guarded reward: did its reward still rise, and did the judge's accuracy stay within noise
    of XE (or rise), next to the unguarded run; with Rep-2 and Length. Generated from the intervals only."""
    by_model = {row["model"]: row for row in rows}
    by_reward = {g["reward"]: g for g in gains}
    out = []
    for reward, choice in choices.items():
        guarded, plain = by_model.get(guarded_model_name(reward)), by_model.get(scst_model_name(reward))
        gain = by_reward.get(reward)
        if guarded is None or gain is None or "ci" not in guarded:
            continue
        tried = ", ".join(choice["val_cider"])
        rose = direction(gain["ci"]) > 0
        judge = direction(guarded["ci"]["Judge-acc"])
        kept = judge >= 0
        parts = [f"{reward} with the KL guard (β = {choice['chosen_kl_coef']:g}, chosen among {tried} by validation "
                 f"CIDEr-D): its reward {'rose' if rose else 'did not rise beyond noise'} "
                 f"({_change(gain['delta'], gain['ci'])}) and judge accuracy "
                 + ("rose" if judge > 0 else "stayed within noise of XE" if judge == 0 else "fell beyond noise")
                 + f" ({_change(guarded['delta']['Judge-acc'], guarded['ci']['Judge-acc'], ' pts')})"]
        if plain is not None and "ci" in plain:
            parts.append(f"against {_change(plain['delta']['Judge-acc'], plain['ci']['Judge-acc'], ' pts')} without "
                         "the guard")
        parts.append(f"Rep-2 {_change(guarded['delta']['Rep-2'], guarded['ci']['Rep-2'])}, Length "
                     f"{_change(guarded['delta']['Length'], guarded['ci']['Length'])} against XE")
        verdict = ("the guard worked: the reward was optimised without being gamed" if rose and kept else
                   "the guard kept the judge but the reward no longer rose beyond noise" if kept else
                   "the guard did not keep the judge's accuracy")
        out.append("; ".join(parts) + f": {verdict}.")
    return out


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


def findings(rows: Sequence[Mapping[str, Any]], gains: Sequence[Mapping[str, Any]],
             versus_human: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """Plain-language findings, one sentence per rule, generated from the intervals (see module doc); with
    `versus_human` (`paired_intervals` against the human row), the line of `human_finding` last."""
    from eval.system_inputs import HUMAN_ROW

    rows = [row for row in rows if row["model"] != HUMAN_ROW]  # SCST-vs-XE rules: captioners only
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
    line = human_finding(rows, versus_human or {})
    if line:
        out.append(line)
    return out


def human_finding(rows: Sequence[Mapping[str, Any]], versus_human: Mapping[str, Mapping[str, Any]]) -> str | None:
    """One sentence on the best SCST model by judge accuracy (first on ties) against the human row: how the judge
    ranks the two (the paired interval of model − human on Judge-acc) and how each learned metric (LEARNED_COLUMNS)
    ranks them (above / below: the interval excludes 0; else within noise). None without SCST rows or intervals."""
    scst = [row for row in rows if row["model"] != BASELINE and row["model"] in versus_human
            and "Judge-acc" in versus_human[row["model"]]["ci"] and row.get("Judge-acc") is not None]
    if not scst:
        return None
    best = max(scst, key=lambda row: row["Judge-acc"])
    name, delta, ci = best["model"], versus_human[best["model"]]["delta"], versus_human[best["model"]]["ci"]
    judge = direction(ci["Judge-acc"])
    verdict = {1: f"ranks {name} above humans", -1: f"ranks humans above {name}", 0: "ranks them level within noise"}
    groups: dict[int, list[str]] = {1: [], -1: [], 0: []}
    for column in LEARNED_COLUMNS:
        if column in ci:
            groups[direction(ci[column])].append(f"{column} ({_change(delta[column], ci[column])})")
    parts = [f"the judge {verdict[judge]} (Judge-acc {_change(delta['Judge-acc'], ci['Judge-acc'], ' pts')})"]
    if groups[1]:
        parts.append(f"{_names(groups[1])} rank {name} above humans")
    if groups[-1]:
        parts.append(f"{_names(groups[-1])} rank humans above {name}")
    if groups[0]:
        parts.append(f"{_names(groups[0])} within noise")
    disagree = (judge < 0 and groups[1]) or (judge > 0 and groups[-1])
    lead = "The learned metrics and the judge disagree on humans: " if disagree else "Humans against the best SCST model: "
    return (f"{lead}{name} (the best SCST model by judge accuracy) against the human row (a held-out reference "
            f"per image; paired 95% intervals of {name} − human): " + "; ".join(parts) + ".")


def _names(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def delta_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], label: str = "Δ vs xe") -> str:
    """Markdown: per row with intervals and column, (row − baseline) and its paired bootstrap 95% interval."""
    lines = [f"| {label} | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
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
