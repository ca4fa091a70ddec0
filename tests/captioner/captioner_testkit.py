"""Tiny synthetic data for captioner tests: features with a learnable colour/shape signal and a tiny captioner."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from pacs.captioner.modeling.checkpoints import save_captioner
from pacs.captioner.modeling.features import FeatureCache, write_feature_cache
from pacs.captioner.modeling.model import Captioner, CaptionerConfig
from pacs.captioner.modeling.vocab import build_vocab
from pacs.metric.models.backbones import tiny_clip_config

COLOURS = ["red", "blue", "green", "yellow"]
SHAPES = ["circle", "square", "triangle"]


def print_line(text: str) -> None:
    """Write `text` and its newline to stdout in one system call, so lines of concurrent ranks never interleave."""
    os.write(1, (text + "\n").encode("utf-8"))


def tiny_data(folder: Path, n_images: int = 40, n_val: int = 8) -> tuple[FeatureCache, list, dict]:
    """A feature cache and (train pairs, val references) where features encode colour and shape."""
    generator = torch.Generator().manual_seed(0)
    features, train, val = {}, [], {}
    for i in range(n_images):
        colour, shape = COLOURS[i % 4], SHAPES[i % 3]
        f = torch.randn(5, 16, generator=generator) * 0.1
        f[0, i % 4] += 1.0
        f[1, 4 + i % 3] += 1.0
        features[f"img{i}"] = f
        captions = [f"a {colour} {shape}", f"the {shape} is {colour}", f"a {colour} {shape} on white"]
        if i < n_images - n_val:
            train += [(f"img{i}", c) for c in captions]
        else:
            val[f"img{i}"] = captions
    cache_dir = folder / "feats"
    cache = FeatureCache(cache_dir) if (cache_dir / "meta.json").is_file() else write_feature_cache(features, cache_dir)
    return cache, train, val


def tiny_model_config(dropout: float = 0.0) -> CaptionerConfig:
    """A captioner small enough for CPU tests."""
    return CaptionerConfig(d_model=32, n_heads=4, encoder_layers=1, decoder_layers=1, ffn_dim=64, dropout=dropout)


def tiny_checkpoint(folder: Path, dropout: float = 0.1, seed: int = 0, name: str = "init") -> Path:
    """A randomly initialised captioner folder over the tiny data's vocabulary."""
    _, train, _ = tiny_data(folder)
    vocab = build_vocab("word", [c for _, c in train], min_count=1, max_length=8)
    config = tiny_model_config(dropout)
    config.vocab_size, config.feature_dim, config.max_length = len(vocab), 16, vocab.max_length
    torch.manual_seed(seed)
    return save_captioner(folder / name, Captioner(config), vocab, {"backbone": "test"})


def overlap_reward(image_ids, captions, references):
    """Words shared with the first reference, plus a small length bonus (a deterministic test reward)."""
    return torch.tensor([[len(set(c.split()) & set(refs[0].split())) + 0.1 * len(c.split()) for c in row]
                         for row, refs in zip(captions, references)], dtype=torch.float32)


def tiny_pipeline_sections(xe_batch: int, xe_micro: int, eval_every: int, save_every: int) -> dict:
    """The `model` and `xe` sections of a tiny recipe (6 XE steps over a 2-warmup schedule) for pipeline tests."""
    return {
        "model": {"d_model": 32, "n_heads": 4, "encoder_layers": 1, "decoder_layers": 1, "ffn_dim": 64,
                  "dropout": 0.1},
        "xe": {"max_steps": 6, "batch_size": xe_batch, "micro_batch_size": xe_micro, "eval_every": eval_every,
               "val_beam_size": 2, "save_every": save_every,
               "log_every": 1, "trackers": [],
               "schedule": {"warmup_steps": 2, "constant_until": 4, "decay_until": 6, "peak_lr": 2e-3,
                            "final_lr": 1e-4}},
    }


def tiny_clip_source() -> dict:
    """A tiny random CLIP (seed 0) as a `features.source` / `reward_models.clip` section."""
    return {"random_config": tiny_clip_config(), "random_seed": 0}


def tiny_pipeline_recipe(run_dir: Path, flickr: Path, max_images: int = 2, bootstrap: int = 0, **sections) -> dict:
    """A `pacs train` recipe on real Flickr8k small enough for CPU tests: 8 training images, a tiny random CLIP,
    a tiny captioner, 2 XE steps, 1 SCST step of the CIDEr reward, `max_images` test images scored with BLEU-4
    (`bootstrap` resamples). `sections` replace whole top-level sections (None: left out)."""
    tiny = tiny_clip_source()
    recipe = {
        "run_dir": str(run_dir),
        "data": {"name": "flickr8k", "path": str(flickr), "max_train_images": 8, "max_val_images": 2},
        "vocab": {"kind": "word", "min_count": 2, "max_length": 10},
        "features": {"source": tiny, "batch_size": 16, "dtype": "float32"},
        "model": {"d_model": 16, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "ffn_dim": 32},
        "xe": {"max_steps": 2, "batch_size": 20, "micro_batch_size": 20, "eval_every": 2, "val_beam_size": 1,
               "save_every": 1, "trackers": [],
               "schedule": {"warmup_steps": 1, "constant_until": 1, "decay_until": 2, "peak_lr": 1e-3,
                            "final_lr": 1e-4}},
        "scst": {"batch_size": 4, "micro_batch_size": 4, "max_steps": 1, "k": 2, "lr": 5e-6,
                 "save_every": 1, "trackers": []},
        "rewards": ["cider"],
        "reward_models": {"clip": tiny, "pac": {"backbone": ""}},
        "evaluation": {"test_sets": {"flickr8k": {"name": "flickr8k", "path": str(flickr), "split": "test"}},
                       "max_images": max_images, "beam_size": 1, "text_metrics": ["bleu4"], "bootstrap": bootstrap},
    }
    recipe.update(sections)
    return {key: value for key, value in recipe.items() if value is not None}


def finished_stages(run: Path) -> dict[str, str]:
    """{stage: output id} of every finished stage record of the run directory `run`."""
    records = {}
    for path in (run / "stages").rglob("*.json"):
        if path.name != "hashes.json":
            record = json.loads(path.read_text())
            records[record["stage"]] = record.get("output_id")
    return records
