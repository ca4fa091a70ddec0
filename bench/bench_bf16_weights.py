"""bf16 scoring with the frozen weights cast once against autocast re-casting them on every call (issue 43 item 4).

Both variants score the same images and captions with `Scorer(dtype="bf16")` on copies of one random open_clip
model (no download): "autocast" keeps fp32 weights (what a scorer on a shared backbone does), "cast" is the scorer
`build_scorer` makes for a model it loaded (`cast_weights=True`: `pacs.metric.scoring.precision.
cast_frozen_weights`). It prints, per variant, the seconds of the whole call (median of `--repeats`, interleaved),
the `aten::_to_copy` calls of one call (torch.profiler), and the largest |Δ score| between the two (0: the cast
weights are the values autocast makes). The ratio column is against "autocast" in the same run.

Run: HF_HUB_OFFLINE=1 python bench/bench_bf16_weights.py [--model ViT-B-32] [--images 64] [--threads 2]
     [--repeats 3] [--device auto]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import time

import numpy as np
import torch
from PIL import Image

from pacs.metric.models.backbones import Backbone, build_backbone_from_config, tiny_clip_config
from pacs.metric.scoring.scorer import Scorer


def _backbone(model_name: str, device: str) -> Backbone:
    """A random open_clip model (seed 0, no download; `tiny`: the tests' tiny CLIP) as a pacs Backbone."""
    import open_clip

    config = tiny_clip_config() if model_name == "tiny" else open_clip.get_model_config(model_name)
    return build_backbone_from_config(config, seed=0, name=model_name, device=device)


def _inputs(n: int) -> tuple[list[Image.Image], list[str]]:
    generator = np.random.default_rng(0)
    images = [Image.fromarray(generator.integers(0, 256, (240, 320, 3), dtype=np.uint8)) for _ in range(n)]
    words = ["a", "dog", "runs", "on", "the", "green", "grass", "two", "children", "play", "near", "water"]
    captions = [" ".join(generator.choice(words, size=int(generator.integers(4, 12)))) for _ in range(n)]
    return images, captions


def _copies(scorer: Scorer, images: list, captions: list) -> int:
    scorer._image_cache.clear()
    scorer._text_cache.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        scorer.score(images, captions)
    return sum(event.count for event in profile.key_averages() if event.key == "aten::_to_copy")


def main(argv: list[str] | None = None) -> int:
    """Print the table; 2 on a bad flag."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.images < 1 or args.threads < 1 or args.repeats < 1:
        print("bench_bf16_weights: --images, --threads and --repeats must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    base = _backbone(args.model, args.device)
    images, captions = _inputs(args.images)
    scorers = {name: Scorer(dataclasses.replace(base, model=copy.deepcopy(base.model)), progress=False,
                            dtype="bf16", workers=0, device=args.device, cast_weights=name == "cast")
               for name in ("autocast", "cast")}
    scores = {name: scorer.score(images, captions).scores for name, scorer in scorers.items()}  # also a warm-up
    seconds: dict[str, list[float]] = {name: [] for name in scorers}
    for _ in range(args.repeats):  # interleaved: load on the machine hits both alike
        for name, scorer in scorers.items():
            scorer._image_cache.clear()
            scorer._text_cache.clear()
            start = time.perf_counter()
            scorer.score(images, captions)
            seconds[name].append(time.perf_counter() - start)
    copies = {name: _copies(scorer, images, captions) for name, scorer in scorers.items()}
    delta = float(np.max(np.abs(scores["cast"] - scores["autocast"])))
    print(f"bench_bf16_weights: {args.model} (random), {args.images} images x 1 caption, bf16, device "
          f"{args.device}, {args.threads} thread(s), median of {args.repeats}; baseline = autocast")
    print(f"{'variant':<10} {'seconds':>8} {'ratio':>6} {'_to_copy':>9}")
    base_time = statistics.median(seconds["autocast"])
    for name in scorers:
        median = statistics.median(seconds[name])
        print(f"{name:<10} {median:>8.3f} {base_time / median:>5.2f}x {copies[name]:>9}")
    print(f"max |score(cast) - score(autocast)| = {delta:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
