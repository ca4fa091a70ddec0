"""Benchmark: how far the `--decode gpu` algorithm strays from the exact PIL path, on the shared Flickr8k images.

The GPU path decodes JPEG with nvJPEG (`torchvision.io.decode_jpeg(device="cuda")`) and resizes with an antialiased
bicubic filter on tensors (`pacs.metric.models.tensor_decode.TensorDecoder`). The same algorithm runs on the CPU with
`device="cpu"` (libjpeg-turbo instead of nvJPEG): that is what this script measures by default, the stand-in of the
GPU path on a machine without one (`--device cuda` measures nvJPEG itself). For `--images` Flickr8k images (sorted
names) and their first caption it prints: the pixel deviation (in 8-bit steps: mean, 99th percentile, max), and per
model (a random open_clip ViT-B-32 and the tiny random test model) the cosine between the exact and the
tensor-path image embeddings (min, mean) and the CLIP-S score deltas (mean |Δ|, max |Δ|, w = 2.5), plus the images/s
of both paths on one thread.

Run: HF_HUB_OFFLINE=1 PACS_SHARED=/work/shared python bench/bench_decode_deviation.py [--images 100]
"""
from __future__ import annotations

import argparse
import logging
import time

import numpy as np
import torch
from bench_metric import flickr8k_inputs

from pacs.metric.models.factory import load_backbone
from pacs.metric.models.preprocess import open_image
from pacs.metric.models.tensor_decode import TensorDecoder
from pacs.metric.scoring.scorer import Scorer


def main() -> None:
    """Measure and print the deviation table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--device", default="cpu", help="where the tensor path decodes (cpu: the stand-in)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    paths, captions = flickr8k_inputs(args.images, 1)
    print(f"bench_decode_deviation: {len(paths)} Flickr8k images, tensor path on {args.device} "
          f"(torchvision.io.decode_jpeg + antialiased bicubic resize), {args.threads} thread(s)")
    for name in ("ViT-B-32", "tiny-random"):
        backbone = load_backbone(name, device="cpu")
        decoder = TensorDecoder(backbone.preprocess, args.device)
        start = time.perf_counter()
        exact = torch.stack([backbone.preprocess(open_image(path)) for path in paths])
        exact_time = time.perf_counter() - start
        start = time.perf_counter()
        tensor = torch.stack([decoder(path).cpu() for path in paths])
        tensor_time = time.perf_counter() - start
        std = torch.tensor(backbone.preprocess.std).view(1, 3, 1, 1)
        steps = ((tensor - exact) * std * 255).abs().flatten()
        scorer = Scorer(backbone, w=2.5, progress=False, warn_empty=False, workers=0)
        exact_emb = scorer.embed_images(list(exact))
        scorer.clear_caches()
        tensor_emb = scorer.embed_images(list(tensor))
        cosine = (exact_emb * tensor_emb).sum(-1)
        exact_scores = scorer.score_embeddings(exact_emb, captions).scores
        tensor_scores = scorer.score_embeddings(tensor_emb, captions).scores
        delta = np.abs(tensor_scores.astype(np.float64) - exact_scores.astype(np.float64))
        print(f"{name} ({backbone.preprocess.size} px):")
        print(f"  pixels, 8-bit steps: mean {steps.mean():.3f}  p99 {steps.quantile(0.99):.1f}  max {steps.max():.1f}")
        print(f"  embedding cosine exact vs tensor path: min {cosine.min():.6f}  mean {cosine.mean():.6f}")
        print(f"  CLIP-S (w=2.5) |Δ|: mean {delta.mean():.2e}  max {delta.max():.2e}  "
              f"(scores: mean {exact_scores.mean():.4f})")
        print(f"  images/s, 1 thread: exact PIL {len(paths) / exact_time:.1f}, tensor path {len(paths) / tensor_time:.1f}")


if __name__ == "__main__":
    main()
