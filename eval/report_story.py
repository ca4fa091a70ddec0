"""What the report says first: the run's headline, generated from its finding records, and the findings ranked.

The headline is two or three sentences, each derived from results.json by a fixed rule (never written by hand):

1. the best system by the judge (the finding records' `judge accuracy ...` claims: the highest Judge-acc change
   against the baseline, the oracle left out and named with its own gain), or, in a run without a judge (a
   recipe), by the chosen metric (`HEADLINE_COLUMNS`: the first one the rows carry intervals for);
2. which rewards were gamed and how (the records' "is gamed" claims that hold, with the degenerate signatures
   they name), or that none was, when the rules ran;
3. whether the guards held (the records' guard claims: the KL guard, the length mask, ...), when the run has a
   guarded row; with more than two guarded rows, the ones that held by name and the others counted.

A claim whose replication probability is below `FRAGILE` is marked fragile in the sentence that uses it; a
seed-dependent one is said to be. `ranked_findings` orders the findings robust first (by the probability that an
independent replication reaches the same verdict, highest first), then the fragile ones, then the seed-dependent
ones, then sentences that are not records. The vocabulary of a record is `pacs.eval.finding_claims`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pacs.eval.finding_claims import (
    CLAIM_FLAT_REWARD,
    CLAIM_INERT,
    CLAIM_JUDGE,
    CLAIM_REWARD_RISES,
    FRAGILE,
    HUMAN_SUBJECT,
    JUDGE,
    SEED_DEPENDENT,
    gamed_signature,
    guard_of_claim,
)

#: the columns a run without a judge is headlined by, in order of preference (the first one with intervals)
HEADLINE_COLUMNS = (JUDGE, "C", "CIDEr", "PAC-S++", "RefPAC-S++", "CLIP-S", "B-4")
#: the robustness ranks of a finding, in page order
ROBUST, FRAGILE_RANK, SEED_DEPENDENT_RANK, UNRATED = "robust", "fragile", "seed-dependent", "unrated"


def signed(value: float) -> str:
    """A signed number with 3 significant-ish digits (+12.5, +1.23, +0.012); one that rounds to 0 is +0.000."""
    size = abs(value)
    text = f"{value:+.1f}" if size >= 10 else f"{value:+.2f}" if size >= 1 else f"{value:+.3f}"
    return "+" + text[1:] if text.startswith("-") and float(text) == 0 else text


def records(results: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The finding records of results.json (sentences of older runs left out)."""
    found = results.get("findings") or []
    return [f for f in found if isinstance(f, Mapping) and "claim" in f and "subject" in f]


def agreement(record: Mapping[str, Any]) -> float | None:
    """The probability that an independent replication reaches the record's verdict (None: not rated)."""
    value = (record.get("replication") or {}).get("agrees") if isinstance(record.get("replication"), Mapping) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def rank(finding: Any) -> str:
    """`ROBUST`, `FRAGILE_RANK`, `SEED_DEPENDENT_RANK` or `UNRATED` (a sentence, or a record without a rating)."""
    if not isinstance(finding, Mapping):
        return UNRATED
    if finding.get("holds") == SEED_DEPENDENT:
        return SEED_DEPENDENT_RANK
    agrees = agreement(finding)
    if agrees is None:
        return UNRATED
    return ROBUST if agrees >= FRAGILE else FRAGILE_RANK


def ranked_findings(findings: Sequence[Any]) -> list[tuple[Any, str]]:
    """(finding, rank) robust first, then fragile, seed-dependent and unrated; within a rank by the probability
    that a replication agrees (highest first), then in the run's order."""
    order = (ROBUST, FRAGILE_RANK, SEED_DEPENDENT_RANK, UNRATED)
    indexed = [(index, finding, rank(finding)) for index, finding in enumerate(findings)]
    indexed.sort(key=lambda item: (order.index(item[2]), -(agreement(item[1]) or 0.0)
                                   if isinstance(item[1], Mapping) else 0.0, item[0]))
    return [(finding, kind) for _, finding, kind in indexed]


def _interval(record: Mapping[str, Any]) -> str:
    """`column +a unit [low, high]` of a record's reported interval."""
    found = record.get("interval") or {}
    unit = found.get("unit", "")
    return (f"{found.get('column')} {signed(found['point'])}{unit} [{signed(found['low'])}, "
            f"{signed(found['high'])}]")


