"""Benchmark: the Java cost of evaluating captions (PTB tokenizer + METEOR), per call vs. in one `TextMetricSession`.

It replays what `pacs train`'s evaluation does on real captions (Flickr8k, from $PACS_SHARED/data): for each of
`--models` models, one `compute_text_metrics` call on the whole test set and one per domain subset (`--subsets`,
as nocaps' in/near/out-domain rows), with `--metrics`. "per call" is what every call did before (its own PTB
tokenizer and METEOR JVMs); "session" makes the same calls inside one `TextMetricSession` (one METEOR process,
PTB tokens memoised). It prints wall seconds, JVMs started, the ratio and the largest difference between the two.

    PACS_SHARED=../shared python bench/bench_text_metrics.py [--images 1000] [--models 2] [--subsets 3]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from pacs.eval.text_metrics import TextMetricSession, compute_text_metrics


def flickr8k(shared: Path, n_images: int) -> tuple[list[list[str]], list[list[str]]]:
    """Per image: its five captions; candidates of model m are caption m (references: the other four)."""
    by_image: dict[str, list[str]] = {}
    for line in (shared / "data" / "flickr8k" / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, _, caption = line.partition("\t")
        by_image.setdefault(key.split("#")[0], []).append(caption)
    keys = sorted(by_image)[:n_images]
    return [by_image[k] for k in keys], keys


def evaluation_calls(captions: list[list[str]], models: int, subsets: int) -> list[tuple[list[str], list[list[str]]]]:
    """The (candidates, references) of every call an evaluation makes: per model, all images then each subset."""
    references = [c[1:] for c in captions]
    calls = []
    for model in range(models):
        candidates = [" ".join(c[0].split()[: len(c[0].split()) - model]) for c in captions]  # model m drops m words
        calls.append((candidates, references))
        for part in range(subsets):
            calls.append((candidates[part::subsets], references[part::subsets]))
    return calls


def run(calls: list, metrics: list[str], shared_session: bool) -> tuple[float, int, list]:
    """Seconds, JVMs started and the results of making `calls` (one session for all, or one per call)."""
    start, starts, results = time.perf_counter(), 0, []
    if shared_session:
        with TextMetricSession() as session:
            results = [compute_text_metrics(c, r, metrics) for c, r in calls]
            starts = session.java_starts
    else:
        for c, r in calls:
            with TextMetricSession() as session:
                results.append(compute_text_metrics(c, r, metrics))
                starts += session.java_starts
    return time.perf_counter() - start, starts, results


def main() -> None:
    """Run both ways and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--models", type=int, default=2)
    parser.add_argument("--subsets", type=int, default=3)
    parser.add_argument("--metrics", default="bleu4,meteor,rouge,cider")
    args = parser.parse_args()
    shared = Path(os.environ.get("PACS_SHARED", "../shared"))
    captions, _ = flickr8k(shared, args.images)
    calls = evaluation_calls(captions, args.models, args.subsets)
    metrics = args.metrics.split(",")
    before_s, before_starts, before = run(calls, metrics, shared_session=False)
    after_s, after_starts, after = run(calls, metrics, shared_session=True)
    diff = max(float(np.max(np.abs(a[m].per_caption - b[m].per_caption))) for a, b in zip(before, after)
               for m in metrics)
    print(f"{len(calls)} calls ({args.models} models x (all {args.images} images + {args.subsets} subsets)), "
          f"metrics {', '.join(metrics)}")
    print("| way | wall s | JVMs started | speed-up |")
    print("|---|---:|---:|---:|")
    print(f"| per call (before) | {before_s:.1f} | {before_starts} | 1.0x |")
    print(f"| one session (after) | {after_s:.1f} | {after_starts} | {before_s / after_s:.1f}x |")
    print(f"largest per-caption difference: {diff:.1e}")


if __name__ == "__main__":
    main()
