"""A recipe's findings, by the demo's rules (`pacs.captioner.orchestration.findings`): each reward's own value on
each test set under XE and under the SCST model trained on it, the paired (over seeds: stratified) bootstrap
interval of the gain (`pacs.captioner.orchestration.seed_evidence.SeedEvidence`), the claims those intervals
support and how likely an independent replication reaches each verdict.

The claims that rest on a judge (judge accuracy, "gamed", the guards', the oracle's share) are made on a test set
that has one (`pacs.captioner.orchestration.data_sources`: the demo world's, with the oracle reward `judge`), not
on files of captions; a reward whose terms have no per-image table column (`findings.REWARD_COLUMNS`) gets no gain.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pacs.captioner.orchestration.evaluation import PER_IMAGE_COLUMNS
from pacs.captioner.orchestration.findings import (
    BASELINE,
    JUDGE,
    REWARD_COLUMNS,
    finding_records,
    render_finding,
    replication_summary,
)
from pacs.captioner.orchestration.seed_evidence import SeedEvidence, single_seed
from pacs.eval.system_inputs import HUMAN_ROW
from pacs.rewards.registry import parse_reward_spec

logger = logging.getLogger(__name__)

PerImage = Mapping[str, Any]  # {"image_ids": [...], "values": {column: [per-image values]}}


def reward_findings(per_image: Mapping[int, Mapping[tuple[str, str], PerImage]], rewards: Sequence[tuple[str, str]],
                    n_resamples: int, seed: int, baseline: str = BASELINE,
                    normalised: Sequence[tuple[str, str, str]] = ()) -> dict[str, Any]:
    """`{"reward_gains", "findings", "replication"}` of a recipe run (`per_image[s][(model, test set)]`: training
    seed `s`'s per-image values; one seed: a single run; `seed` seeds the resampling) for each `(reward spec, row)`
    of `rewards` whose row is in every seed (a guarded row: its reward's gain), against row `baseline` (`xe`, or
    a transformers run's `init`); {} when no reward has a gain. `normalised`: (reward, normalised row, weighted-sum
    row) of the `normalised_rewards` runs, compared in `mix_normalisation` (`normalisation_comparisons`)."""
    if n_resamples < 1 or not per_image:
        return {}
    comparisons = normalisation_comparisons(per_image, normalised, n_resamples, seed, baseline)
    found = _gains_and_findings(per_image, rewards, n_resamples, seed, baseline)
    return {**found, **({"mix_normalisation": comparisons} if comparisons else {})}


def normalisation_comparisons(per_image: Mapping[int, Mapping[tuple[str, str], PerImage]],
                              normalised: Sequence[tuple[str, str, str]], n_resamples: int, seed: int,
                              baseline: str = BASELINE) -> list[dict[str, Any]]:
    """Per test set and `normalised_rewards` reward: the paired (over seeds: stratified) bootstrap of (normalised
    run − weighted-sum run) on judge accuracy where the test set has a judge, else on CIDEr-D (`C`), as the demo's
    `mix_normalisation` records (each with its `test_set`)."""
    out: list[dict[str, Any]] = []
    if not normalised or not per_image:
        return out
    first = next(iter(per_image.values()))
    for test_set in sorted({test_set for model, test_set in first if model == baseline}):
        for spec, model, versus in normalised:
            keys = [(model, test_set), (versus, test_set)]
            if not all(key in seed_values for seed_values in per_image.values() for key in keys):
                continue
            records = [[seed_values[key] for key in keys] for seed_values in per_image.values()]
            if any(list(a["image_ids"]) != list(b["image_ids"]) for a, b in records) or len(
                    {tuple(a["image_ids"]) for a, _ in records}) != 1:
                logger.warning("no comparison of %s with %s on %s: their images differ", model, versus, test_set)
                continue
            column = next((c for c in (JUDGE, "C") if all(c in r["values"] for pair in records for r in pair)), None)
            if column is None:
                continue
            values = {row: [{column: np.asarray(pair[index]["values"][column], dtype=np.float64)} for pair in records]
                      for index, row in enumerate((model, versus))}
            bleu = {row: [None] * len(records) for row in values}
            found = SeedEvidence(values, bleu, [column], n_resamples, seed, versus).estimate(model, column, versus)
            if found is not None:
                out.append({"reward": spec, "model": model, "versus": versus, "column": column, "test_set": test_set,
                            "delta": found.point, "ci": list(found.interval), "per_seed": list(found.per_seed)})
    return out


def _gains_and_findings(per_image: Mapping[int, Mapping[tuple[str, str], PerImage]],
                        rewards: Sequence[tuple[str, str]], n_resamples: int, seed: int,
                        baseline: str) -> dict[str, Any]:
    """The gains, findings and replication summary of `reward_findings` ({} when no reward has a gain)."""
    sets = sorted({test_set for model, test_set in next(iter(per_image.values())) if model == baseline})
    gains, records, shares, oracle = [], [], {}, None
    for test_set in sets:
        found = _test_set_findings(per_image, rewards, test_set, n_resamples, seed, len(sets) > 1, baseline)
        if found is not None:
            gains += found[0]
            records += found[1]
            shares.update(found[2])
            oracle = found[3] or oracle
    if not gains:
        return {}
    return {"bootstrap_resamples": n_resamples, "reward_gains": gains, "findings": records,
            "replication": replication_summary(records),
            **({"share_of_oracle": shares, "oracle": oracle} if shares else {})}


def _test_set_findings(by_seed: Mapping[int, Mapping[tuple[str, str], PerImage]], rewards: Sequence[tuple[str, str]],
                       test_set: str, n_resamples: int, seed: int, named: bool, baseline: str
                       ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], str | None] | None:
    """The gains, findings, shares of the oracle's Judge-acc gain and the oracle's row of one test set (`named`:
    several test sets, so each row says which)."""
    seeds, per_image = list(by_seed), list(by_seed.values())
    pairs = [(spec, row) for spec, row in rewards if _has_columns(spec)]
    models = [baseline, *dict.fromkeys(row for _, row in pairs)]
    models = [m for m in models if all((m, test_set) in seed_values for seed_values in per_image)]
    ids = [list(per_image[0][(baseline, test_set)]["image_ids"])]
    if baseline not in models or len(models) < 2 or any(
            list(seed_values[(m, test_set)]["image_ids"]) != ids[0] for seed_values in per_image for m in models):
        logger.warning("no reward findings on %s: a model is missing in some seed or its images differ", test_set)
        return None
    human = HUMAN_ROW if all(list(seed_values.get((HUMAN_ROW, test_set), {}).get("image_ids", [])) == ids[0]
                             for seed_values in per_image) else None  # `evaluation.human_baseline`: versus humans
    models += [human] if human else []
    columns = [c for c in PER_IMAGE_COLUMNS
               if all(c in seed_values[(m, test_set)]["values"] for seed_values in per_image for m in models)
               and all(np.isfinite(np.asarray(seed_values[(m, test_set)]["values"][c], dtype=np.float64)).all()
                       for seed_values in per_image for m in models)]
    values = {m: [{c: np.asarray(seed_values[(m, test_set)]["values"][c], dtype=np.float64) for c in columns}
                  for seed_values in per_image] for m in models}
    rewards_here = [(spec, row) for spec, row in pairs if row in models and all(
        REWARD_COLUMNS[name][0] in columns for name, _ in parse_reward_spec(spec))]
    if not rewards_here:
        return None
    bleu = {m: [None] * len(per_image) for m in models}  # B-4 is not a per-image column: no interval here
    pooled = SeedEvidence(values, bleu, columns, n_resamples, seed, baseline).view(rewards_here, human)
    views = {str(seeds[0]): pooled} if len(seeds) == 1 else {
        str(name): SeedEvidence(*single_seed(values, bleu, index), columns, n_resamples, seed,
                                baseline).view(rewards_here, human)
        for index, name in enumerate(seeds)}
    records = finding_records(pooled, views)
    label = (lambda model: f"{model} on {test_set}") if named else (lambda model: model)
    for record in records:
        record.update(subject=label(record["subject"]), test_set=test_set)
        record["text"] = render_finding(record)
    gains = [{**gain, "model": label(gain["model"]), "test_set": test_set} for gain in pooled["gains"]]
    shares = {label(model): share for model, share in pooled["share_of_oracle"].items()}
    return gains, records, shares, label(pooled["oracle"]) if pooled["oracle"] else None


def _has_columns(spec: str) -> bool:
    """Whether every term of reward `spec` has a per-image table column its gain can be computed from."""
    known = all(name in REWARD_COLUMNS for name, _ in parse_reward_spec(spec))
    if not known:
        logger.info("no reward gain for %s: a term has no per-image table column", spec)
    return known
