"""What the demo's run found, from its numbers: paired bootstrap intervals of (SCST − XE) for every column and
for each reward's own value, and plain-language findings derived from those intervals by fixed rules.

Intervals: the table's rows through `pacs.eval.system_table.add_table_intervals` (the images of the test split
resampled with replacement by `pacs.eval.intervals.bootstrap`, the same resamples for every row; corpus BLEU-4 recomputed on
each; 95% percentile interval), each reward's own value through `pacs.captioner.orchestration.eval_intervals` (the same
resampler and seed, so the same resamples). A difference "holds" when its interval excludes 0; otherwise it is
"within noise". The human row (a held-out reference per image) never enters the SCST-vs-XE rules; one line
compares it with the best SCST model by the judge (`human_finding`). The findings are generated from these rules
only, never written by hand.

Over several seeds a claim's verdict is the pooled interval's (seeds and images, `pacs.captioner.orchestration.seed_evidence`); it is
"seed-dependent" instead when the seeds disagree beyond noise, one seed's own interval above 0 and another's below
on a difference the claim rests on (`opposed_seeds`). A seed whose own interval merely contains 0 does not make a
claim seed-dependent: with a few seeds that is what a true effect near the size of the noise shows, and which
side of 0 each seed's bound lands on moves with float rounding (another machine, another thread count). The
"gamed" claims are stated only where they hold.

Every verdict that is not seed-dependent also says how likely an independent replication of the experiment
(another machine, other seeds; the same design) would reach it (`replication_probabilities`, `Rule.replication`):
with three seeds many claims rest on effects about the size of their noise, and those are printed as fragile.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pacs.captioner.orchestration.guard_choice import COMBINATION, GUARDS
from pacs.eval.finding_claims import (  # the claim vocabulary, shared with the report
    CLAIM_FLAT_REWARD,
    CLAIM_GUARD,
    CLAIM_HUMAN,
    CLAIM_INERT,
    CLAIM_JUDGE,
    CLAIM_REWARD_RISES,
    DEGENERATE_SIGNS,
    FRAGILE,
    GUARD_PROMISE,
    HUMAN_SUBJECT,
    JUDGE,
    REWARD,
    SEED_DEPENDENT,
    gamed_claim,
)
from pacs.metric.common.errors import InputError
from pacs.rewards.registry import parse_reward_spec

BASELINE = "xe"
# reward term -> (table column, factor from the column to the reward's own scale)
REWARD_COLUMNS: dict[str, tuple[str, float]] = {"cider": ("C", 0.01), "clip-s": ("CLIP-S", 1.0),
                                                "pac-s++": ("PAC-S++", 1.0), "ref-clip-s": ("RefCLIP-S", 1.0),
                                                "ref-pac-s++": ("RefPAC-S++", 1.0),
                                                "judge": ("Judge", 0.01)}
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


def guard_claim(model: str) -> str:
    """The "guard worked" claim of a guarded row (`CLAIM_GUARD` for the KL row `scst <reward> +KL`; the row
    `scst <reward> +length mask` claims "the length mask guard keeps ...", `+guards` "the combination of guards
    ...")."""
    guard = model.rsplit(" +", 1)[-1]
    if guard == "KL":
        return CLAIM_GUARD
    return ("the combination of guards" if guard == COMBINATION else f"the {guard} guard") + GUARD_PROMISE


GUARD_CLAIMS = frozenset(guard_claim(f"x +{row}") for row in (*(g.row for g in GUARDS.values()), COMBINATION))
"""Every guard's "guard worked" claim (the rows of `pacs.captioner.orchestration.guard_choice.GUARDS`): its finding also
gives the row's Judge-acc change as a share of the oracle's."""


FLOAT_NOISE = 1e-5
"""An interval bound this close to 0 counts as 0: two models' identical captions scored in batches of another
composition (another process count, another CPU) differ by float rounding (up to ~4e-6 measured on the smoke
preset, 1 vs 2 processes), not by anything a claim is about."""


def direction(interval: Sequence[float]) -> int:
    """+1 when a 95% interval lies above 0, −1 when below, 0 when it contains 0 (within noise); a bound within
    `FLOAT_NOISE` of 0 counts as 0."""
    low, high = interval
    return 1 if low > FLOAT_NOISE else -1 if high < -FLOAT_NOISE else 0


LEVEL = 0.95
"""The level of every interval the rules read (the bootstrap's, `results.json["bootstrap"]["level"]`)."""
Estimate = tuple[float, Sequence[float]]
"""A difference's point estimate and its interval."""
REPLICATION_METHOD = ("predictive probability of the same verdict in an independent replication of the same design: "
                      "N(point, 2 se^2), se from the interval's side facing 0 times sqrt(n/(n-1)) for n seeds, "
                      "differences independent")


def seed_inflation(seeds: int) -> float:
    """√(n / (n − 1)) for n ≥ 2 seeds (the bootstrap over n seeds underestimates their variance by (n − 1)/n), 1
    for one seed (its images, hundreds of them, are the resampled units)."""
    return float(np.sqrt(seeds / (seeds - 1))) if seeds >= 2 else 1.0


def projected_seeds(seeds: int) -> tuple[int, ...]:
    """The seed counts a run's replication outlook is projected to: its own, 2, 4 and 8 times it."""
    return (seeds, 2 * seeds, 4 * seeds, 8 * seeds)


def replication_probabilities(point: float, interval: Sequence[float], level: float = LEVEL,
                              scale: float | None = None, inflation: float = 1.0) -> dict[int, float]:
    """The probability of each `direction` (+1, −1, 0) that an independent replication of the experiment would find
    for a difference estimated at `point` with the `level` interval `interval`: the predictive distribution of the
    replication's estimate, N(point, 2·se²) (flat prior on the true difference, the replication's own error on
    top: Killeen 2005's p_rep), judged by an interval of the same width (±z·se). `se` is read from the interval's
    side facing 0 (percentile intervals are not symmetric); a degenerate interval (se 0) repeats its direction.
    With `scale`, a larger design instead, taking the true difference to be `point`: N(point, se′²), se′ = se /
    scale (√(seeds′ / seeds) for more seeds), judged by ±z·se′. `inflation` multiplies se first: the bootstrap's
    variance of a mean of n resampled units is (n − 1)/n of the unbiased one, so n seeds call for √(n / (n − 1))
    (`seed_inflation`)."""
    from scipy.stats import norm

    z_level = float(norm.ppf(0.5 + level / 2))
    low, high = interval
    se = (point - low if point >= 0 else high - point) / z_level * inflation
    if not se > 0:
        return {way: float(way == direction(interval)) for way in (1, -1, 0)}
    z, spread = (point / se, np.sqrt(2)) if scale is None else (point / (se / scale), 1.0)
    up = float(norm.cdf((z - z_level) / spread))
    down = float(norm.cdf((-z - z_level) / spread))
    return {1: up, -1: down, 0: max(0.0, 1.0 - up - down)}


def signed(value: float) -> str:
    """A signed number with 3 significant-ish digits (+12.5, +1.23, +0.012); one that rounds to 0 is +0.000."""
    size = abs(value)
    text = f"{value:+.1f}" if size >= 10 else f"{value:+.2f}" if size >= 1 else f"{value:+.3f}"
    return "+" + text[1:] if text.startswith("-") and float(text) == 0 else text


def _change(delta: float, interval: Sequence[float], unit: str = "") -> str:
    return f"{signed(delta)}{unit} [{signed(interval[0])}, {signed(interval[1])}]"


FLAT_SHARE = 0.5
"""A run whose reward spread (`reward_std` of the SCST log) was 0 on more than this share of its steps never gets
a "guard worked" claim: its reward gave SCST nothing to follow."""


@dataclass(frozen=True)
class Rule:
    """One claim: the differences it rests on with the directions each must take for it to hold, and the interval
    it reports."""

    subject: str
    claim: str
    estimates: Callable[[Mapping[str, Any]], dict[str, Estimate | None]]  # label -> (point, interval) on a view
    allowed: Mapping[str, frozenset[int]]  # label -> the `direction`s under which the claim holds
    interval: Callable[[Mapping[str, Any]], tuple[str, dict[str, Any], str]]  # (column, estimate, unit) to report
    only_when_holds: bool = False  # stated only when it holds, never as "does not hold" (the "gamed" rules)
    model: str | None = None  # the row a claim with a fixed subject is about (the human-row claims)

    def directions(self, view: Mapping[str, Any]) -> dict[str, int | None]:
        """`direction` of each difference the claim rests on (None: not in this view)."""
        return {label: None if found is None else direction(found[1]) for label, found in self.estimates(view).items()}

    def holds(self, view: Mapping[str, Any]) -> bool | None:
        """The claim's verdict on a view: every difference in an allowed direction (None: one is not available)."""
        found = self.directions(view)
        if None in found.values():
            return None
        return all(found[label] in allowed for label, allowed in self.allowed.items())

    def replication(self, view: Mapping[str, Any], level: float = LEVEL, scale: float | None = None,
                    inflation: float = 1.0) -> float | None:
        """The probability that an independent replication of the experiment (same design: seeds, images,
        resamples; `scale`: a larger one, `replication_probabilities`) finds the claim holding (the differences
        taken as independent); None where a difference is not in the view."""
        found = self.estimates(view)
        if None in found.values():
            return None
        probability = 1.0
        for label, allowed in self.allowed.items():
            point, interval = found[label]
            ways = replication_probabilities(point, interval, level, scale, inflation)
            probability *= sum(ways[way] for way in allowed)
        return probability


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
                    flat_steps: Mapping[str, Mapping[str, float]] | None = None,
                    level: float = LEVEL, inert: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The findings as records `{subject, claim, holds, interval, seeds, text}` (plus `opposed` when seed-dependent),
    each from the intervals of the views (`pacs.captioner.orchestration.seed_evidence.SeedEvidence.view`: `pooled` over every seed,
    `per_seed[seed]` each seed's own).

    `holds` is the pooled interval's verdict (over seeds and images), or "seed-dependent" when the seeds disagree
    beyond noise on a difference the claim rests on (`opposed_seeds`); `seeds` keeps each seed's own verdict.
    `guarded` maps each guarded reward to its row; `flat_steps[reward][seed]` is the share of its guarded
    run's SCST steps whose reward spread was 0 (above `FLAT_SHARE` in a seed: no guard claim, `CLAIM_FLAT_REWARD`);
    `inert` the guarded rows whose test captions are their unguarded row's in every seed (the guard never acted,
    e.g. an early stop that never fired: no guard claim, `CLAIM_INERT`, which would only restate the unguarded row).
    `replication.agrees` is the probability that an independent replication of the experiment reaches the same
    verdict (`Rule.replication`; not given for a seed-dependent claim); below `FRAGILE` the claim prints as fragile.
    """
    records = []
    inflation = seed_inflation(len(per_seed))
    for rule in _rules(pooled, guarded or {}, flat_steps or {}, inert or {}):
        holds = rule.holds(pooled)
        if holds is None or (rule.only_when_holds and not holds):
            continue
        seeds = {seed: rule.holds(view) for seed, view in per_seed.items()}
        opposed = opposed_seeds({seed: rule.directions(view) for seed, view in per_seed.items()})
        column, estimate, unit = rule.interval(pooled)
        record: dict[str, Any] = {
            "subject": rule.subject, "claim": rule.claim,
            "holds": SEED_DEPENDENT if opposed else bool(holds),
            "interval": {"column": column, "point": estimate["point"], "low": estimate["ci"][0],
                         "high": estimate["ci"][1], "unit": unit, "per_seed": estimate.get("per_seed", [])},
            "seeds": {str(seed): value for seed, value in seeds.items()}}
        if rule.model is not None:
            record["model"] = rule.model
        if opposed:
            record["opposed"] = opposed
        else:  # how likely an independent replication (another machine, other seeds) reaches the same verdict
            record["replication"] = {
                "agrees": _agreement(rule, pooled, holds, level, inflation), "method": REPLICATION_METHOD,
                "two_replications_with_seeds": {
                    str(n): _two_replications_agree(rule, pooled, level, np.sqrt(n / len(per_seed)), inflation)
                    for n in projected_seeds(len(per_seed))}}
        share = pooled.get("share_of_oracle", {}).get(rule.subject)
        if (rule.claim in CLAIM_JUDGE.values() or rule.claim in GUARD_CLAIMS) and share is not None:
            record["share_of_oracle"] = share
        record["text"] = render_finding(record)
        records.append(record)
    return records


def _agreement(rule: Rule, view: Mapping[str, Any], holds: bool, level: float, inflation: float) -> float:
    chance = rule.replication(view, level, inflation=inflation)
    assert chance is not None  # the rule's verdict on this view exists
    return chance if holds else 1.0 - chance


def _two_replications_agree(rule: Rule, view: Mapping[str, Any], level: float, scale: float,
                            inflation: float) -> float:
    """The probability that two independent replications of a design `scale`² times as large reach the same verdict
    on the claim, if the true differences were the estimated ones."""
    chance = rule.replication(view, level, scale, inflation)
    assert chance is not None
    return chance ** 2 + (1.0 - chance) ** 2


def replication_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How reproducible the set of findings is: the expected number of claims an independent replication of the
    same design would decide otherwise (the sum of 1 − `agrees`), the probability that it reproduces every verdict
    (their product, claims taken as independent), the fragile claims (`agrees` below `FRAGILE`), and for designs
    with more seeds the same for two replications of that design, were the true differences the estimated ones.
    Seed-dependent claims are counted apart."""
    rated = [r for r in records if "replication" in r]
    projected = dict.fromkeys(key for r in rated for key in r["replication"].get("two_replications_with_seeds", {}))

    def outlook(agrees: list[float]) -> dict[str, float]:
        return {"expected_disagreements": float(sum(1.0 - a for a in agrees)), "all_agree": float(np.prod(agrees))}
    summary = {**outlook([r["replication"]["agrees"] for r in rated]),
               "two_replications_with_seeds": {
                   n: outlook([r["replication"]["two_replications_with_seeds"][n] for r in rated]) for n in projected},
               "fragile": [f"{r['subject']}: {r['claim']}" for r in rated if r["replication"]["agrees"] < FRAGILE],
               "seed_dependent": sum(1 for r in records if r["holds"] == SEED_DEPENDENT),
               "claims": len(records), "fragile_below": FRAGILE, "method": REPLICATION_METHOD}
    return {**summary, "text": replication_text(summary)}


def replication_text(summary: Mapping[str, Any]) -> str:
    """The printed paragraph of `replication_summary`."""
    projected = "; ".join(f"{n} seeds {o['expected_disagreements']:.1f} (all alike: {o['all_agree']:.2f})"
                          for n, o in summary.get("two_replications_with_seeds", {}).items())
    return (f"How reproducible these findings are: an independent replication of this design (another machine, "
            f"other seeds) would decide about {summary['expected_disagreements']:.1f} of the "
            f"{summary['claims']} claims otherwise (all alike with probability {summary['all_agree']:.2f}); "
            f"{len(summary['fragile'])} are fragile (a replication agrees with probability below "
            f"{summary['fragile_below']:g}). Two replications would decide otherwise about, were the true "
            f"differences the estimated ones: {projected}.\n")


def _gain_of(view: Mapping[str, Any], model: str) -> Mapping[str, Any] | None:
    return next((g for g in view["gains"] if g["model"] == model), None)


def _estimates(view: Mapping[str, Any], model: str, columns: Sequence[str], gain: bool = False,
               versus_human: bool = False) -> dict[str, Estimate | None]:
    """(point, interval) of `model`'s own-reward gain (`gain`) and of its difference in each of `columns`."""
    out: dict[str, Estimate | None] = {}
    if gain:
        found = _gain_of(view, model)
        out[REWARD] = None if found is None else (found["delta"], found["ci"])
    entry = view["rows"].get(model, {})
    source = entry.get("versus_human", {}) if versus_human else entry
    for column in columns:
        ci = (source.get("ci") or {}).get(column)
        out[column] = None if ci is None else (source["delta"][column], ci)
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


def _rules(pooled: Mapping[str, Any], guarded: Mapping[str, str], flat: Mapping[str, Mapping[str, float]],
           inert: Mapping[str, str] | frozenset = frozenset()) -> list[Rule]:
    """Every rule, the claims fixed from the pooled view."""
    rows, gains = pooled["rows"], pooled["gains"]
    rules: list[Rule] = []
    up, down, not_up, not_down = frozenset({1}), frozenset({-1}), frozenset({0, -1}), frozenset({0, 1})
    for gain in gains:  # 1. each reward rose on its own scale
        model = gain["model"]
        rules.append(Rule(model, CLAIM_REWARD_RISES, lambda view, model=model: _estimates(view, model, [], gain=True),
                          {REWARD: up}, _gain_interval(model)))
    for model, entry in rows.items():  # 2. judge accuracy against XE, every SCST row (the oracle's included)
        if JUDGE not in (entry.get("ci") or {}):
            continue
        way = direction(entry["ci"][JUDGE])
        rules.append(Rule(model, CLAIM_JUDGE[way], lambda view, model=model: _estimates(view, model, [JUDGE]),
                          {JUDGE: frozenset({way})}, _delta_estimate(model, JUDGE)))
    oracle = pooled.get("oracle")
    for gain in gains:  # 3. gamed: the reward rose, the judge did not, with a degenerate signature
        if gain["model"] == oracle:
            continue
        for column, (sign, _) in DEGENERATE_SIGNS.items():
            if column not in (rows.get(gain["model"], {}).get("ci") or {}):
                continue
            rules.append(Rule(gain["model"], gamed_claim(column),
                              lambda view, model=gain["model"], column=column:
                              _estimates(view, model, [JUDGE, column], gain=True),
                              {REWARD: up, JUDGE: not_up, column: up if sign > 0 else down},
                              _delta_estimate(gain["model"], column), only_when_holds=True))
    for reward, model in guarded.items():  # 4. the guard kept the judge while the reward rose
        if model not in rows or JUDGE not in (rows[model].get("ci") or {}):
            continue
        if reward in inert:  # the guard changed no test caption of any seed: its row is the unguarded one's
            rules.append(Rule(model, CLAIM_INERT, lambda view: {}, {}, _delta_estimate(model, JUDGE)))
            continue
        shares = flat.get(reward, {})
        if any(share > FLAT_SHARE for share in shares.values()):
            worst = max(shares.values())
            rules.append(Rule(model, CLAIM_FLAT_REWARD, lambda view: {}, {},
                              lambda view, worst=worst: ("steps with reward spread 0",
                                                         {"point": 100.0 * worst, "ci": [100.0 * worst] * 2}, " %")))
            continue
        rules.append(Rule(model, guard_claim(model), lambda view, model=model: _estimates(view, model, [JUDGE],
                                                                                       gain=True),
                          {REWARD: up, JUDGE: not_down}, _delta_estimate(model, JUDGE)))
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
            rules.append(Rule(HUMAN_SUBJECT, f"{judge_or_metric} {CLAIM_HUMAN[way]}",
                              lambda view, column=column, model=best:
                              _estimates(view, model, [column], versus_human=True),
                              {column: frozenset({way})}, _delta_estimate(best, column, versus_human=True),
                              model=best))
    return rules


def guard_verdicts(records: Sequence[Mapping[str, Any]], rows: Mapping[str, Sequence[str]]) -> list[str]:
    """Per guarded reward (`rows[reward]`: its guarded rows), which guards kept judge accuracy while the reward rose
    (their "guard worked" findings held), or that none did: the issue-44 outcome in one line each."""
    lines = []
    for reward, models in rows.items():
        verdicts = {r["subject"]: r["holds"] for r in records if r["subject"] in models and r["claim"] in GUARD_CLAIMS}
        idle = [r["subject"] for r in records if r["subject"] in models and r["claim"] == CLAIM_INERT]
        never = f" {_names(idle)} never acted (its test captions are the unguarded run's)." if idle else ""
        if not verdicts:
            if idle:
                lines.append(f"{reward}:{never}")
            continue
        held = [model for model, holds in verdicts.items() if holds is True]
        if held:
            lines.append(f"{reward}: judge accuracy kept while the reward rose under {_names(held)} (each guard's "
                         f"setting chosen on validation, without the judge).{never}")
        else:
            lines.append(f"{reward}: no guard chosen without the judge kept judge accuracy while the reward rose "
                         f"({_names(list(verdicts))}: the finding does not hold or is seed-dependent).{never}")
    return lines


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
    agrees = (record.get("replication") or {}).get("agrees")
    if agrees is not None and agrees < FRAGILE:
        numbers += f"; fragile: an independent replication agrees with probability {agrees:.2f}"
    subject = record["subject"] + (f" ({record['model']})" if record.get("model") else "")
    return f"{subject}: {record['claim']}{status} ({numbers})."


def _seed_names(seeds: Sequence[str]) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}"


