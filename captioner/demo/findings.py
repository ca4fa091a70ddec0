"""What the demo's run found, from its numbers: paired bootstrap intervals of (SCST − XE) for every column and
for each reward's own value, and plain-language findings derived from those intervals by fixed rules.

Intervals: the table's rows through `eval.system_table.add_intervals` (the images of the test split resampled
with replacement by `eval.correlation.bootstrap`, the same resamples for every row; corpus BLEU-4 recomputed on
each; 95% percentile interval), each reward's own value through `captioner.orchestration.eval_intervals` (the same
resampler and seed, so the same resamples). A difference "holds" when its interval excludes 0; otherwise it is
"within noise". The human row (a held-out reference per image) never enters the SCST-vs-XE rules; one line
compares it with the best SCST model by the judge (`human_finding`). The findings are generated from these rules
only, never written by hand.

Over several seeds a claim's verdict is the pooled interval's (seeds and images, `captioner.demo.seeds`); it is
"seed-dependent" instead when the seeds disagree beyond noise, one seed's own interval above 0 and another's below
on a difference the claim rests on (`opposed_seeds`). A seed whose own interval merely contains 0 does not make a
claim seed-dependent: with a few seeds that is what a true effect near the size of the noise shows, and which
side of 0 each seed's bound lands on moves with float rounding (another machine, another thread count). The
"gamed" claims are stated only where they hold.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from captioner.demo import judge_reward  # noqa: F401  (registers the oracle reward `judge`)
from metric.common.errors import InputError
from rewards.registry import parse_reward_spec

BASELINE = "xe"
# reward term -> (table column, factor from the column to the reward's own scale)
REWARD_COLUMNS: dict[str, tuple[str, float]] = {"cider": ("C", 0.01), "clip-s": ("CLIP-S", 1.0),
                                                "pac-s++": ("PAC-S++", 1.0), "ref-clip-s": ("RefCLIP-S", 1.0),
                                                "ref-pac-s++": ("RefPAC-S++", 1.0),
                                                "judge": ("Judge", 0.01)}
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


def guarded_model_name(reward: str) -> str:
    """The table's row name of the guarded SCST model of `reward` (KL to XE, coefficient chosen on validation)."""
    return f"scst {reward} +KL"


FLOAT_NOISE = 1e-5
"""An interval bound this close to 0 counts as 0: two models' identical captions scored in batches of another
composition (another process count, another CPU) differ by float rounding (up to ~4e-6 measured on the smoke
preset, 1 vs 2 processes), not by anything a claim is about."""


def direction(interval: Sequence[float]) -> int:
    """+1 when a 95% interval lies above 0, −1 when below, 0 when it contains 0 (within noise); a bound within
    `FLOAT_NOISE` of 0 counts as 0."""
    low, high = interval
    return 1 if low > FLOAT_NOISE else -1 if high < -FLOAT_NOISE else 0


def signed(value: float) -> str:
    """A signed number with 3 significant-ish digits (+12.5, +1.23, +0.012); one that rounds to 0 is +0.000."""
    size = abs(value)
    text = f"{value:+.1f}" if size >= 10 else f"{value:+.2f}" if size >= 1 else f"{value:+.3f}"
    return "+" + text[1:] if text.startswith("-") and float(text) == 0 else text


def _change(delta: float, interval: Sequence[float], unit: str = "") -> str:
    return f"{signed(delta)}{unit} [{signed(interval[0])}, {signed(interval[1])}]"


SEED_DEPENDENT = "seed-dependent"
"""`holds` of a claim whose seeds disagree beyond noise (`opposed_seeds`): never stated as a result."""
JUDGE = "Judge-acc"
CLAIM_REWARD_RISES = "its own reward rises beyond noise"
CLAIM_JUDGE = {1: "judge accuracy rises beyond noise", -1: "judge accuracy falls beyond noise",
               0: "judge accuracy stays within noise"}
CLAIM_GUARD = "the KL guard keeps judge accuracy while its reward rises"
CLAIM_FLAT_REWARD = "its SCST reward had no spread for most steps, so no guard claim is made"
CLAIM_HUMAN = {1: "ranks it above humans", -1: "ranks humans above it", 0: "ranks it level with humans within noise"}
FLAT_SHARE = 0.5
"""A run whose reward spread (`reward_std` of the SCST log) was 0 on more than this share of its steps never gets
a "guard worked" claim: its reward gave SCST nothing to follow."""
REWARD = "reward"
"""The label of a model's own-reward gain among a claim's differences."""


