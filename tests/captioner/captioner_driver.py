"""Subprocess driver for the multi-process and kill/resume tests (run with python or accelerate launch).

usage:
  captioner_driver.py multi OUT IMAGES_DIR XE_MICRO SCST_MICRO   features + XE + SCST (beams, dropout off)
  captioner_driver.py scst OUT MICRO STEPS KILL_AT_CALL          SCST, dropout on, multinomial samples;
                                                                 SIGKILLs itself at reward call KILL_AT_CALL
  captioner_driver.py scst-learned OUT MICRO STEPS KILL_AT_CALL  the same with a learned reward (tiny CLIP)
  captioner_driver.py xe OUT MICRO STEPS KILL_AT_VALIDATION       XE, dropout on, validated every step;
                                                                 SIGKILLs itself in validation KILL_AT_VALIDATION
Prints `RESULT <name> <json list of float reprs>` lines.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from captioner_testkit import overlap_reward, tiny_checkpoint, tiny_data, tiny_model_config

from pacs.captioner.modeling.train_scst import SCSTConfig, train_scst
from pacs.captioner.modeling.train_xe import XEConfig, train_xe
from pacs.captioner.modeling.training_setup import ScheduleConfig, process_state
from pacs.captioner.orchestration.launching import relaunch_cpu_processes


def emit(name: str, values: list[float]) -> None:
    """Print one result line (main process only)."""
    if process_state().is_main_process:
        print(f"RESULT {name} " + json.dumps([repr(float(x)) for x in values]), flush=True)


def run_features(out: Path, images_dir: Path, n: int) -> list[float]:
    """Extract grid features of `n` Flickr8k images with a tiny CLIP; return one checksum per image."""
    from pacs.captioner.modeling.features import extract_features
    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config

    paths = sorted(images_dir.glob("*.jpg"))[:n]
    backbone = build_backbone_from_config(tiny_clip_config(), seed=0)
    # one image per forward pass: 7 images in batches of 2 would put the last one alone on one process and beside
    # another on two (ids[rank::world]), and an fp32 GEMM may round a batch of another size differently
    cache = extract_features(backbone, {p.stem: p for p in paths}, out, batch_size=1, shard_size=2,
                             accelerator=process_state())
    return [float(cache.get([p.stem]).double().sum()) for p in paths]


def run_xe(out: Path, data_dir: Path, micro: int, steps: int) -> tuple[list[float], float]:
    """A few XE steps, dropout off, validated (beam search split over processes) every 3 steps."""
    from pacs.captioner.modeling.vocab import build_vocab

    cache, train, val = tiny_data(data_dir)
    vocab = build_vocab("word", [c for _, c in train], min_count=1, max_length=8)
    config = XEConfig(output_dir=str(out), max_steps=steps, batch_size=32, micro_batch_size=micro,
                      schedule=ScheduleConfig(warmup_steps=2, constant_until=5, decay_until=8, peak_lr=3e-3,
                                              final_lr=1e-4), eval_every=3, val_beam_size=2, save_every=1000,
                      log_every=1, trackers=[])
    result = train_xe(config, tiny_model_config(dropout=0.0), vocab, cache, train, val)
    return result.losses, result.best_score


def run_xe_resumable(out: Path, data_dir: Path, micro: int, steps: int, kill_at: int) -> list[float]:
    """XE with dropout on, validated every step, checkpoints every 3 steps; SIGKILL in validation `kill_at`."""
    from pacs.captioner.modeling.train_xe import cider_validator
    from pacs.captioner.modeling.vocab import build_vocab

    calls = {"n": 0}

    def validate(captions, references):
        calls["n"] += 1
        if calls["n"] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return cider_validator(captions, references)

    cache, train, val = tiny_data(data_dir)
    vocab = build_vocab("word", [c for _, c in train], min_count=1, max_length=8)
    config = XEConfig(output_dir=str(out), max_steps=steps, batch_size=16, micro_batch_size=micro,
                      schedule=ScheduleConfig(warmup_steps=2, constant_until=5, decay_until=8, peak_lr=3e-3,
                                              final_lr=1e-4), eval_every=1, val_beam_size=2, val_max_images=2,
                      save_every=3, keep_checkpoints=5, log_every=1, trackers=[])
    return train_xe(config, tiny_model_config(dropout=0.1), vocab, cache, train, val, validate=validate).losses


class KillingReward:
    """A reward that SIGKILLs its process at call `kill_at` (0: never); its caches go into SCST checkpoints."""

    def __init__(self, inner, kill_at: int) -> None:
        self.inner, self.kill_at, self.calls = inner, kill_at, 0

    def __call__(self, ids, captions, refs):
        self.calls += 1
        if self.calls == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner(ids, captions, refs)

    def state_dict(self) -> dict:
        return self.inner.state_dict() if hasattr(self.inner, "state_dict") else {}

    def load_state_dict(self, state: dict) -> None:
        if hasattr(self.inner, "load_state_dict"):
            self.inner.load_state_dict(state)


def learned_reward():
    """RefCLIP-S of a tiny random CLIP on one small image per id (its colour from the id): a learned reward."""
    from PIL import Image

    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    from pacs.metric.scoring.scorer import Scorer
    from pacs.rewards import build_reward

    backbone = build_backbone_from_config(tiny_clip_config(), seed=0, name="tiny-reward")
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30)]

    def image(image_id: str) -> Image.Image:
        index = int(image_id[3:])
        return Image.new("RGB", (40 + index % 5, 40), colours[index % 4])

    scorer = Scorer(backbone, batch_size=4, progress=False)
    return build_reward("ref-clip-s", scorer=scorer, image_loader=image)


def run_scst(out: Path, data_dir: Path, micro: int, steps: int, kill_at: int, variant: str) -> list[float]:
    """SCST steps: `resume` = dropout on + multinomial samples; `learned`: the same with a learned reward (its
    embedding caches are restored on resume); `ddp` = dropout off + beams."""
    reward = KillingReward(learned_reward() if variant == "learned" else overlap_reward, kill_at)

    cache, train, _ = tiny_data(data_dir)
    resumable = variant in ("resume", "learned")
    init = data_dir / ("init" if resumable else "init-nodrop")
    with process_state().main_process_first():
        if not (init / "captioner.json").is_file():
            tiny_checkpoint(data_dir, dropout=0.1 if resumable else 0.0, name=init.name)
    config = SCSTConfig(output_dir=str(out), reward="overlap", lr=1e-3, batch_size=8, micro_batch_size=micro,
                        epochs=4, max_steps=steps, samples="multinomial" if resumable else "beam",
                        k=3, save_every=3, keep_checkpoints=5, trackers=[])
    items = list({image_id: [caption] for image_id, caption in train}.items())
    return train_scst(config, init, cache, items, reward).losses


def main() -> None:
    """Dispatch on the mode (see the module docstring)."""
    relaunch_cpu_processes()  # as the recipes do: `accelerate launch --cpu --num_processes 2` gives 2 processes
    mode, out = sys.argv[1], Path(sys.argv[2])
    data_dir = out.parent / "data"
    with process_state().main_process_first():
        tiny_data(data_dir)
    emit("world", [process_state().num_processes])
    if mode == "multi":
        emit("features", run_features(out / "features", Path(sys.argv[3]), 7))
        losses, best = run_xe(out / "xe", data_dir, int(sys.argv[4]), 6)
        emit("xe", losses)
        emit("xe_best_cider", [best])
        emit("scst", run_scst(out / "scst", data_dir, int(sys.argv[5]), 4, 0, "ddp"))
    elif mode == "xe":
        emit("xe", run_xe_resumable(out, data_dir, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
    else:
        variant = "learned" if mode == "scst-learned" else "resume"
        emit("scst", run_scst(out, data_dir, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), variant))


if __name__ == "__main__":
    main()
