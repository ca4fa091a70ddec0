"""SCST guards against reward hacking that act on the samples and the run (issue 44; each off by default).

- the length-conditional reward mask (`scst.length_mask`, `scst.length_mask_slack`): a sampled caption whose
  length in words leaves its image's reference band `[min − slack, max + slack]` (the words of the image's
  references) gets its own baseline as reward, so its advantage is 0; the other samples are unchanged;
- the CIDEr-D anchor (`scst.cider_anchor`): the reward spec gains a `cider:<weight>` term, mixed by
  `pacs.rewards.mix` like any other term (`anchored_reward_spec`);
- early stopping on the hacking monitor (`scst.stop_on_gaming`): the run stops at the first monitored step whose
  validation row carries a gaming signature (`pacs.captioner.modeling.hacking_monitor.gaming_signatures`), and
  the model kept is the last monitored step before it (`GamingStop`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from pacs.captioner.modeling.hacking_monitor import GamingThresholds, gaming_signatures
from pacs.metric.common.errors import InputError
from pacs.rewards.registry import parse_reward_spec

ANCHOR_TERM = "cider"


def length_band_mask(captions: Sequence[Sequence[str]], references: Sequence[Sequence[str]],
                     slack: int) -> torch.Tensor:
    """`[B, k]` booleans: whether each caption's word count lies in `[min − slack, max + slack]` of its image's
    reference word counts (`captions` `[B][k]`, `references` `[B][*]`)."""
    rows = []
    for image_captions, refs in zip(captions, references):
        lengths = [len(ref.split()) for ref in refs]
        if not lengths:
            raise InputError("scst.length_mask: an image has no reference captions to take the length band from")
        low, high = min(lengths) - slack, max(lengths) + slack
        rows.append([low <= len(caption.split()) <= high for caption in image_captions])
    return torch.tensor(rows, dtype=torch.bool)


def mask_advantages(advantages: torch.Tensor, in_band: torch.Tensor) -> torch.Tensor:
    """The advantages `[B, k]` with those of out-of-band samples set to 0 (their reward replaced by their
    baseline)."""
    return torch.where(in_band.to(advantages.device), advantages, torch.zeros_like(advantages))


def anchored_reward_spec(spec: str, weight: float) -> str:
    """`spec` with a CIDEr-D term of `weight` added (`spec` itself when `weight` is 0): "pac-s++" ->
    "pac-s++:1,cider:0.5"; a spec that already has a `cider` term is refused."""
    if not weight:
        return spec
    terms = parse_reward_spec(spec)
    if any(name == ANCHOR_TERM for name, _ in terms):
        raise InputError(f"scst.cider_anchor={weight:g}: reward {spec!r} already has a {ANCHOR_TERM!r} term; set its "
                         "weight in the spec or leave cider_anchor at 0")
    return ",".join([*(f"{name}:{w:g}" for name, w in terms), f"{ANCHOR_TERM}:{weight:g}"])


def check_anchor(reward: object, weight: float) -> None:
    """InputError unless `reward` (a built reward) carries the CIDEr-D anchor term at `weight` (with weight > 0)."""
    if not weight:
        return
    terms = {name: w for name, w, _ in getattr(reward, "components", ())}
    if terms.get(ANCHOR_TERM) != weight:
        raise InputError(f"scst.cider_anchor={weight:g}: the reward has no {ANCHOR_TERM}:{weight:g} term; build it from "
                         "pacs.captioner.modeling.scst_guards.anchored_reward_spec(scst.reward, scst.cider_anchor)")


class GamingStop:
    """Early stopping on the hacking monitor: `update(row)` per monitor row; `kept_step` is the last monitored step
    without a gaming signature (step 0, the init model, has none by definition), `stopped_step` the first step
    with one (0: none yet)."""

    def __init__(self, thresholds: GamingThresholds, kept_step: int = 0, stopped_step: int = 0) -> None:
        self.thresholds, self.kept_step, self.stopped_step = thresholds, kept_step, stopped_step
        self.signatures: list[tuple[str, str]] = []

    def update(self, start: Mapping[str, float], row: Mapping[str, float]) -> bool:
        """Record `row` (drifts measured from `start`, the step-0 row); whether the model of its step is kept."""
        step = int(row["step"])
        self.signatures = gaming_signatures(start, row, self.thresholds) if step > 0 else []
        if self.signatures:
            self.stopped_step = step
            return False
        self.kept_step = step
        return True


def stop_point(rows: Sequence[Mapping[str, float]], thresholds: GamingThresholds) -> tuple[int, int]:
    """(kept step, stopped step) for a sequence of monitor rows (the first is step 0): where `GamingStop` stops."""
    watch = GamingStop(thresholds)
    for row in rows:
        watch.update(rows[0], row)
        if watch.stopped_step:
            break
    return watch.kept_step, watch.stopped_step
