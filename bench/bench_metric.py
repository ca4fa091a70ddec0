"""Benchmark: scoring 32 images x 5 captions the official way vs with the pacs Scorer (caches + trimmed text).

(a) official: every caption re-reads and re-encodes its image (image batches of 64), and every text is padded
    to 77 tokens (text batches of 256), as in the official PAC-S `extract_all_images` / `extract_all_captions`;
(b) pacs: `pacs.metric.scoring.scorer.Scorer` with the in-memory image cache (each image encoded once) and texts sorted by
    token length, encoded in batches trimmed to their longest sequence.
Same randomly initialised open_clip ViT-B-32 (no pretrained weights), same real images and captions (Flickr8k
from PACS_SHARED), same run. Prints both times (median of repeats, interleaved), the ratio, the max |score
difference|, the Scorer's images/s and captions/s at batch sizes 32 and 64, and one row per compute dtype
(`Scorer(dtype=...)`, `--dtype`: fp32, and bf16 / fp16 under torch.autocast) with its max |Δ score| from fp32,
and one row per decoding-worker count (`Scorer(workers=...)`, `--workers-list`: 0 = serial, today's path before
the parallel input pipeline) on `--decode-images` images, images only and images + captions, with whether the
embeddings equal the serial ones bit for bit.

Run: HF_HUB_OFFLINE=1 PACS_SHARED=/work/shared python bench/bench_metric.py [--repeats 3] [--threads 2]
     [--device cuda] [--dtypes fp32,bf16,fp16] [--workers auto] [--workers-list 0,1,auto]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time

import numpy as np
import torch

from pacs.metric.common.shared_data import shared_dir
from pacs.metric.models.backbones import Backbone
from pacs.metric.models.factory import load_backbone
from pacs.metric.models.preprocess import open_image
from pacs.metric.scoring.scorer import DEFAULT_PROMPT, Scorer
from pacs.metric.scoring.scores import clip_score

W = 2.5


def flickr8k_inputs(n_images: int, per_image: int) -> tuple[list[str], list[str]]:
    """The first `n_images` Flickr8k images (sorted) with their first `per_image` captions each."""
    root = shared_dir() / "data" / "flickr8k"
    captions: dict[str, list[str]] = {}
    for line in (root / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, _, caption = line.partition("\t")
        name = key.split("#")[0]
        if (root / "images" / name).is_file():
            captions.setdefault(name, []).append(caption.strip())
    names = sorted(name for name, caps in captions.items() if len(caps) >= per_image)[:n_images]
    if len(names) < n_images:
        raise SystemExit(f"need {n_images} Flickr8k images with captions under {root}, found {len(names)}")
    images = [str(root / "images" / name) for name in names for _ in range(per_image)]
    texts = [caption for name in names for caption in captions[name][:per_image]]
    return images, texts


@torch.no_grad()
def official_scores(backbone: Backbone, images: list[str], captions: list[str]) -> np.ndarray:
    """The official way: one image read + encode per caption (batches of 64), texts padded to 77 (batches of 256)."""
    image_features = []
    for start in range(0, len(images), 64):
        pixels = torch.stack([backbone.preprocess(open_image(path)) for path in images[start:start + 64]])
        image_features.append(backbone.model.encode_image(pixels.to(backbone.device)).cpu())
    text_features = []
    for start in range(0, len(captions), 256):
        tokens = backbone.tokenize([DEFAULT_PROMPT + c for c in captions[start:start + 256]])  # [N, 77]
        text_features.append(backbone.model.encode_text(tokens.to(backbone.device)).cpu())
    image = torch.cat(image_features).numpy()
    text = torch.cat(text_features).numpy()
    return clip_score(image, text, W)


def pacs_scores(backbone: Backbone, images: list[str], captions: list[str], batch_size: int,
                dtype: str = "fp32", workers: int | str = "auto") -> np.ndarray:
    """pacs: a fresh Scorer (cold caches) in `dtype` with `workers` decoding threads, one call."""
    scorer = Scorer(backbone, w=W, batch_size=batch_size, progress=False, warn_empty=False, dtype=dtype,
                    device=str(backbone.device), workers=workers)
    scores = scorer.score(images, captions).scores
    if backbone.device.type == "cuda":
        torch.cuda.synchronize()
    return scores


def timed(function, *args) -> tuple[float, np.ndarray]:
    """Wall time of one call and its result."""
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--captions-per-image", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", default="fp32,bf16,fp16", help="compute dtypes of the per-dtype rows")
    parser.add_argument("--workers", default="auto", help="decoding threads of the Scorer in the main rows")
    parser.add_argument("--workers-list", default="0,1,auto", help="worker counts of the per-workers rows")
    parser.add_argument("--decode-images", type=int, default=128, help="images of the per-workers rows")
    parser.add_argument("--only-workers", action="store_true", help="print the per-workers rows only")
    args = parser.parse_args()
    workers = args.workers if args.workers == "auto" else int(args.workers)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    backbone = load_backbone("ViT-B-32", device=args.device)  # open_clip architecture, random weights
    if args.only_workers:
        workers_rows(backbone, args)
        return
    images, captions = flickr8k_inputs(args.images, args.captions_per_image)
    n_images = len(set(images))

    # warm-up (allocator, kernels), then interleaved repeats so load changes hit both sides alike
    official_scores(backbone, images[:8], captions[:8])
    pacs_scores(backbone, images[:8], captions[:8], 64)
    official_times, pacs_times = [], []
    for _ in range(args.repeats):
        elapsed, reference = timed(official_scores, backbone, images, captions)
        official_times.append(elapsed)
        elapsed, ours = timed(pacs_scores, backbone, images, captions, 64, "fp32", workers)
        pacs_times.append(elapsed)
    official_time, pacs_time = statistics.median(official_times), statistics.median(pacs_times)
    max_diff = float(np.abs(np.asarray(ours) - np.asarray(reference)).max())

    print(f"bench_metric: random open_clip ViT-B-32, {n_images} Flickr8k images x {args.captions_per_image} "
          f"captions = {len(captions)} captions, w={W}, {args.threads} torch threads, {args.workers} decoding "
          f"workers, median of {args.repeats}")
    print(f"{'variant':<44}{'time (s)':>10}{'ratio':>8}")
    print(f"{'(a) official: re-encode images, pad to 77':<44}{official_time:>10.3f}{1.0:>8.3f}")
    print(f"{'(b) pacs Scorer: caches + trimmed text':<44}{pacs_time:>10.3f}{pacs_time / official_time:>8.3f}")
    print(f"max |score(b) - score(a)| = {max_diff:.2e}   (target: ratio <= 0.15, diff <= 1e-5)")
    print()
    print(f"{'pacs Scorer throughput':<28}{'batch':>6}{'time (s)':>10}{'images/s':>10}{'captions/s':>12}")
    for batch_size in (32, 64):
        times = [timed(pacs_scores, backbone, images, captions, batch_size, "fp32", workers)[0]
                 for _ in range(args.repeats)]
        elapsed = statistics.median(times)
        print(f"{'':<28}{batch_size:>6}{elapsed:>10.3f}{n_images / elapsed:>10.1f}{len(captions) / elapsed:>12.1f}")
    print()
    print(f"{'pacs Scorer per dtype':<22}{'dtype':>6}{'device':>8}{'batch':>6}{'time (s)':>10}{'images/s':>10}"
          f"{'captions/s':>12}{'max |Δ| vs fp32':>17}")
    fp32 = pacs_scores(backbone, images, captions, 64)
    for dtype in args.dtypes.split(","):
        pacs_scores(backbone, images[:8], captions[:8], 64, dtype)  # warm-up (autocast kernels)
        runs = [timed(pacs_scores, backbone, images, captions, 64, dtype) for _ in range(args.repeats)]
        elapsed = statistics.median(elapsed for elapsed, _ in runs)
        diff = float(np.abs(runs[-1][1].astype(np.float64) - fp32).max())
        print(f"{'':<22}{dtype:>6}{args.device:>8}{64:>6}{elapsed:>10.3f}{n_images / elapsed:>10.1f}"
              f"{len(captions) / elapsed:>12.1f}{diff:>17.2e}")
    print()
    workers_rows(backbone, args)


def embed_only(backbone: Backbone, images: list[str], workers: int | str) -> torch.Tensor:
    """A fresh Scorer's image embeddings (batch 64) with `workers` decoding threads."""
    scorer = Scorer(backbone, w=W, batch_size=64, progress=False, device=str(backbone.device), workers=workers)
    return scorer.embed_images(images)