def _names(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def delta_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], label: str = "Δ vs xe",
                labels: Sequence[str] = ("model",)) -> str:
    """Markdown: per row with intervals and column, (row − baseline) and its paired bootstrap 95% interval (the
    interval alone when the row holds no `delta`). Rows named by `model` alone are headed `label`; rows named by
    several `labels` (test set, reward) keep those as headers and head each column `Δ<column>`."""
    named = list(labels) != ["model"]
    head = [*labels, *(f"Δ{c}" for c in columns)] if named else [label, *columns]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for row in rows:
        ci, delta = row.get("ci") or {}, row.get("delta") or {}
        if ci:
            cells = [("" if c not in ci else _change(delta[c], ci[c]) if c in delta
                      else f"[{signed(ci[c][0])}, {signed(ci[c][1])}]") for c in columns]
            names = [str(row.get(name, "")) for name in labels] if named else [str(row["model"])]
            lines.append("| " + " | ".join([*names, *cells]) + " |")
    return "\n".join(lines) + "\n"


def gains_table(gains: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: each SCST model's own reward on the test split under XE and under that model, with the interval of
    the gain (the model column tells apart two runs of one reward, e.g. a mix summed and normalised)."""
    base = gains[0].get("baseline", BASELINE) if gains else BASELINE  # `init`: a transformers run without XE
    lines = [f"| model | reward | {base} | scst | Δ [95% interval] |", "|---|---|---|---|---|"]
    lines += [f"| {g.get('model', '')} | {g['reward']} | {g[base]:.4f} | {g['scst']:.4f} | "
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