def _mark(record: Mapping[str, Any]) -> str:
    """'' for a robust record, else its caveat (fragile with the probability, or seed-dependent)."""
    if record.get("holds") == SEED_DEPENDENT:
        return f" ({SEED_DEPENDENT})"
    agrees = agreement(record)
    return f" (fragile: a replication agrees with probability {agrees:.2f})" if agrees is not None and \
        agrees < FRAGILE else ""


def _names(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def best_by_judge(found: Sequence[Mapping[str, Any]], oracle: str | None, baseline: str) -> str | None:
    """Sentence 1 from the judge-accuracy claims: the best system (oracle aside) and the oracle's own gain."""
    judged = [r for r in found if r["claim"] in CLAIM_JUDGE.values() and r["subject"] != HUMAN_SUBJECT
              and isinstance(r.get("interval"), Mapping) and r["interval"].get("point") is not None]
    candidates = [r for r in judged if r["subject"] != oracle]
    if not candidates:
        return None
    best = max(candidates, key=lambda r: r["interval"]["point"])
    tied = sum(1 for r in candidates if r["interval"]["point"] == best["interval"]["point"]) - 1
    if best["claim"] == CLAIM_JUDGE[1]:
        sentence = (f"By the judge, the best reward is {best['subject']}: {best['claim']} against {baseline} "
                    f"({_interval(best)}){_mark(best)}")
    else:
        ties = f", tied with {tied} other{'s' * (tied > 1)}" if tied else ""
        sentence = (f"By the judge, no reward raised judge accuracy beyond noise against {baseline}: the highest "
                    f"change is {best['subject']}'s ({_interval(best)}{ties}){_mark(best)}")
    share = best.get("share_of_oracle")
    if isinstance(share, Mapping) and share.get("point") is not None:
        sentence += f", {100 * share['point']:.0f}% of the oracle's gain"
    oracle_record = next((r for r in judged if r["subject"] == oracle), None)
    if oracle_record is not None:
        sentence += f"; the oracle ({oracle}, the judge as the reward) reaches {_interval(oracle_record)}"
    return sentence + "."


def best_by_metric(rows: Sequence[Mapping[str, Any]], baseline: str, column: str | None = None
                   ) -> str | None:
    """Sentence 1 of a run without judge claims: the best row by `column` (default: the first of
    `HEADLINE_COLUMNS` with intervals) and its change against the baseline."""
    first_set = next((r.get("test_set") for r in rows), None)  # a recipe's rows: one per model and test set
    with_ci = [r for r in rows if isinstance(r.get("ci"), Mapping) and isinstance(r.get("delta"), Mapping)
               and r.get("test_set") == first_set]
    if column is None:
        column = next((c for c in HEADLINE_COLUMNS if any(c in r["ci"] and c in r["delta"] for r in with_ci)), None)
    usable = [r for r in with_ci if column in r["ci"] and isinstance(r["delta"].get(column), (int, float))]
    if column is None or not usable:
        return None
    best = max(usable, key=lambda r: r["delta"][column])
    low, high = best["ci"][column]
    where = f" on {first_set}" if first_set else ""
    change = f"{signed(best['delta'][column])} [{signed(low)}, {signed(high)}]"
    if not low > 0:
        return (f"By {column}{where}, no system is above {baseline} beyond noise: the highest change is "
                f"{best.get('model')}'s, {change} (paired 95% interval).")
    return (f"By {column}{where}, the best system is {best.get('model')}: {change} against {baseline}, beyond noise "
            "(paired 95% interval).")


def gamed(found: Sequence[Mapping[str, Any]]) -> str | None:
    """Sentence 2: the rewards gamed and how (the "is gamed" claims that hold or are seed-dependent), or that none
    was; None when the gaming rules did not run (no own-reward claims)."""
    signatures: dict[str, list[str]] = {}
    for record in found:
        how = gamed_signature(record["claim"])
        if how is not None and record.get("holds") in (True, SEED_DEPENDENT):
            signatures.setdefault(record["subject"], []).append(how + _mark(record))
    if not signatures:
        rises = [r for r in found if r["claim"] == CLAIM_REWARD_RISES]
        if not rises:
            return None
        if not any(r.get("holds") is True for r in rises):
            return ("No reward was gamed, and none rose beyond noise either: SCST moved no reward this run can tell "
                    "from noise.")
        return ("No reward was gamed beyond noise: none rose while judge accuracy did not with a degenerate "
                "signature (shorter captions, repeated word pairs, cut-off endings or absent shapes).")
    if len(signatures) == 1:
        subject, ways = next(iter(signatures.items()))
        return (f"{subject} was gamed: its own reward rose beyond noise while judge accuracy did not, with "
                f"{_names(ways)}.")
    parts = [f"{subject} (with {_names(ways)})" for subject, ways in signatures.items()]
    return f"{_names(parts)} were gamed: each one's own reward rose beyond noise while judge accuracy did not."


#: how a verdict reads when counted ("3 seed-dependent"), whatever the number
_COUNTED = {"did not hold": "did not hold", f"is {SEED_DEPENDENT}": SEED_DEPENDENT, "never acted": "never acted",
            "has no verdict": "without a verdict (flat reward)"}


def guards(found: Sequence[Mapping[str, Any]]) -> str | None:
    """Sentence 3: whether each guard held (its reward rose and judge accuracy did not fall); None without a
    guarded row. Past two guarded rows the sentence names the ones that held and counts the others."""
    held, other = [], []  # (name, verdict, interval and mark)
    for record in found:
        guard = guard_of_claim(record["claim"])
        if guard is not None:
            verdict = {True: "held", False: "did not hold"}.get(record.get("holds"), f"is {SEED_DEPENDENT}")
            mark = _mark(record) if record.get("holds") != SEED_DEPENDENT else ""
            (held if record.get("holds") is True else other).append(
                (f"{guard} of {record['subject']}", verdict, f"({_interval(record)}){mark}"))
        elif record["claim"] == CLAIM_INERT:
            idle = "never acted (its test captions are the unguarded run's)"
            other.append((f"the guard of {record['subject']}", idle, ""))
        elif record["claim"] == CLAIM_FLAT_REWARD:
            guard = "the KL guard" if str(record["subject"]).endswith(" +KL") else "the guard"
            flat = "has no verdict: its SCST reward had no spread for most steps"
            other.append((f"{guard} of {record['subject']}", flat, ""))
    if not held and not other:
        return None
    if len(held) + len(other) <= 2:
        text = "; ".join(" ".join(part for part in row if part) for row in held + other)
    else:
        text = f"{_names([f'{name} {interval}' for name, _, interval in held])} held" if held else "no guard held"
        if other:  # counted by verdict: "did not hold", "is seed-dependent", "has no verdict ..."
            counts: dict[str, int] = {}
            for _, verdict, _ in other:
                kind = _COUNTED.get(verdict.split(" (")[0].split(":")[0], verdict)
                counts[kind] = counts.get(kind, 0) + 1
            text += (f"; of the other {len(other)} guarded row{'s' if len(other) > 1 else ''}, "
                     f"{_names([f'{n} {kind}' for kind, n in counts.items()])}")
    return f"{text[0].upper()}{text[1:]} (a guard holds when its reward rises and judge accuracy does not fall)."


def headline(results: Mapping[str, Any], column: str | None = None) -> list[str]:
    """The run's headline: two or three sentences generated from results.json (see the module's rules); `column`:
    the metric of a run without judge claims (default: the first of `HEADLINE_COLUMNS` with intervals)."""
    found = records(results)
    baseline = str(results.get("baseline") or "xe")
    oracle = results.get("oracle")
    first = best_by_judge(found, oracle if isinstance(oracle, str) else None, baseline)
    if first is None:
        rows = results.get("rows") if isinstance(results.get("rows"), list) else []
        first = best_by_metric([r for r in rows if isinstance(r, Mapping)], baseline, column)
    sentences = [s for s in (first, gamed(found), guards(found)) if s]
    if first is not None and not found:
        sentences.append("The run has no judge, so whether a reward was gamed is not assessed here: read the "
                         "gallery and the degenerate columns (length, repetition).")
    return sentences[:3]