def workers_rows(backbone: Backbone, args: argparse.Namespace) -> None:
    """Images/s of the Scorer per decoding-worker count (0: serial, the path before the parallel pipeline)."""
    images, captions = flickr8k_inputs(args.decode_images, 1)
    print(f"{'pacs Scorer per workers':<24}{'workers':>8}{'images (s)':>12}{'images/s':>10}{'+captions (s)':>15}"
          f"{'speed-up':>10}{'equal':>7}   ({len(images)} images, 1 caption each, batch 64)")
    counts = [item if item == "auto" else int(item) for item in args.workers_list.split(",")]
    embed_only(backbone, images[:8], 0)  # warm-up
    runs: dict[int | str, list] = {count: [] for count in counts}
    wholes: dict[int | str, list[float]] = {count: [] for count in counts}
    for _ in range(args.repeats):  # interleaved, so that load changes hit every count alike
        for count in counts:
            runs[count].append(timed(embed_only, backbone, images, count))
            wholes[count].append(timed(pacs_scores, backbone, images, captions, 64, "fp32", count)[0])
    serial, base = None, None
    for count in counts:
        elapsed = statistics.median(t for t, _ in runs[count])
        whole = statistics.median(wholes[count])
        embeddings = runs[count][-1][1]
        if serial is None:
            serial, base = embeddings, elapsed
        equal = bool(torch.equal(embeddings, serial))
        print(f"{'':<24}{count!s:>8}{elapsed:>12.3f}{len(images) / elapsed:>10.1f}{whole:>15.3f}"
              f"{base / elapsed:>10.2f}{equal!s:>7}")


if __name__ == "__main__":
    main()
