"""SCST's degenerate-reward watch: a reward that gives the k samples of an image one value teaches nothing.

With a mean (or leave-one-out) baseline, an image whose k rewards are all equal has advantage 0 for every
sample, so it adds nothing to the gradient. `spread_counts` counts, per step, the images whose reward spread
(max − min over the k samples) is zero, and among them those scored exactly 0 and those whose k captions are
the same text; `SpreadWatch` keeps the per-step fractions and, once the mean over the last `window` steps (the
whole run when it is shorter) exceeds `threshold`, returns one warning naming the reward and the likely cause:

- every score exactly 0: a contrastive reward is `w·max(cos, 0)`, so the reward model's cosines are ≤ 0
  (an untrained or mismatched reward model); CIDEr-D is 0 when no n-gram of a sample is in the references;
- k = 1: one sample per image has no spread;
- identical captions: the k samples are one caption (a collapsed policy, or beams that end alike);
- otherwise: the reward gives different captions one value (a constant or saturated reward).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pacs.metric.scoring.registry import METRICS
from pacs.rewards.registry import parse_reward_spec

#: counters summed over the images of a step (and over processes)
COUNTS = ("images", "zero_spread", "all_zero", "identical")


def spread_counts(rewards: torch.Tensor, captions: Sequence[Sequence[str]]) -> dict[str, int]:
    """Counts over the images of `rewards` `[B, k]` (non-finite values ignored): images, zero spread, all-zero
    scores and identical captions (the latter two among the zero-spread images)."""
    rewards = rewards.detach().float().cpu()
    finite = torch.isfinite(rewards)
    high = torch.where(finite, rewards, torch.full_like(rewards, -torch.inf)).max(1).values
    low = torch.where(finite, rewards, torch.full_like(rewards, torch.inf)).min(1).values
    scale = torch.maximum(high.abs(), low.abs()).clamp(min=1.0)
    zero = (finite.any(1) & ((high - low) <= 1e-6 * scale)).tolist()
    all_zero = [z and bool((rewards[i][finite[i]] == 0).all()) for i, z in enumerate(zero)]
    identical = [z and len({c.strip() for c in captions[i]}) == 1 for i, z in enumerate(zero)]
    return {"images": len(zero), "zero_spread": sum(zero), "all_zero": sum(all_zero), "identical": sum(identical)}


def _contrastive(reward: str) -> bool:
    """Whether reward spec `reward` has a contrastive term (clip-s, pac-s++, ...: `w·max(cos, 0)`)."""

    try:
        return any(name in METRICS for name, _ in parse_reward_spec(reward))
    except ValueError:  # InputError: a reward built in code under a free-form name
        return False


def likely_cause(counts: Mapping[str, float], k: int, reward: str = "") -> str:
    """The most likely reason for a zero spread, from summed `spread_counts` (`reward`: the spec, for the wording)."""
    zero = max(float(counts.get("zero_spread", 0)), 1.0)
    if counts.get("all_zero", 0) >= 0.5 * zero:
        if _contrastive(reward):
            return ("every sample scored exactly 0: a contrastive reward is w·max(cos, 0), so the reward model gives "
                    "these captions cosines <= 0 (an untrained or mismatched reward model?)")
        return ("every sample scored exactly 0 (for cider: no n-gram of the samples is in the references; an "
                "under-trained captioner?)")
    if k < 2:
        return "scst.k=1: one sample per image has no spread; set scst.k >= 2"
    if counts.get("identical", 0) >= 0.5 * zero:
        return (f"the k={k} samples of an image are one caption (a collapsed policy, or beams that end alike); "
                "try scst.samples=multinomial or a larger scst.k")
    return "the reward gives different captions one value (a constant or saturated reward?)"


class SpreadWatch:
    """Per-step zero-spread fractions of one SCST run and the warning they raise (once)."""

    def __init__(self, reward: str, k: int, window: int, threshold: float, total_steps: int,
                 state: Mapping[str, Any] | None = None) -> None:
        self.reward, self.k, self.threshold = reward, k, threshold
        self.window = max(1, min(window, total_steps))
        state = dict(state or {})
        self.fractions: list[float] = [float(f) for f in state.get("fractions", [])]
        self.totals: dict[str, int] = {key: int(state.get("totals", {}).get(key, 0)) for key in COUNTS}
        self.warning: str | None = state.get("warning")
        self.since_monitor: dict[str, int] = {key: 0 for key in COUNTS}

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (a resumed run continues the same window)."""
        return {"fractions": list(self.fractions), "totals": dict(self.totals), "warning": self.warning}

    def update(self, step: int, counts: Mapping[str, int]) -> str | None:
        """Add step `step`'s summed counts; the warning text the first time the window's mean passes the threshold."""
        for key in COUNTS:
            self.totals[key] += int(counts.get(key, 0))
            self.since_monitor[key] += int(counts.get(key, 0))
        self.fractions.append(counts["zero_spread"] / counts["images"] if counts.get("images") else 0.0)
        recent = self.fractions[-self.window:]
        if self.warning is not None or len(recent) < self.window:
            return None
        mean = sum(recent) / len(recent)
        if mean <= self.threshold:
            return None
        self.warning = (f"reward {self.reward!r} is degenerate: over steps {step - self.window + 1}-{step} its spread "
                        f"within the k={self.k} samples was zero for {100 * mean:.0f}% of the images, so their "
                        f"advantages are 0 and SCST learns nothing from them; likely cause: "
                        f"{likely_cause(self.totals, self.k, self.reward)}")
        return self.warning

    def since_last_monitor(self) -> float:
        """The zero-spread fraction of the images since the previous call (NaN when none), for monitor.csv."""
        counts, self.since_monitor = self.since_monitor, {key: 0 for key in COUNTS}
        return counts["zero_spread"] / counts["images"] if counts["images"] else float("nan")

    @property
    def fraction(self) -> float | None:
        """The zero-spread fraction over every image of the run (None before the first step)."""
        return self.totals["zero_spread"] / self.totals["images"] if self.totals["images"] else None

    def summary(self) -> dict[str, Any]:
        """The stage summary's part: `zero_spread_fraction`, `degenerate_reward` (bool) and the warning text."""
        fraction = self.fraction
        return {"zero_spread_fraction": None if fraction is None else round(fraction, 4),
                "degenerate_reward": self.warning is not None, "degenerate_warning": self.warning}
