"""SCST's hacking monitor: drift of the captions on a fixed validation sample, next to the reward.

Every `scst.monitor_every` optimizer steps (and at the start — step 0 is the init model, the baseline every
drift is measured from — and after the last step) the model captions the first `scst.monitor_images`
validation images greedily (eval mode, no gradients; split over the processes) and one row goes to
`<output_dir>/monitor.csv`:

| column | what |
|---|---|
| `reward` | mean training reward of the validation captions (the same reward object; NaN values left out) |
| `cider` | corpus CIDEr-D ×100 against the validation references (XE's validation score) |
| `length` | mean words per caption (`pacs.eval.fluency.words`) |
| `rep1`..`rep4` | Rep-n (`pacs.eval.fluency.rep_n`: mean repeated n-grams per caption) |
| `distinct1`, `distinct2` | distinct-n: distinct n-grams / all n-grams over the sample's captions |
| `incorrect` | %Incorrect (`pacs.eval.fluency`: % of captions ending with a preposition, conjunction or determiner) |
| `grammar_errors` | % of captions with a grammar error (`pacs.eval.grammar`, Harper); NaN when no backend |
| `zero_spread` | fraction of the training images since the previous row whose k rewards were all equal (advantage 0: nothing learnt; `pacs.captioner.modeling.reward_spread`); NaN at step 0 |

`length`..`incorrect` are `pacs.eval.caption_drift.caption_stats` (the same as `pacs.rewards.monitor`'s signals).
A logging WARNING names the signature when the reward rose above its step-0 value by more than
`monitor_reward_rise` while a drift from step 0 passed its threshold (`gaming_signatures`).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pacs.captioner.modeling.decoding import decode_texts, greedy
from pacs.captioner.modeling.features import FeatureCache
from pacs.captioner.modeling.train_xe import cider_validator
from pacs.eval.caption_drift import DriftThresholds, caption_stats, drift, drift_signatures, reward_rose
from pacs.eval.grammar import grammar_error_rate
from pacs.metric.common.io import write_text_atomic

logger = logging.getLogger(__name__)

MONITOR_COLUMNS = ("step", "reward", "cider", "length", "rep1", "rep2", "rep3", "rep4", "distinct1", "distinct2",
                   "incorrect", "grammar_errors", "zero_spread")
_OLD_COLUMNS = MONITOR_COLUMNS[:-1]  # monitor files written before `zero_spread` (pacs 0.5) still resume
MONITOR_FILE = "monitor.csv"


@dataclass
class GamingThresholds(DriftThresholds):
    """How far a monitored statistic may drift from step 0 before a rising reward is called gaming."""

    cider_drop: float = 0.2  # relative decrease of the validation CIDEr-D (0.2: −20%)


def gaming_signatures(start: Mapping[str, float], now: Mapping[str, float],
                      thresholds: GamingThresholds) -> list[tuple[str, str]]:
    """[(signature, drift)] for each drift of `now` from `start` beyond its threshold, when the reward rose.

    `pacs.eval.caption_drift.drift_signatures` and a relative drop of the validation CIDEr-D; empty when the reward
    did not rise by more than `reward_rise` (or a value is missing / NaN).
    """
    if not reward_rose(start, now, thresholds.reward_rise):
        return []
    found = drift_signatures(start, now, thresholds)
    cider = drift(start, now, "cider")
    if cider is not None and start["cider"] > 0 and -cider / start["cider"] > thresholds.cider_drop:
        found.append(("reward/CIDEr-D divergence", f"CIDEr-D {cider:+.3g} ({100 * cider / start['cider']:+.0f}%)"))
    return found


def gaming_warning(step: int, start: Mapping[str, float], now: Mapping[str, float],
                   thresholds: GamingThresholds) -> str | None:
    """The warning text for `now` (None when no signature): 'reward +x while rep2 +y, ...: repetition gaming'."""
    found = gaming_signatures(start, now, thresholds)
    if not found:
        return None
    rise = now["reward"] - start["reward"]
    return (f"scst step {step}: validation reward {rise:+.3g} ({start['reward']:.4g} -> {now['reward']:.4g}) while "
            f"{', '.join(drift for _, drift in found)} since step {int(start['step'])}: "
            f"{', '.join(name for name, _ in found)}")


def read_monitor_rows(path: Path, up_to_step: int | None = None) -> list[dict[str, float]]:
    """The rows of a monitor CSV (those after `up_to_step` dropped); none when absent or unreadable."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    header = tuple(lines[0].split(",")) if lines else ()
    if header not in (MONITOR_COLUMNS, _OLD_COLUMNS):
        logger.warning("%s is not an SCST monitor file; starting it again", path)
        return []
    try:
        rows = [{"zero_spread": math.nan, **dict(zip(header, map(float, line.split(","))))}
                for line in lines[1:] if line]
    except ValueError:
        logger.warning("%s is not an SCST monitor file; starting it again", path)
        return []
    return [row for row in rows if up_to_step is None or row["step"] <= up_to_step]


