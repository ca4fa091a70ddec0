"""Benchmark of the SCST rewards' caches on CPU: time per reward call, as ratios to uncached baselines.

One SCST-sized batch (B=32 images x k=5 real Flickr8k captions, 5 references each) is scored repeatedly:

- `cider`, steady state (tokenized references and their n-gram statistics cached, Python PTB-style
  tokenizer) vs the baseline that re-tokenizes the references and recomputes their statistics every call;
  and vs the same reward with pycocoevalcap's Java tokenizer (`cider_tokenizer="ptb"`);
- `clip-s` with a tiny random backbone, steady state (image embeddings cached by image file) vs a baseline
  that encodes the 32 images again on every call (the text cache is emptied before every call in both, as
  SCST captions are new at every step).

    PACS_SHARED=/path/to/shared python bench/bench_rewards.py [--repeats 5]
"""
from __future__ import annotations

import argparse

import torch
from timing import median_time

from pacs.captioner.data import load_dataset
from pacs.metric.common.shared_data import shared_dir
from pacs.rewards import build_reward


def main(argv: list[str] | None = None) -> None:
    """Print the benchmark table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = load_dataset("flickr8k", shared_dir() / "data" / "flickr8k").split("train")
    items = data.items[:64]
    batch_items, other = items[:32], items[32:]
    ids = [item.image_id for item in batch_items]
    refs = [item.captions for item in batch_items]
    captions = [[other[(i + j) % len(other)].captions[j] for j in range(5)] for i in range(len(batch_items))]
    train_refs = [item.captions for item in data.items]

    fast = build_reward("cider", train_references=train_refs)
    java = build_reward("cider", train_references=train_refs, cider_tokenizer="ptb")

    def cider_uncached() -> None:
        fast.fn.tokenized_references.clear()
        fast.fn.scorer.clear()
        fast(ids, captions, refs)

    repeats = args.repeats
    rows = [("cider, re-tokenize + recompute reference stats (baseline)",
             median_time(cider_uncached, repeats, warmup=1)),
            ("cider, cached references, Python PTB tokenizer",
             median_time(lambda: fast(ids, captions, refs), repeats, warmup=1)),
            ("cider, cached references, Java PTB tokenizer",
             median_time(lambda: java(ids, captions, refs), repeats, warmup=1))]

    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config

    backbone = build_backbone_from_config(tiny_clip_config(), seed=0)
    paths = data.image_paths()
    clip = build_reward("clip-s", backbone=backbone, image_paths=paths)

    def clip_cached() -> None:
        clip.fn.scorer._text_cache.clear()  # SCST captions are new at every step
        clip(ids, captions, refs)

    def clip_uncached() -> None:
        clip.fn.images.embeddings.clear()
        clip.fn.scorer._image_cache.clear()
        clip_cached()

    clip_rows = [("clip-s (tiny), re-encode the images every call (baseline)",
                  median_time(clip_uncached, repeats, warmup=1)),
                 ("clip-s (tiny), image embeddings cached by file", median_time(clip_cached, repeats, warmup=1))]
    print(f"reward call on B=32 x k=5 Flickr8k captions, median of {args.repeats} (CPU, 1 thread)")
    print(f"{'configuration':64} {'ms/call':>9} {'ratio':>7}")
    for group in (rows, clip_rows):
        baseline = group[0][1]
        for name, seconds in group:
            print(f"{name:64} {seconds * 1000:9.1f} {seconds / baseline:7.3f}")


if __name__ == "__main__":
    main()
