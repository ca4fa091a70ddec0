"""The exact reward of an SCST stage: the parsed, weighted mix, logged once and kept in the stage's record.

`reward_record(spec)` is what a stage record's `summary.reward` holds; `announce_reward` logs its one line
(`stage scst-cider-pac-s-0.5: reward 1 x cider + 0.5 x pac-s++ (weighted_sum)`), so a run states the reward it
trained with, not only the spelling it was given.
"""
from __future__ import annotations

import logging
from typing import Any

from pacs.rewards.registry import parse_reward_spec

logger = logging.getLogger(__name__)


def reward_record(spec: str, aggregation: str = "weighted_sum", kl_coef: float | None = None) -> dict[str, Any]:
    """The canonical reward of `spec`: its terms (name, weight) in order, the mix's aggregation and any KL term."""
    terms = parse_reward_spec(spec)
    single = len(terms) == 1 and ":" not in spec
    record: dict[str, Any] = {
        "spec": terms[0][0] if single else ",".join(f"{name}:{weight:g}" for name, weight in terms),
        "terms": [{"reward": name, "weight": weight} for name, weight in terms],
        "aggregation": aggregation,
    }
    if kl_coef:
        record["kl_coef"] = kl_coef
    return record


def reward_line(record: dict[str, Any]) -> str:
    """The reward as one readable line: `1 x cider + 0.5 x pac-s++ (weighted_sum)`, `- 0.05 x KL` when guarded."""
    text = " + ".join(f"{term['weight']:g} x {term['reward']}" for term in record["terms"])
    if record.get("kl_coef"):
        text += f" - {record['kl_coef']:g} x KL(policy || XE)"
    return f"{text} ({record['aggregation']})"


def announce_reward(stage: str, spec: str, aggregation: str = "weighted_sum", kl_coef: float | None = None,
                    log: bool = True) -> dict[str, Any]:
    """Log the stage's exact reward in one line (when `log`: the main process); the record to keep in its summary."""
    record = reward_record(spec, aggregation, kl_coef)
    if log:
        logger.info("stage %s: reward %s", stage, reward_line(record))
    return record
