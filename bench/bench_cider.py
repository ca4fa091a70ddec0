"""Benchmark: pycocoevalcap's Cider vs pacs' fast CIDEr-D on 5,000 candidates x 5 references.

Prints one table with both times and the speed-up ratio, cold (fresh scorer) and with reference statistics
cached (a second call on the same references, as in SCST), and the largest per-caption difference.
Captions are the real Flickr8k captions when PACS_SHARED is set, otherwise synthetic sentences.

    PACS_SHARED=/work/shared python bench/bench_cider.py [--candidates 5000] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import random
from pathlib import Path

import numpy as np
from pycocoevalcap.cider.cider import Cider
from timing import best_time

from eval.cider import CiderD, cider_df


def flickr8k_captions() -> dict[str, list[str]] | None:
    """Lower-cased Flickr8k captions by image (punctuation split off), or None without PACS_SHARED."""
    shared = os.environ.get("PACS_SHARED")
    path = Path(shared or "/nonexistent") / "data" / "flickr8k" / "Flickr8k.token.txt"
    if not path.is_file():
        return None
    by_image: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, caption = line.partition("\t")
        words = caption.lower().replace(".", " ").replace(",", " ").split()
        by_image.setdefault(key.split("#")[0], []).append(" ".join(words))
    return {k: v[:5] for k, v in by_image.items() if len(v) >= 5}


def synthetic_captions(count: int, rng: random.Random) -> dict[str, list[str]]:
    """Random sentences over a small vocabulary, five per image."""
    words = [f"w{i}" for i in range(3000)] + ["a", "the", "on", "in", "of", "with"] * 100
    return {str(i): [" ".join(rng.choices(words, k=rng.randint(6, 16))) for _ in range(5)] for i in range(count)}


def build_inputs(count: int, seed: int = 0) -> tuple[list[str], list[list[str]]]:
    """`count` candidates (another caption of a random image, or of the same image) with 5 references."""
    rng = random.Random(seed)
    by_image = flickr8k_captions() or synthetic_captions(count, rng)
    images = sorted(by_image)
    chosen = [images[i % len(images)] for i in range(count)]
    candidates = [by_image[rng.choice(images)][rng.randrange(5)] if i % 2 else by_image[im][rng.randrange(5)]
                  for i, im in enumerate(chosen)]
    references = [by_image[im] for im in chosen]
    return candidates, references


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    candidates, references = build_inputs(args.candidates)
    gts = {i: refs for i, refs in enumerate(references)}
    res = {i: [c] for i, c in enumerate(candidates)}

    t_coco, (_, coco_scores) = best_time(lambda: Cider().compute_score(gts, res), args.repeats)
    t_cold, cold_scores = best_time(lambda: CiderD()(candidates, references), args.repeats)
    scorer = CiderD()
    scorer(candidates, references)
    t_cached, cached_scores = best_time(lambda: scorer(candidates, references), args.repeats)
    table = cider_df(references)
    fixed = CiderD(document_frequency=table)
    fixed(candidates, references)
    t_fixed, fixed_scores = best_time(lambda: fixed(candidates, references), args.repeats)

    coco_scores = np.asarray(coco_scores)
    rows = [
        ("pycocoevalcap Cider", t_coco, 0.0),
        ("pacs cider_d, cold", t_cold, np.abs(cold_scores - coco_scores).max()),
        ("pacs CiderD, refs cached", t_cached, np.abs(cached_scores - coco_scores).max()),
        ("pacs CiderD, fixed DF + refs cached", t_fixed, np.abs(fixed_scores - coco_scores).max()),
    ]
    print(f"CIDEr-D: {len(candidates)} candidates x 5 references, best of {args.repeats}")
    print(f"{'implementation':<38} {'seconds':>9} {'speed-up':>9} {'max |diff|':>11}")
    for name, seconds, diff in rows:
        print(f"{name:<38} {seconds:9.4f} {t_coco / seconds:8.1f}x {diff:11.2e}")


if __name__ == "__main__":
    main()
