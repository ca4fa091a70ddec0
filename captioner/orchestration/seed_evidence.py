"""The demo's numbers over training seeds: every row, difference and reward gain as a paired, stratified bootstrap
over seeds and, within each seed, the test images (`pacs.eval.intervals.StratifiedBootstrap`), point estimates aggregated over
seeds (the mean; the IQM from 5 seeds). `SeedEvidence.view()` gives one "view" of the evidence (the pooled one, or
one seed's alone), the input of the findings' rules (`pacs.captioner.orchestration.findings.finding_records`)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pacs.captioner.orchestration.findings import BASELINE, reward_values
from pacs.eval.intervals import Estimate, StratifiedBootstrap
from pacs.eval.system_scoring import corpus_bleu

ORACLE = "judge"
"""The oracle reward: the demo's exact judge (`pacs.captioner.demo.judge_reward`)."""
CORPUS_COLUMNS = {"B-4": 3}
"""Columns that are corpus statistics (not means of per-image values): corpus BLEU-n, n-1 the index."""


class SeedEvidence:
    """Per-image values of every row of every seed (`[S, N]` per column) and their stratified bootstrap."""

    def __init__(self, per_image: Mapping[str, Sequence[Mapping[str, np.ndarray]]],
                 bleu: Mapping[str, Sequence[Any]], columns: Sequence[str], n_resamples: int, seed: int,
                 baseline: str = BASELINE) -> None:
        """`per_image[name][s][column]`: the row's per-image values in seed `s` (the same images, in the same
        order, in every seed and row); `bleu[name][s]`: its BLEU statistics (`pacs.eval.system_scoring.BleuStats`;
        None: no B-4, the human row); `baseline`: the row every difference and gain is taken against (`xe`, or a
        transformers run's `init` without XE)."""
        self.names = list(per_image)
        self.baseline = baseline
        self.columns = list(columns)
        first = per_image[self.names[0]]
        n_seeds, n_images = len(first), len(next(iter(first[0].values())))
        self.values = {name: {column: np.stack([np.asarray(seeds[s][column], dtype=np.float64)
                                                for s in range(n_seeds)])
                              for column in columns if column in seeds[0]}
                       for name, seeds in per_image.items()}
        self.bleu = {name: list(stats) for name, stats in bleu.items()}
        self.boot = StratifiedBootstrap(n_seeds, n_images, n_resamples, seed)
        self._cache: dict[tuple[str, str], tuple[np.ndarray, np.ndarray] | None] = {}

    def samples(self, name: str, column: str) -> tuple[np.ndarray, np.ndarray] | None:
        """`(per seed on all images [S], per resample and slot [B, S])` of a row's column (None: not available)."""
        key = (name, column)
        if key not in self._cache:
            self._cache[key] = self._compute(name, column)
        return self._cache[key]

    def _compute(self, name: str, column: str) -> tuple[np.ndarray, np.ndarray] | None:
        if column in CORPUS_COLUMNS:
            stats = self.bleu.get(name) or []
            if not stats or any(s is None for s in stats):
                return None
            order = CORPUS_COLUMNS[column]
            full = np.asarray([100.0 * corpus_bleu(s)[order] for s in stats])
            return full, self.boot.per_seed_statistic(lambda s, idx: 100.0 * corpus_bleu(stats[s], idx)[order])
        values = self.values[name].get(column)
        if values is None or not np.isfinite(values).all():
            return None
        return values.mean(axis=1), self.boot.per_seed_means(values)

    def estimate(self, name: str, column: str, baseline: str | None = None) -> Estimate | None:
        """The row's value (no baseline) or its paired difference with the baseline row."""
        mine = self.samples(name, column)
        if mine is None:
            return None
        if baseline is None:
            return self.boot.estimate(*mine)
        base = self.samples(baseline, column)
        return None if base is None else self.boot.estimate(mine[0] - base[0], mine[1] - base[1])

    def reward_estimate(self, spec: str, model: str) -> tuple[float, float, Estimate]:
        """Reward `spec`'s own value under the baseline and `model` (aggregates over seeds) and the paired
        difference."""
        xe = reward_values(spec, self.values[self.baseline])
        mine = reward_values(spec, self.values[model])
        base_value = self.boot.estimate(xe.mean(axis=1), self.boot.per_seed_means(xe)).point
        own_value = self.boot.estimate(mine.mean(axis=1), self.boot.per_seed_means(mine)).point
        return base_value, own_value, self.boot.mean_difference(mine, xe)

    def share(self, model: str, oracle: str, column: str = "Judge-acc") -> Estimate | None:
        """`model`'s change of `column` against XE as a share of `oracle`'s change (ratio of the aggregates, on the
        same resamples); None when either is unavailable or the oracle's change is 0."""
        mine, best, base = (self.samples(n, column) for n in (model, oracle, self.baseline))
        if mine is None or best is None or base is None:
            return None
        return self.boot.ratio((mine[0] - base[0], mine[1] - base[1]), (best[0] - base[0], best[1] - base[1]))

    def view(self, rewards: Sequence[tuple[str, str]], human: str | None) -> dict[str, Any]:
        """One view of the evidence: every row's value and interval, every captioner's difference with XE and
        with `human`, each reward's own gain (`rewards`: (spec, the row trained on it) pairs) and each row's
        Judge-acc change as a share of the oracle's (when the `judge` reward was trained and raised judge accuracy
        beyond noise: the share of a gain within noise is not reported)."""
        rows: dict[str, dict[str, Any]] = {}
        for name in self.names:
            entry: dict[str, Any] = {"value": {}, "value_ci": {}, "per_seed": {}}
            for column in self.columns:
                own = self.estimate(name, column)
                if own is not None:
                    entry["value"][column], entry["value_ci"][column] = own.point, own.interval
                    entry["per_seed"][column] = own.per_seed
            if name not in (self.baseline, human):
                entry.update(_differences(self, name, self.baseline))
            if human is not None and name != human:
                entry["versus_human"] = _differences(self, name, human)
            rows[name] = entry
        gains = []
        for spec, model in rewards:
            xe, scst, gain = self.reward_estimate(spec, model)
            # the value under the baseline is keyed by its row (`xe`; `init` with `"baseline": "init"`)
            gains.append({"reward": spec, "model": model, self.baseline: xe, "scst": scst, "delta": gain.point,
                          "ci": gain.interval, "per_seed": gain.per_seed,
                          **({} if self.baseline == BASELINE else {"baseline": self.baseline})})
        shares = {}
        oracle = next((model for spec, model in rewards if spec == ORACLE), None)
        oracle_gain = (rows.get(oracle, {}).get("ci") or {}).get("Judge-acc") if oracle is not None else None
        if oracle_gain is not None and oracle_gain[0] > 0:  # a share of a gain that is noise would be noise too
            for name in self.names:
                if name in (self.baseline, human, oracle):
                    continue
                share = self.share(name, oracle)
                if share is not None:
                    shares[name] = {"point": share.point, "interval": share.interval, "per_seed": share.per_seed}
        return {"rows": rows, "gains": gains, "share_of_oracle": shares, "oracle": oracle, "human": human}


def _differences(evidence: SeedEvidence, name: str, baseline: str) -> dict[str, Any]:
    delta, ci, per_seed = {}, {}, {}
    for column in evidence.columns:
        found = evidence.estimate(name, column, baseline)
        if found is not None:
            delta[column], ci[column], per_seed[column] = found.point, found.interval, found.per_seed
    return {"delta": delta, "ci": ci, "delta_per_seed": per_seed}


def single_seed(per_image: Mapping[str, Sequence[Mapping[str, np.ndarray]]], bleu: Mapping[str, Sequence[Any]],
                index: int) -> tuple[dict[str, list[Mapping[str, np.ndarray]]], dict[str, list[Any]]]:
    """The inputs of `SeedEvidence` restricted to seed `index` (its own image bootstrap: one seed's view)."""
    return ({name: [seeds[index]] for name, seeds in per_image.items()},
            {name: [stats[index]] for name, stats in bleu.items()})
