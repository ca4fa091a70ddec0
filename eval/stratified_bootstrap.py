"""Paired, stratified bootstrap over training seeds and, within each seed, test images (rliable's practice:
Agarwal et al. 2021; Henderson et al. 2018).

One resample draws `S` seeds with replacement from the `S` training runs and, for every drawn seed, `N` images
with replacement from its `N` test images; the statistic of a resample is the aggregate over the drawn seeds
(the mean; the interquartile mean where there are 5 or more seeds) of each drawn seed's statistic on its drawn
images. The point estimate is the same aggregate over the seeds on all their images. Every column and every row
is computed on the same resamples (paired), so a difference `model − baseline` is the aggregate of the per-seed
differences. The interval is the 2.5–97.5 percentile of the resample statistics (`pacs.eval.correlation.confidence_interval`).

The resample indices come from `numpy.random.default_rng(seed)`, per resample first `integers(0, S, size=S)`
(the seeds) then `integers(0, N, size=(S, N))` (the images of each drawn seed), so they can be recomputed by hand.
With one seed it is the ordinary paired bootstrap over images.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
IQM_MIN_SEEDS = 5
METHOD = ("paired stratified bootstrap: seeds resampled with replacement, then the test images within each drawn "
          "seed; 95% percentile interval")


def aggregate(per_seed: np.ndarray, axis: int = -1) -> np.ndarray | float:
    """The aggregate over seeds along `axis`: the mean, or the interquartile mean (25% cut at each end, as
    `rliable`) when there are `IQM_MIN_SEEDS` or more seeds."""
    from scipy.stats import trim_mean

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
        from pacs.eval.correlation import confidence_interval

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

    def _check(self, values: np.ndarray) -> None:
        if values.shape != (self.n_seeds, self.n_images):
            raise ValueError(f"expected per-image values of shape ({self.n_seeds}, {self.n_images}), "
                             f"got {values.shape}")