def gamed_claim(column: str) -> str:
    """The fixed phrase of the "gamed" rule for one degenerate column."""
    return f"is gamed: its reward rises while judge accuracy does not, with {DEGENERATE_SIGNS[column][1]}"


@dataclass(frozen=True)
class Rule:
    """One claim: its verdict on a view, its reported interval, and the differences it rests on."""

    subject: str
    claim: str
    predicate: Callable[[Mapping[str, Any]], bool | None]  # the claim's verdict on a view (None: not available)
    interval: Callable[[Mapping[str, Any]], tuple[str, dict[str, Any], str]]  # (column, estimate, unit) to report
    differences: Callable[[Mapping[str, Any]], dict[str, int | None]]  # label -> `direction` of each difference
    only_when_holds: bool = False  # stated only when it holds, never as "does not hold" (the "gamed" rules)


def opposed_seeds(directions: Mapping[str, Mapping[str, int | None]]) -> dict[str, dict[str, list[str]]]:
    """The differences on which the seeds disagree beyond noise (`directions[seed][label]`): some seed's own
    interval lies above 0 and another's below (a qualitative interaction between seed and effect, Gail & Simon
    1985), as `{label: {"up": seeds, "down": seeds}}`. A seed whose interval merely contains 0 opposes nothing: it
    is what every seed shows near a boundary, and which side of the boundary it lands on is float rounding."""
    labels = dict.fromkeys(label for seed in directions.values() for label in seed)
    out = {}
    for label in labels:
        up = [seed for seed, found in directions.items() if found.get(label) == 1]
        down = [seed for seed, found in directions.items() if found.get(label) == -1]
        if up and down:
            out[label] = {"up": up, "down": down}
    return out


def finding_records(pooled: Mapping[str, Any], per_seed: Mapping[str, Mapping[str, Any]],
                    guarded: Mapping[str, str] | None = None,
                    flat_steps: Mapping[str, Mapping[str, float]] | None = None) -> list[dict[str, Any]]:
    """The findings as records `{subject, claim, holds, interval, seeds, text}` (plus `opposed` when seed-dependent),
    each from the intervals of the views (`captioner.demo.seeds.SeedEvidence.view`: `pooled` over every seed,
    `per_seed[seed]` each seed's own).

    `holds` is the pooled interval's verdict (over seeds and images), or "seed-dependent" when the seeds disagree
    beyond noise on a difference the claim rests on (`opposed_seeds`); `seeds` keeps each seed's own verdict.
    `guarded` maps each guarded reward to its row; `flat_steps[reward][seed]` is the share of its guarded
    run's SCST steps whose reward spread was 0 (above `FLAT_SHARE` in a seed: no guard claim, `CLAIM_FLAT_REWARD`).
    """
    records = []
    for rule in _rules(pooled, guarded or {}, flat_steps or {}):
        holds = rule.predicate(pooled)
        if holds is None or (rule.only_when_holds and not holds):
            continue
        seeds = {seed: rule.predicate(view) for seed, view in per_seed.items()}
        opposed = opposed_seeds({seed: rule.differences(view) for seed, view in per_seed.items()})
        column, estimate, unit = rule.interval(pooled)
        record: dict[str, Any] = {
            "subject": rule.subject, "claim": rule.claim,
            "holds": SEED_DEPENDENT if opposed else bool(holds),
            "interval": {"column": column, "point": estimate["point"], "low": estimate["ci"][0],
                         "high": estimate["ci"][1], "unit": unit, "per_seed": estimate.get("per_seed", [])},
            "seeds": {str(seed): value for seed, value in seeds.items()}}
        if opposed:
            record["opposed"] = opposed
        share = pooled.get("share_of_oracle", {}).get(rule.subject)
        if rule.claim in CLAIM_JUDGE.values() and share is not None:
            record["share_of_oracle"] = share
        record["text"] = render_finding(record)
        records.append(record)
    return records


def _gain_of(view: Mapping[str, Any], model: str) -> Mapping[str, Any] | None:
    return next((g for g in view["gains"] if g["model"] == model), None)


def _row_ci(view: Mapping[str, Any], model: str, column: str, versus_human: bool = False) -> Sequence[float] | None:
    entry = view["rows"].get(model, {})
    source = entry.get("versus_human", {}) if versus_human else entry
    return (source.get("ci") or {}).get(column)