def write_monitor_rows(path: Path, rows: Sequence[Mapping[str, float]]) -> None:
    """Write the rows (atomically) with the header `MONITOR_COLUMNS`."""
    lines = [",".join(MONITOR_COLUMNS)]
    lines += [",".join(str(int(row["step"])) if c == "step" else f"{row[c]:.8g}" for c in MONITOR_COLUMNS)
              for row in rows]
    write_text_atomic(path, "\n".join(lines) + "\n")


class GrammarRate:
    """% of captions with a grammar error by `pacs.eval.grammar`'s default backend, NaN (noted once) without one."""

    def __init__(self) -> None:
        self.checker: Any = None
        self.unavailable = False

    def __call__(self, captions: Sequence[str]) -> float:
        """The rate, or NaN."""
        if self.unavailable:
            return float("nan")
        if self.checker is None:
            from pacs.eval.grammar import build_grammar_checker
            from pacs.metric.common.errors import PacsError

            try:
                self.checker = build_grammar_checker()
            except (PacsError, ImportError, OSError) as error:
                logger.warning("scst monitor: grammar_errors not measured (NaN): %s", error)
                self.unavailable = True
                return float("nan")

        return float(grammar_error_rate(list(captions), self.checker).rate)


class HackingMonitor:
    """Monitors SCST on a fixed validation sample (see the module docstring); one CSV row per monitored step."""

    def __init__(self, path: Path, validation: Mapping[str, Sequence[str]], features: FeatureCache, vocab: Any,
                 reward: Any, thresholds: GamingThresholds, max_length: int, every: int, last_step: int,
                 resume_step: int | None = None, batch_size: int = 100, policy: Any = None) -> None:
        self.path, self.features, self.vocab, self.reward = path, features, vocab, reward
        self.policy = policy  # a `pacs.captioner.modeling.policy.CaptionPolicy`: captions through it (features unused)
        self.references = {str(k): list(v) for k, v in validation.items()}
        self.ids = list(self.references)
        self.thresholds, self.max_length, self.every, self.last_step = thresholds, max_length, every, last_step
        self.batch_size = batch_size
        self.rows = read_monitor_rows(path, resume_step) if resume_step is not None else []
        self.grammar = GrammarRate()

    def due(self, step: int) -> bool:
        """Whether step `step` is monitored (step 0, every `every`-th, the last) and not monitored yet."""
        wanted = step == 0 or step == self.last_step or (self.every > 0 and step % self.every == 0)
        return wanted and all(int(row["step"]) != step for row in self.rows)

    @torch.no_grad()
    def captions(self, accelerator: Any, model: Any) -> dict[str, str]:
        """Greedy captions of the sample (each process its share, gathered on every process)."""
        from accelerate.utils import gather_object

        was_training = model.training
        model.eval()
        local = list(self.ids[accelerator.process_index::accelerator.num_processes])
        out: dict[str, str] = {}
        try:
            for start in range(0, len(local), self.batch_size):
                chunk = local[start:start + self.batch_size]
                if self.policy is not None:
                    batch = self.policy.batch(chunk, accelerator.device)
                    texts = self.policy.decode(self.policy.greedy(model, batch, self.max_length))
                else:
                    decoded = greedy(model, self.features.get(chunk).to(accelerator.device), self.max_length)
                    texts = decode_texts(self.vocab, decoded.tokens)
                out.update({i: row[0] for i, row in zip(chunk, texts)})
        finally:
            model.train(was_training)
        if accelerator.num_processes > 1:
            return {k: v for part in gather_object([out]) for k, v in part.items()}
        return out

    def score(self, step: int, captions: Mapping[str, str]) -> dict[str, float]:
        """The row of `step` for the sample's captions."""

        ids = [i for i in self.ids if i in captions]
        texts = [captions[i] for i in ids]
        refs = [self.references[i] for i in ids]
        values = torch.as_tensor(self.reward(ids, [[t] for t in texts], refs)).float().view(-1)
        finite = values[torch.isfinite(values)]
        row = {"step": float(step), "reward": float(finite.mean()) if len(finite) else float("nan"),
               "cider": cider_validator(dict(zip(ids, texts)), dict(zip(ids, refs)))}
        row.update(caption_stats(texts))
        row["grammar_errors"] = self.grammar(texts)
        return row

    def __call__(self, accelerator: Any, model: Any, step: int, zero_spread: float = math.nan) -> dict[str, float]:
        """Monitor step `step`: caption, score (main process), share the row, write the CSV, warn on gaming.

        `zero_spread`: the training reward's zero-spread fraction since the previous row (a column of the row)."""
        from accelerate.utils import broadcast_object_list

        captions = self.captions(accelerator, model)
        box = [self.score(step, captions) if accelerator.is_main_process else None]
        if accelerator.num_processes > 1:
            broadcast_object_list(box, from_process=0)
        row = {**box[0], "zero_spread": float(zero_spread)}
        self.rows.append(row)
        if accelerator.is_main_process:
            write_monitor_rows(self.path, self.rows)
            message = gaming_warning(step, self.rows[0], row, self.thresholds) if step > 0 else None
            if message:
                logger.warning("%s", message)
        return row
