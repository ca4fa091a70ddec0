"""The vocabulary of a finding record (results.json `findings: [{subject, claim, holds, interval, replication, ...}]`):
the fixed claim phrases the demo's rules state (`pacs.captioner.orchestration.findings`) and the marks of a verdict, in one
place for the rules that write them and the report that reads them (`pacs.eval.report_story`)."""
from __future__ import annotations

SEED_DEPENDENT = "seed-dependent"
"""`holds` of a claim whose seeds disagree beyond noise (`opposed_seeds`): never stated as a result."""
FRAGILE = 0.9
"""A verdict that an independent replication would reach with a probability below this is printed as fragile."""
JUDGE = "Judge-acc"
REWARD = "reward"
"""The label of a model's own-reward gain among a claim's differences."""
CLAIM_REWARD_RISES = "its own reward rises beyond noise"
CLAIM_JUDGE = {1: "judge accuracy rises beyond noise", -1: "judge accuracy falls beyond noise",
               0: "judge accuracy stays within noise"}
GUARD_PROMISE = " keeps judge accuracy while its reward rises"
CLAIM_GUARD = "the KL guard" + GUARD_PROMISE
"""The KL row's "guard worked" claim; another guard's row claims "the <guard> guard" + `GUARD_PROMISE`."""
CLAIM_FLAT_REWARD = "its SCST reward had no spread for most steps, so no guard claim is made"
CLAIM_INERT = ("the guard never acted: its test captions are the unguarded run's in every seed, so no guard claim "
               "is made")
CLAIM_HUMAN = {1: "ranks it above humans", -1: "ranks humans above it", 0: "ranks it level with humans within noise"}
HUMAN_SUBJECT = "best SCST row vs human"
"""The subject of the human-row claims: a fixed phrase, the row (the best SCST model by judge accuracy, a choice by
point estimates that two replications may make differently) named in the record's `model`."""
# columns where an increase means a worse caption (for the "gamed" rule): column -> (sign of the bad change, words)
DEGENERATE_SIGNS: dict[str, tuple[int, str]] = {"Length": (-1, "shorter captions"),
                                                "Rep-2": (1, "more repeated word pairs"),
                                                "%Incorrect": (1, "more cut-off endings"),
                                                "Halluc.": (1, "more absent shapes named")}
GAMED_PREFIX = "is gamed: its reward rises while judge accuracy does not, with "


def gamed_claim(column: str) -> str:
    """The fixed phrase of the "gamed" rule for one degenerate column."""
    return GAMED_PREFIX + DEGENERATE_SIGNS[column][1]


def gamed_signature(claim: str) -> str | None:
    """The degenerate signature a "gamed" claim names ("shorter captions", ...), None for any other claim."""
    return claim[len(GAMED_PREFIX):] if claim.startswith(GAMED_PREFIX) else None


def guard_of_claim(claim: str) -> str | None:
    """The guard a "guard worked" claim is about ("the KL guard", "the length mask guard", ...), None for any other."""
    if not claim.endswith(GUARD_PROMISE):
        return None
    guard = claim[:-len(GUARD_PROMISE)]
    return guard if guard.startswith("the ") and guard.endswith((" guard", " guards")) else None