def _directions(view: Mapping[str, Any], model: str, columns: Sequence[str], gain: bool = False,
                versus_human: bool = False) -> dict[str, int | None]:
    """`direction` of `model`'s own-reward gain (`gain`) and of its difference in each of `columns`."""
    out: dict[str, int | None] = {}
    if gain:
        found = _gain_of(view, model)
        out[REWARD] = None if found is None else direction(found["ci"])
    for column in columns:
        ci = _row_ci(view, model, column, versus_human)
        out[column] = None if ci is None else direction(ci)
    return out


def _delta_estimate(model: str, column: str, versus_human: bool = False):
    def interval(view: Mapping[str, Any]) -> tuple[str, dict[str, Any], str]:
        entry = view["rows"][model]
        source = entry["versus_human"] if versus_human else entry
        return column, {"point": source["delta"][column], "ci": source["ci"][column],
                        "per_seed": source["delta_per_seed"].get(column, [])}, " pts" if column == JUDGE else ""
    return interval


def _gain_interval(model: str):
    def interval(view: Mapping[str, Any]) -> tuple[str, dict[str, Any], str]:
        found = _gain_of(view, model)
        return REWARD, {"point": found["delta"], "ci": found["ci"], "per_seed": found["per_seed"]}, ""
    return interval


def _rules(pooled: Mapping[str, Any], guarded: Mapping[str, str], flat: Mapping[str, Mapping[str, float]]
           ) -> list[Rule]:
    """Every rule, the claims fixed from the pooled view."""
    rows, gains = pooled["rows"], pooled["gains"]
    rules: list[Rule] = []
    for gain in gains:  # 1. each reward rose on its own scale
        model = gain["model"]

        def rises(view, model=model):
            found = _gain_of(view, model)
            return None if found is None else direction(found["ci"]) > 0
        rules.append(Rule(model, CLAIM_REWARD_RISES, rises, _gain_interval(model),
                          lambda view, model=model: _directions(view, model, [], gain=True)))
    for model, entry in rows.items():  # 2. judge accuracy against XE, every SCST row (the oracle's included)
        if JUDGE not in (entry.get("ci") or {}):
            continue
        way = direction(entry["ci"][JUDGE])

        def judge_way(view, model=model, way=way):
            ci = _row_ci(view, model, JUDGE)
            return None if ci is None else direction(ci) == way
        rules.append(Rule(model, CLAIM_JUDGE[way], judge_way, _delta_estimate(model, JUDGE),
                          lambda view, model=model: _directions(view, model, [JUDGE])))
    oracle = pooled.get("oracle")
    for gain in gains:  # 3. gamed: the reward rose, the judge did not, with a degenerate signature
        if gain["model"] == oracle:
            continue
        for column, (sign, _) in DEGENERATE_SIGNS.items():
            if column not in (rows.get(gain["model"], {}).get("ci") or {}):
                continue

            def gamed(view, model=gain["model"], column=column, sign=sign):
                found = _directions(view, model, [JUDGE, column], gain=True)
                if None in found.values():
                    return None
                return found[REWARD] > 0 and found[JUDGE] <= 0 and found[column] == sign
            rules.append(Rule(gain["model"], gamed_claim(column), gamed, _delta_estimate(gain["model"], column),
                              lambda view, model=gain["model"], column=column:
                              _directions(view, model, [JUDGE, column], gain=True), only_when_holds=True))
    for reward, model in guarded.items():  # 4. the guard kept the judge while the reward rose
        if model not in rows or JUDGE not in (rows[model].get("ci") or {}):
            continue
        shares = flat.get(reward, {})
        if any(share > FLAT_SHARE for share in shares.values()):
            worst = max(shares.values())
            rules.append(Rule(model, CLAIM_FLAT_REWARD, lambda view: True,
                              lambda view, worst=worst: ("steps with reward spread 0",
                                                         {"point": 100.0 * worst, "ci": [100.0 * worst] * 2}, " %"),
                              lambda view: {}))
            continue

        def guard_worked(view, model=model):
            found = _directions(view, model, [JUDGE], gain=True)
            if None in found.values():
                return None
            return found[REWARD] > 0 and found[JUDGE] >= 0
        rules.append(Rule(model, CLAIM_GUARD, guard_worked, _delta_estimate(model, JUDGE),
                          lambda view, model=model: _directions(view, model, [JUDGE], gain=True)))
    human = pooled.get("human")
    candidates = [m for m, e in rows.items() if m not in (BASELINE, human) and JUDGE in (e.get("value") or {})
                  and JUDGE in (e.get("versus_human", {}).get("ci") or {})]
    if human and candidates:  # 5. the best SCST model by judge accuracy against humans, by the judge and each metric
        best = max(candidates, key=lambda m: rows[m]["value"][JUDGE])
        for column in (JUDGE, *LEARNED_COLUMNS):
            ci = (rows[best]["versus_human"].get("ci") or {}).get(column)
            if ci is None:
                continue
            way = direction(ci)
            judge_or_metric = "the judge" if column == JUDGE else column

            def ranks(view, column=column, way=way, model=best):
                found = _row_ci(view, model, column, versus_human=True)
                return None if found is None else direction(found) == way
            rules.append(Rule(f"{best} vs human", f"{judge_or_metric} {CLAIM_HUMAN[way]}", ranks,
                              _delta_estimate(best, column, versus_human=True),
                              lambda view, column=column, model=best:
                              _directions(view, model, [column], versus_human=True)))
    return rules


