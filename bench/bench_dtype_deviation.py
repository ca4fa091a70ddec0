"""Deviation of bf16 / fp16 scores from fp32 (`Scorer(dtype=...)`, `--dtype`): max and mean |Δ|, Kendall τ.

Setups (each scored once per dtype, same inputs, same weights):
  fixture A / C  the official-format fixtures ($PACS_SHARED/fixtures/pacscore), 32 instances, w = 2.0 as the
                 official PAC-S scripts (PAC-S++ for A, PAC-S for C);
  flickr8k       the first N distinct (image, candidate) pairs of Flickr8k-Expert, then Flickr8k-CF, whose image
                 is in $PACS_SHARED/data/flickr8k/images (judged candidates of every quality, matching and not),
                 with their references (`eval.benchmarks.flickr8k.load_raw`), scored with CLIP-S (w = 2.5)
                 (a) by `--checkpoint` (e.g. the demo's trained CLIP) and (b) by a random open_clip ViT-B-32
                 (torch seed 0, no download).
For each setup and dtype it prints, for the reference-free score, the Ref- score and the raw cosine, the
largest and the mean |Δ| against fp32 and Kendall τ-b between the fp32 and the low-precision values, and the
seconds each dtype took.

Run: PACS_SHARED=/work/shared HF_HUB_OFFLINE=1 python bench/bench_dtype_deviation.py \
         --checkpoint runs/demo/clip/checkpoint.safetensors [--pairs 1000] [--threads 2] [--device cpu]
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kendalltau

from eval.benchmarks.flickr8k import load_raw
from metric.common.paths import shared_dir
from metric.models.backbones import Backbone
from metric.models.factory import load_backbone
from metric.scoring.scorer import Scorer, ScoreResult

LOW = ("bf16", "fp16")
Inputs = tuple[list[str], list[str], list[list[str]]]


def fixture_inputs(folder: Path) -> tuple[Backbone, Inputs]:
    """The backbone and (images, candidates, references) of one official-format fixture folder."""
    expected = json.loads((folder / "expected.json").read_text())
    instances = expected["instances"]
    images_dir = folder.parent / "inputs" / "images"
    backbone = load_backbone(checkpoint=str(folder / expected["checkpoint"]), arch=str(folder / "arch.json"))
    return backbone, ([str(images_dir / i["image"]) for i in instances], [i["candidate"] for i in instances],
                      [i["references"] for i in instances])


def flickr8k_pairs(n_pairs: int) -> Inputs:
    """The first `n_pairs` distinct Flickr8k-Expert, then -CF, (image, candidate) pairs with an image file."""
    folder = shared_dir() / "data" / "flickr8k"
    seen: set[tuple[str, str]] = set()
    images, candidates, references = [], [], []
    for kind in ("expert", "cf"):
        rows = load_raw(folder, kind)
        for image, candidate, refs in zip(rows.image_ids, rows.candidates, rows.references):
            path = folder / "images" / image
            if len(images) == n_pairs or (image, candidate) in seen or not path.is_file():
                continue
            seen.add((image, candidate))
            images.append(str(path))
            candidates.append(candidate)
            references.append(refs)
    if len(images) < n_pairs:
        raise SystemExit(f"only {len(images)} Flickr8k-Expert/CF pairs with images under {folder}")
    return images, candidates, references


def score(backbone: Backbone, inputs: Inputs, w: float, dtype: str, device: str) -> tuple[ScoreResult, float]:
    """One fresh scorer (cold caches) in `dtype`: the result and its wall seconds."""
    scorer = Scorer(backbone, w=w, dtype=dtype, device=device, progress=False, warn_empty=False)
    start = time.perf_counter()
    result = scorer.score(*inputs)
    return result, time.perf_counter() - start


def deviation(reference: np.ndarray, other: np.ndarray) -> tuple[float, float, float]:
    """max |Δ|, mean |Δ| and Kendall τ-b between two score arrays (NaN τ when one is constant)."""
    delta = np.abs(other.astype(np.float64) - reference.astype(np.float64))
    tau = kendalltau(reference, other).statistic
    return float(delta.max()), float(delta.mean()), float(tau)


def report(name: str, backbone: Backbone, inputs: Inputs, w: float, device: str) -> None:
    """Print the rows of one setup."""
    base, base_seconds = score(backbone, inputs, w, "fp32", device)
    n_images = len(set(inputs[0]))
    zero = int((base.clip_scores == 0).sum())
    print(f"\n{name}: {len(inputs[1])} pairs, {n_images} images, w={w:g}; fp32 {base_seconds:.1f} s; "
          f"{zero} of {len(inputs[1])} fp32 scores clipped to 0")
    print(f"{'dtype':<6}{'value':<12}{'max |Δ|':>11}{'mean |Δ|':>11}{'Kendall τ':>11}{'seconds':>9}")
    for dtype in LOW:
        result, seconds = score(backbone, inputs, w, dtype, device)
        for label, ours, theirs in (("score", base.clip_scores, result.clip_scores),
                                    ("ref-score", base.scores, result.scores),
                                    ("cosine", base.cosines, result.cosines)):
            high, mean, tau = deviation(ours, theirs)
            print(f"{dtype:<6}{label:<12}{high:>11.2e}{mean:>11.2e}{tau:>11.4f}{seconds:>9.1f}")


def main() -> None:
    """Measure every setup and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a trained CLIP (e.g. the demo's clip/checkpoint.safetensors)")
    parser.add_argument("--pairs", type=int, default=1000, help="Flickr8k-Expert/CF pairs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--skip-random", action="store_true", help="skip the random ViT-B-32 (slow on CPU)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    print(f"bench_dtype_deviation: torch {torch.__version__}, device {args.device}, {args.threads} threads; "
          f"low precision = torch.autocast(dtype), weights fp32")
    fixtures = shared_dir() / "fixtures" / "pacscore"
    for name in ("A", "C"):
        backbone, inputs = fixture_inputs(fixtures / name)
        report(f"fixture {name} ({backbone.family}, {backbone.name})", backbone, inputs, 2.0, args.device)
    pairs = flickr8k_pairs(args.pairs)
    trained = load_backbone(checkpoint=args.checkpoint)
    report(f"flickr8k, trained CLIP {args.checkpoint}", trained, pairs, 2.5, args.device)
    if not args.skip_random:
        torch.manual_seed(0)
        random_b32 = load_backbone("ViT-B-32")  # open_clip architecture, random init, nothing downloaded
        report("flickr8k, random open_clip ViT-B-32 (seed 0)", random_b32, pairs, 2.5, args.device)


if __name__ == "__main__":
    main()
