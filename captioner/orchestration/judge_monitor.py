"""The judge's curves of an SCST run (`scst.judge_monitor_every`, on a data set with an exact judge: the demo world).

At step 0 (the starting model), every `judge_monitor_every` steps and at the last step, greedy captions of the first
`judge_monitor_images` validation images are scored by the data set's judge, CIDEr-D and the contrastive metrics
and appended to `<stage>/judge_monitor.csv` (the report's `scst_val` panels, one line per run). The demo's SCST
stages and a recipe's share it; the hacking monitor (`scst.monitor_every`, `<stage>/monitor.csv`) is the trainer's.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pacs.captioner.modeling.train_scst import scst_total_steps
from pacs.captioner.orchestration.data_sources import CaptionJudge, data_mapping, judge_of
from pacs.captioner.orchestration.evaluation import contrastive_per_image
from pacs.captioner.orchestration.judge_correlation import per_caption_text_metrics
from pacs.metric.common.io import write_text_atomic

logger = logging.getLogger(__name__)

MONITOR_COLUMNS = ("Judge-acc", "C", "CLIP-S", "PAC-S++", "RefPAC-S++", "Length")
"""The curves' columns, those a run can compute (a recipe without a PAC-S++ model has no PAC-S++ curve)."""
JUDGE_MONITOR_FILE = "judge_monitor.csv"
"""The judge's curve of an SCST stage, in its folder; `monitor.csv` is the hacking monitor's."""

Captioner = Callable[[Any, list[str]], dict[str, str]]
"""(model, image ids) -> {image id: greedy caption}."""


def policy_captioner(policy: Any, batch_size: int = 100) -> Captioner:
    """(model, image ids) -> greedy captions of a `pacs.captioner.modeling.policy.CaptionPolicy`'s model, in eval mode
    without gradients (its training mode restored after)."""

    @torch.no_grad()
    def caption(model: Any, image_ids: list[str]) -> dict[str, str]:
        device, was_training = next(model.parameters()).device, model.training
        model.eval()
        captions: dict[str, str] = {}
        try:
            for start in range(0, len(image_ids), batch_size):
                chunk = image_ids[start:start + batch_size]
                tokens = policy.greedy(model, policy.batch(chunk, device), policy.max_length)
                captions.update({image_id: row[0] for image_id, row in zip(chunk, policy.decode(tokens))})
        finally:
            model.train(was_training)
        return captions

    return caption


def monitor_row(captions: Mapping[str, str], references: Mapping[str, Sequence[str]],
                image_paths: Mapping[str, Any], scorers: Mapping[str, Any], judge: CaptionJudge) -> dict[str, float]:
    """The monitored columns (means over `captions`) of one set of validation captions: the judge's Judge-acc,
    C (CIDEr-D x100 of lower-cased, space-tokenised captions: no Java call), CLIP-S / PAC-S++ / RefPAC-S++ of the
    families `scorers` has ({'clip', 'pac-s++'}) and Length (words)."""
    ids = list(captions)
    texts = [captions[i] for i in ids]
    values: dict[str, np.ndarray] = dict(judge(ids, texts))
    values["C"] = 100 * per_caption_text_metrics(texts, [references[i] for i in ids])["cider"]
    values.update(contrastive_per_image(captions, references, image_paths, scorers))
    values["Length"] = np.asarray([len(c.split()) for c in texts], dtype=float)
    return {column: float(np.mean(values[column])) for column in MONITOR_COLUMNS if column in values}


class JudgeMonitor:
    """`train_scst`'s `on_step`: the judge's curve of one SCST run (module docstring), written by the main process."""

    def __init__(self, ids: Sequence[str], references: Mapping[str, Sequence[str]], image_paths: Mapping[str, Any],
                 scorers: Mapping[str, Any], judge: CaptionJudge, caption: Captioner, out: Path, every: int,
                 last_step: int, is_main_process: bool = True) -> None:
        self.ids, self.references, self.image_paths = list(ids), references, image_paths
        self.scorers, self.judge, self.caption, self.out = scorers, judge, caption, Path(out)
        self.every, self.last_step, self.is_main_process = every, last_step, is_main_process
        self.rows: list[dict[str, float]] = read_curve(self.out)  # a resumed stage keeps the rows before its step
        self.first_call = True

    def __call__(self, step: int, model: Any) -> None:
        """Score the model at `step` when it is due (main process only; the others go on)."""
        if self.first_call:
            self.rows = [row for row in self.rows if row["step"] < step]
            self.first_call = False
        if not self.is_main_process or not self.ids or (step % self.every and step != self.last_step):
            return
        captions = self.caption(model, self.ids)
        for scorer in self.scorers.values():  # each row from empty caches: the same batches after a resume
            scorer.clear_caches()
        self.rows.append({"step": step, **monitor_row(captions, self.references, self.image_paths, self.scorers,
                                                      self.judge)})
        columns = ["step", *(c for c in MONITOR_COLUMNS if c in self.rows[-1])]
        lines = [",".join(columns)] + [",".join(f"{row[c]:.6g}" for c in columns) for row in self.rows]
        write_text_atomic(self.out, "\n".join(lines) + "\n")

    def reference(self) -> dict[str, float]:
        """The starting model's row (step 0) without its step; {} when the curve does not start at step 0."""
        if not self.rows or self.rows[0]["step"] != 0:
            return {}
        return {column: value for column, value in self.rows[0].items() if column != "step"}


def recipe_judge_monitor(config: Any, scst: Any, n_train: int, caption: Captioner,
                         validation: Mapping[str, Sequence[str]], image_paths: Mapping[str, Any],
                         scorers: Mapping[str, Any], is_main_process: bool) -> JudgeMonitor | None:
    """The judge's curve of a recipe's SCST stage (`scst`: its trainer config, written to its output folder; over
    `n_train` training images) on the first `judge_monitor_images` validation images, with the training data set's
    judge; None when `scst.judge_monitor_every` is 0 (`config`: the `PipelineConfig`)."""
    section = config.scst
    if not section.judge_monitor_every:
        return None
    judge = judge_of(data_mapping(config.data))
    if judge is None:  # PipelineConfig.validate refuses it first
        raise ValueError(f"data set {config.data.name!r} has no judge for scst.judge_monitor_every")
    ids = list(validation)[:section.judge_monitor_images]
    return JudgeMonitor(ids, validation, {i: image_paths[i] for i in ids}, scorers, judge, caption,
                        Path(scst.output_dir) / JUDGE_MONITOR_FILE, section.judge_monitor_every,
                        scst_total_steps(scst, n_train), is_main_process)


def read_curve(path: Path) -> list[dict[str, float]]:
    """The rows of a judge curve written before (none when absent or unreadable: it starts again)."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines:
        return []
    columns = lines[0].split(",")
    try:
        return [dict(zip(columns, map(float, line.split(",")))) for line in lines[1:] if line]
    except ValueError:
        logger.warning("%s is not a monitor curve; starting it again", path)
        return []