def render_finding(record: Mapping[str, Any]) -> str:
    """The printed sentence of a finding record: subject, claim, its status, the interval and each seed's value."""
    interval = record["interval"]
    status = {True: "", False: " — does not hold"}.get(record["holds"]) if record["holds"] in (True, False) else None
    if status is None and "opposed" in record:
        status = f" — {SEED_DEPENDENT}: " + "; ".join(
            f"{label} rises beyond noise for {_seed_names(ways['up'])} and falls for {_seed_names(ways['down'])}"
            for label, ways in record["opposed"].items())
    elif status is None:  # a record of pacs 0.6 (seed-dependent: the seeds' own verdicts differed)
        held = [seed for seed, value in record["seeds"].items() if value]
        failed = [seed for seed, value in record["seeds"].items() if value is False]
        status = f" — {SEED_DEPENDENT}: holds for {_seed_names(held)}, not for {_seed_names(failed)}"
    unit = interval.get("unit", "")
    numbers = (f"{interval['column']} {signed(interval['point'])}{unit} [{signed(interval['low'])}, "
               f"{signed(interval['high'])}]")
    per_seed = interval.get("per_seed") or []
    if len(per_seed) > 1:
        numbers += "; per seed " + ", ".join(f"{seed}: {signed(value)}"
                                             for seed, value in zip(record["seeds"], per_seed))
    share = record.get("share_of_oracle")
    if share is not None:
        numbers += (f"; {100 * share['point']:.0f}% of the oracle's gain [{100 * share['interval'][0]:.0f}%, "
                    f"{100 * share['interval'][1]:.0f}%]")
    return f"{record['subject']}: {record['claim']}{status} ({numbers})."


def _seed_names(seeds: Sequence[str]) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}"


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
    """Markdown: each SCST model's own reward on the test split under XE and under that model, with the interval of
    the gain (the model column tells apart two runs of one reward, e.g. a mix summed and normalised)."""
    lines = ["| model | reward | xe | scst | Δ [95% interval] |", "|---|---|---|---|---|"]
    lines += [f"| {g.get('model', '')} | {g['reward']} | {g['xe']:.4f} | {g['scst']:.4f} | "
              f"{_change(g['delta'], g['ci'])} |" for g in gains]
    return "\n".join(lines) + "\n"


def finding_text(finding: Any) -> str:
    """The printed line of a finding: a record's `render_finding`, or the sentence itself (results.json written
    before the findings were records)."""
    return render_finding(finding) if isinstance(finding, Mapping) else str(finding)


def seed_table(rows: Sequence[Mapping[str, Any]], seeds: Sequence[int], column: str) -> str:
    """Markdown: every row's `column` per seed, and its aggregate over seeds with the 95% interval."""
    lines = [f"| model | {column} [95% interval] | " + " | ".join(f"seed {s}" for s in seeds) + " |",
             "|---|---|" + "---|" * len(seeds)]
    for row in rows:
        per_seed = (row.get("per_seed") or {}).get(column)
        interval = (row.get("value_ci") or {}).get(column)
        if per_seed is None or interval is None:
            continue
        lines.append(f"| {row['model']} | {row[column]:.2f} [{interval[0]:.2f}, {interval[1]:.2f}] | "
                     + " | ".join(f"{value:.2f}" for value in per_seed) + " |")
    return "\n".join(lines) + "\n"


def share_table(shares: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: each model's Judge-acc change against XE as a percentage of the oracle's, with its interval."""
    lines = ["| model | share of the oracle's gain [95% interval] | per seed |", "|---|---|---|"]
    lines += [f"| {model} | {100 * s['point']:.0f}% [{100 * s['interval'][0]:.0f}%, {100 * s['interval'][1]:.0f}%] | "
              + ", ".join(f"{100 * v:.0f}%" for v in s.get("per_seed", [])) + " |" for model, s in shares.items()]
    return "\n".join(lines) + "\n"
