"""A hacking monitor for any RL loop that calls a reward on its completions (TRL's `GRPOTrainer` included).

`CompletionMonitor` is pacs' SCST hacking monitor (`pacs.captioner.modeling.hacking_monitor`) for loops pacs does not
run: each `observe(captions, rewards)` records the batch's mean reward and the drift signals of the completions —
mean length in words, Rep-1..4 (`pacs.eval.fluency.rep_n`), distinct-1/2 (distinct n-grams / all n-grams over the
batch) and %Incorrect — the SCST monitor's columns, both from `pacs.eval.caption_drift`. Every `every` calls it compares
the mean of the latest `every` calls with the mean of the first `every` and logs one WARNING naming the
signature (repetition gaming, length gaming, diversity collapse, bad endings) when the reward rose by more than
`reward_rise` while a signal drifted past its threshold (the SCST monitor's defaults). The SCST monitor scores
greedy captions of fixed validation images; this one sees the training completions, so its drifts include the
sampling noise of a batch (hence the window).

With TRL: `pacs.rewards.trl.reward_function(spec, monitor=CompletionMonitor())` observes every call, and with TRL's
`log_metric` the signals go to the trainer's logs as `<name>/length`, `<name>/rep2`, ...
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pacs.eval.caption_drift import DriftThresholds, caption_stats, drift_signatures

logger = logging.getLogger(__name__)

SIGNALS = ("length", "rep1", "rep2", "rep3", "rep4", "distinct1", "distinct2", "incorrect")
__all__ = ["SIGNALS", "CompletionMonitor", "DriftThresholds", "completion_signals", "drift_signatures"]

completion_signals = caption_stats  # the name `pacs.rewards.monitor` documents for the batch's drift signals


def _mean_row(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    keys = ("reward", *SIGNALS)
    out = {}
    for key in keys:
        values = [row[key] for row in rows if math.isfinite(row.get(key, math.nan))]
        out[key] = sum(values) / len(values) if values else math.nan
    return out


@dataclass
class CompletionMonitor:
    """Records the drift signals of the completions of each reward call and warns on a gaming signature.

    `rows` holds one dict per call (`call`, `step` when known, `reward`, the `SIGNALS`); `warnings` the warning
    texts logged. `every` (>= 1): the window and the interval of the comparisons.
    """

    every: int = 10
    thresholds: DriftThresholds = field(default_factory=DriftThresholds)
    rows: list[dict[str, float]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"CompletionMonitor: every={self.every!r}: expected an int >= 1")

    def observe(self, captions: Sequence[str], rewards: Sequence[float | None], step: int | None = None,
                log_metric: Callable[[str, float], None] | None = None, prefix: str = "monitor") -> dict[str, float]:
        """Record one call's completions and rewards (None / NaN left out of the mean); returns its row."""
        finite = [float(r) for r in rewards if r is not None and math.isfinite(float(r))]
        row = {"call": float(len(self.rows) + 1), "reward": sum(finite) / len(finite) if finite else math.nan,
               **completion_signals(captions)}
        if step is not None:
            row["step"] = float(step)
        self.rows.append(row)
        if log_metric is not None:
            for key in SIGNALS:
                if math.isfinite(row[key]):
                    log_metric(f"{prefix}/{key}", row[key])
        if len(self.rows) >= 2 * self.every and len(self.rows) % self.every == 0:
            self._check()
        return row

    def _check(self) -> None:
        start, now = _mean_row(self.rows[:self.every]), _mean_row(self.rows[-self.every:])
        found = drift_signatures(start, now, self.thresholds)
        if not found:
            return
        text = (f"reward monitor, calls {len(self.rows) - self.every + 1}-{len(self.rows)}: mean reward "
                f"{now['reward'] - start['reward']:+.3g} ({start['reward']:.4g} -> {now['reward']:.4g}) while "
                f"{', '.join(drift for _, drift in found)} since calls 1-{self.every}: "
                f"{', '.join(name for name, _ in found)}")
        self.warnings.append(text)
        logger.warning("%s", text)
