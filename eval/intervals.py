"""Resampling intervals: every bootstrap, percentile interval and resampled p-value of pacs, in one place.

Two resamplers, each reproducible by hand from `numpy.random.default_rng(seed)`:

* `bootstrap(statistic, n_items, n_resamples, seed)`: the items (images, human judgements, image groups) drawn
  with replacement, per resample one `integers(0, n_items, size=n_items)`; `statistic(indices)` gives a dict of
  values. Calling it with the same `n_items` and `seed` for several rows draws the same indices for each, so their
  differences are paired. Used by the correlation benchmarks (`pacs correlate --bootstrap`), the system table
  (`pacs.eval.system_table`), the pipeline rows' intervals against XE (`paired_interval`) and the demo's Kendall
  comparisons (images as groups of candidates).
* `StratifiedBootstrap`: the paired, stratified bootstrap over training seeds and, within each seed, test images
  (rliable's practice: Agarwal et al. 2021; Henderson et al. 2018). One resample draws `S` seeds with replacement
  from the `S` training runs and, for every drawn seed, `N` images with replacement from its `N` test images
  (per resample first `integers(0, S, size=S)`, then `integers(0, N, size=(S, N))`); the statistic of a resample is
  the aggregate over the drawn seeds (the mean; the interquartile mean from 5 seeds) of each drawn seed's
  statistic on its drawn images. With one seed it is the ordinary paired bootstrap over images.

Intervals are percentile intervals of the resample values (`confidence_interval`: the (1 − level)/2 and
1 − (1 − level)/2 quantiles, NaN ignored). A difference is separated from 0 when its interval excludes 0
(`excludes_zero`); `best_rows` applies that rule to the best row of a column and its runner-up.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

logger = logging.getLogger(__name__)

LEVEL = 0.95
"""The level of every interval pacs reports."""
IQM_MIN_SEEDS = 5
METHOD = ("paired stratified bootstrap: seeds resampled with replacement, then the test images within each drawn "
          "seed; 95% percentile interval")


# ------------------------------------------------------------------------------------------ items with replacement
def bootstrap(statistic: Callable[[np.ndarray], Mapping[str, float]], n_items: int, n_resamples: int,
              seed: Any = 0, description: str = "bootstrap") -> dict[str, np.ndarray]:
    """Values of `statistic(indices)` (a dict name -> value) over `n_resamples` resamples of the items with
    replacement (`seed`: anything `numpy.random.default_rng` takes)."""
    rng = np.random.default_rng(seed)
    collected: dict[str, list[float]] = {}
    for _ in tqdm(range(n_resamples), desc=description, leave=False, disable=n_resamples < 20):
        indices = rng.integers(0, n_items, size=n_items)
        for key, value in statistic(indices).items():
            collected.setdefault(key, []).append(value)
    return {key: np.asarray(values) for key, values in collected.items()}


def percentile_interval(samples: Any, percentiles: Sequence[float]) -> list[float]:
    """`[low, high]`: the two `percentiles` (0–100) of the resample values, NaN ignored; NaNs when none is left."""
    values = np.asarray(samples, dtype=np.float64)
    if not (~np.isnan(values)).any():
        return [float("nan"), float("nan")]
    low, high = np.nanpercentile(values, list(percentiles))
    return [float(low), float(high)]


def confidence_interval(samples: Any, level: float = LEVEL) -> list[float]:
    """The `level` percentile interval of bootstrap samples."""
    tail = (1.0 - level) / 2.0 * 100.0
    return percentile_interval(samples, (tail, 100.0 - tail))


def paired_p_value(best: np.ndarray, other: np.ndarray) -> float:
    """One-sided paired bootstrap p-value that `other` is not worse than `best` ((#{other >= best} + 1)/(N + 1))."""
    return float((np.sum(other >= best) + 1) / (len(best) + 1))


def two_sided_p_value(delta: np.ndarray) -> float:
    """Two-sided paired bootstrap p-value of a difference: 2 min(P(delta <= 0), P(delta >= 0)), +1 smoothed."""
    finite = delta[np.isfinite(delta)]
    if not len(finite):
        return float("nan")
    below, above = np.sum(finite <= 0), np.sum(finite >= 0)
    return float(min(1.0, 2 * (min(below, above) + 1) / (len(finite) + 1)))


def excludes_zero(interval: Sequence[float | None] | None) -> bool:
    """Whether an interval `[low, high]` lies entirely on one side of 0 (False for a missing one)."""
    if not interval or interval[0] is None or interval[1] is None:
        return False
    low, high = float(interval[0]), float(interval[1])
    return low > 0.0 or high < 0.0


def paired_interval(model: Mapping[str, Sequence[float]], baseline: Mapping[str, Sequence[float]],
                    n_resamples: int, seed: int = 0, level: float = LEVEL) -> dict[str, list[float]]:
    """`{column: [low, high]}` of mean(model − baseline) over paired image resamples, for the columns both have
    whose per-image values are all finite (a column with a NaN is left out, logged)."""
    columns = [c for c in model if c in baseline]
    a = {c: np.asarray(model[c], dtype=np.float64) for c in columns}
    b = {c: np.asarray(baseline[c], dtype=np.float64) for c in columns}
    usable = []
    for column in columns:
        if len(a[column]) != len(b[column]):
            raise ValueError(f"{column}: {len(a[column])} model values but {len(b[column])} baseline values")
        if not (np.isfinite(a[column]).all() and np.isfinite(b[column]).all()):
            logger.warning("no interval for %s: some per-image values are missing (NaN)", column)
            continue
        usable.append(column)
    if not usable or n_resamples < 1 or not len(a[usable[0]]):
        return {}

    def statistic(indices: np.ndarray) -> dict[str, float]:
        return {c: float(a[c][indices].mean() - b[c][indices].mean()) for c in usable}

    samples = bootstrap(statistic, len(a[usable[0]]), n_resamples, seed, description="paired bootstrap")
    return {column: confidence_interval(samples[column], level) for column in usable}


def group_rows(groups: Sequence[Sequence[int]], drawn: np.ndarray) -> np.ndarray:
    """The rows of the drawn groups, in draw order (a resample of groups: all candidates of each drawn image)."""
    return np.concatenate([groups[i] for i in drawn])


def best_rows(values: Mapping[str, float], samples: Mapping[str, np.ndarray], sign: int,
              level: float = LEVEL) -> dict[str, Any] | None:
    """The best row of a column (largest `sign * value`) and whether it is separated from the runner-up.

    `samples[name]`: the row's statistic on the same resamples as every other row (paired). The record holds
    `best`, `runner_up`, `difference_ci` (the interval of sign·(best − runner-up)), `separated` (it excludes 0)
    and `rows`: the best alone when separated, else the best and every row whose interval with the best
    includes 0. None without two rows that have samples.
    """
    names = [name for name in values if values[name] is not None and name in samples]
    if len(names) < 2:
        return None
    ranked = sorted(names, key=lambda name: -sign * float(values[name]))
    best, runner_up = ranked[0], ranked[1]

    def versus_best(name: str) -> list[float]:
        return confidence_interval(sign * (np.asarray(samples[best]) - np.asarray(samples[name])), level)

    difference = versus_best(runner_up)
    separated = excludes_zero(difference)
    rows = [best] if separated else [best] + [name for name in ranked[1:] if not excludes_zero(versus_best(name))]
    return {"best": best, "runner_up": runner_up, "difference_ci": difference, "separated": separated,
            "rows": rows}


# ------------------------------------------------------------------------------------------ seeds, then images
def aggregate(per_seed: np.ndarray, axis: int = -1) -> np.ndarray | float:
    """The aggregate over seeds along `axis`: the mean, or the interquartile mean (25% cut at each end, as
    `rliable`) when there are `IQM_MIN_SEEDS` or more seeds."""
    from scipy.stats import trim_mean  # imported on use: scipy.stats takes seconds to import

    values = np.asarray(per_seed, dtype=np.float64)
    if values.shape[axis] >= IQM_MIN_SEEDS:
        return trim_mean(values, 0.25, axis=axis)
    return values.mean(axis=axis)


def point_name(n_seeds: int) -> str:
    """What the point estimate is for `n_seeds` seeds."""
    return "interquartile mean over seeds" if n_seeds >= IQM_MIN_SEEDS else "mean over seeds"


def resample_indices(n_seeds: int, n_images: int, n_resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`(seeds [B, S], images [B, S, N])`: the drawn seed of every slot and the drawn images of that slot."""
    rng = np.random.default_rng(seed)
    seeds = np.empty((n_resamples, n_seeds), dtype=np.int64)
    images = np.empty((n_resamples, n_seeds, n_images), dtype=np.int64)
    for b in range(n_resamples):
        seeds[b] = rng.integers(0, n_seeds, size=n_seeds)
        images[b] = rng.integers(0, n_images, size=(n_seeds, n_images))
    return seeds, images


@dataclass
class Estimate:
    """A point estimate (aggregate over seeds), its 95% interval and each seed's own value."""

    point: float
    interval: list[float]
    per_seed: list[float]


class StratifiedBootstrap:
    """The resamples of `n_seeds` runs × `n_images` paired test images; statistics evaluated on all of them."""

    def __init__(self, n_seeds: int, n_images: int, n_resamples: int, seed: int = 0) -> None:
        if n_seeds < 1 or n_images < 1 or n_resamples < 1:
            raise ValueError(f"a stratified bootstrap needs >= 1 seed, image and resample; got {n_seeds}, "
                             f"{n_images}, {n_resamples}")
        self.n_seeds, self.n_images, self.n_resamples = n_seeds, n_images, n_resamples
        self.seeds, self.images = resample_indices(n_seeds, n_images, n_resamples, seed)

    def describe(self) -> dict[str, object]:
        """What results.json records about the method."""
        return {"method": METHOD, "resamples": self.n_resamples, "seeds": self.n_seeds, "images": self.n_images,
                "point": point_name(self.n_seeds), "level": LEVEL}

    def per_seed_means(self, values: np.ndarray) -> np.ndarray:
        """`[B, S]`: for every resample and slot, the mean of the drawn seed's values on its drawn images
        (`values`: `[S, N]` per-image values)."""
        values = np.asarray(values, dtype=np.float64)
        self._check(values)
        return values[self.seeds[:, :, None], self.images].mean(axis=-1)

    def per_seed_statistic(self, statistic: Callable[[int, np.ndarray], float]) -> np.ndarray:
        """`[B, S]`: `statistic(seed index, image indices)` of every resample's slots (a corpus statistic)."""
        out = np.empty((self.n_resamples, self.n_seeds), dtype=np.float64)
        for b in range(self.n_resamples):
            for slot in range(self.n_seeds):
                out[b, slot] = statistic(int(self.seeds[b, slot]), self.images[b, slot])
        return out

    def estimate(self, full: np.ndarray, samples: np.ndarray) -> Estimate:
        """The estimate from each seed's statistic on all its images (`full`, `[S]`) and the resamples' per-slot
        statistics (`samples`, `[B, S]`, e.g. a difference of two `per_seed_means`)."""
        full = np.asarray(full, dtype=np.float64)
        resampled = np.asarray(aggregate(samples, axis=1), dtype=np.float64)
        return Estimate(float(aggregate(full)), confidence_interval(resampled, LEVEL), [float(v) for v in full])

    def mean_difference(self, model: np.ndarray, baseline: np.ndarray | None = None) -> Estimate:
        """The estimate of mean(model) − mean(baseline) (paired: the same images of the same seed), or of
        mean(model) without a baseline; both `[S, N]`."""
        model = np.asarray(model, dtype=np.float64)
        full = model.mean(axis=1)
        samples = self.per_seed_means(model)
        if baseline is not None:
            baseline = np.asarray(baseline, dtype=np.float64)
            full = full - baseline.mean(axis=1)
            samples = samples - self.per_seed_means(baseline)
        return self.estimate(full, samples)

    def ratio(self, numerator: tuple[np.ndarray, np.ndarray], denominator: tuple[np.ndarray, np.ndarray]
              ) -> Estimate | None:
        """The estimate of aggregate(numerator) / aggregate(denominator) on the same resamples (each a `(full [S],
        samples [B, S])` pair); None when the denominator's point is 0. Resamples with a non-finite ratio are
        left out of the interval."""
        own, top = numerator[0], denominator[0]
        if float(aggregate(top)) == 0.0:
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = (np.asarray(aggregate(numerator[1], axis=1))
                      / np.asarray(aggregate(denominator[1], axis=1)))
        return Estimate(float(aggregate(own) / aggregate(top)), confidence_interval(ratios[np.isfinite(ratios)], LEVEL),
                        [float(a / b) if b else float("nan") for a, b in zip(own, top)])

    def _check(self, values: np.ndarray) -> None:
        if values.shape != (self.n_seeds, self.n_images):
            raise ValueError(f"expected per-image values of shape ({self.n_seeds}, {self.n_images}), "
                             f"got {values.shape}")
