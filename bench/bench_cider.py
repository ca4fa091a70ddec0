"""Benchmark: pycocoevalcap's Cider vs pacs' fast CIDEr-D, 5 references per image, as the number grows.

For each size (candidates = images, default 5,000 / 25,000 / 125,000) one table row per implementation:
pycocoevalcap `Cider` (the baseline), pacs cold (a fresh scorer), pacs with the reference statistics cached
(a second call on the same references, as in SCST and repeated evaluations) and pacs with a fixed corpus DF
plus cached references; wall and CPU seconds (best of `--repeats`), the speed-up over pycocoevalcap at that
size, the peak of traced memory (tracemalloc, a separate untimed call; pycocoevalcap is traced only up to
`--trace-coco-max` candidates, tracing slows pure Python several times) and the largest per-candidate
difference from pycocoevalcap. Then the growth exponent of each row (log-log least-squares slope of seconds
against candidates): 1.0 is linear, and the speed-up holds or grows with N when pacs' exponent is at most
pycocoevalcap's. A second table (`--reward-sizes`) builds the SCST table (`cider_df`) over N training images
and times one reward-sized call (32 images x 5 samples) against it: a call must not grow with N.

Captions are synthetic (random sentences over a 3,000-word vocabulary, five per image, a distinct image per
candidate); `--data flickr8k` uses the real Flickr8k captions instead (images repeat beyond 8,091).

    PACS_SHARED=/work/shared python bench/bench_cider.py [--sizes 5000,25000,125000] [--repeats 3]
        [--reward-sizes 1000,4000,16000,64000] [--data synthetic|flickr8k]
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pycocoevalcap.cider.cider import Cider

from pacs.eval.cider import CiderD, cider_df


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


def build_inputs(count: int, seed: int = 0, data: str = "synthetic") -> tuple[list[str], list[list[str]]]:
    """`count` candidates (another caption of a random image, or of the same image) with 5 references."""
    rng = random.Random(seed)
    by_image = (flickr8k_captions() if data == "flickr8k" else None) or synthetic_captions(count, rng)
    images = sorted(by_image)
    chosen = [images[i % len(images)] for i in range(count)]
    candidates = [by_image[rng.choice(images)][rng.randrange(5)] if i % 2 else by_image[im][rng.randrange(5)]
                  for i, im in enumerate(chosen)]
    references = [by_image[im] for im in chosen]
    return candidates, references


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float, object]:
    """Best wall and CPU seconds over `repeats` calls (garbage collected before each), and the last result."""
    wall, cpu, result = float("inf"), float("inf"), None
    for _ in range(max(1, repeats)):
        gc.collect()
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        wall = min(wall, time.perf_counter() - start_wall)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu, result


def traced_peak(fn: Callable[[], object]) -> float:
    """Peak traced memory (MB) of one call of `fn`."""
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def slope(sizes: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(size)."""
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0]) if len(sizes) > 1 else float("nan")


def measure_size(count: int, args: argparse.Namespace) -> list[tuple[str, float, float, float, float]]:
    """Rows (implementation, wall s, cpu s, peak MB, max |diff|) for `count` candidates."""
    candidates, references = build_inputs(count, data=args.data)
    gts = {i: refs for i, refs in enumerate(references)}
    res = {i: [c] for i, c in enumerate(candidates)}
    coco_repeats = args.repeats if count <= 25_000 else 1
    t_coco, c_coco, (_, coco) = timed(lambda: Cider().compute_score(gts, res), coco_repeats)
    coco = np.asarray(coco)
    peak_coco = traced_peak(lambda: Cider().compute_score(gts, res)) if count <= args.trace_coco_max else float("nan")

    def cold() -> np.ndarray:
        return CiderD()(candidates, references)

    cached_scorer = CiderD()
    cached_scorer(candidates, references)
    table = cider_df(references, tokenized=True)
    fixed_scorer = CiderD(document_frequency=table)
    fixed_scorer(candidates, references)
    rows = [("pycocoevalcap Cider", t_coco, c_coco, peak_coco, 0.0)]
    for name, fn, peak_fn in [
        ("pacs cold", cold, cold),
        ("pacs refs cached", lambda: cached_scorer(candidates, references), None),
        ("pacs fixed DF, refs cached", lambda: fixed_scorer(candidates, references), None),
    ]:
        wall, cpu, scores = timed(fn, args.repeats)
        peak = traced_peak(peak_fn or fn)
        rows.append((name, wall, cpu, peak, float(np.abs(scores - coco).max())))
    return rows


def reward_row(count: int, args: argparse.Namespace) -> tuple[float, float, float, float]:
    """cider_df seconds, table MB, peak MB (table + scorer + first call) and median ms of a reward-sized call
    for `count` training images."""
    candidates, references = build_inputs(count, seed=1, data=args.data)
    t_df, _, table = timed(lambda: cider_df(references, tokenized=True), 1)
    peak = traced_peak(lambda: CiderD(document_frequency=cider_df(references, tokenized=True))(candidates[:160], references[:160]))
    scorer = CiderD(document_frequency=table)
    rng = np.random.default_rng(0)
    times = []
    for call in range(args.calls + 1):
        images = rng.integers(0, count, 32)
        cands = [candidates[(i + j + call) % count] for i in images for j in range(5)]
        refs = [references[i] for i in images for _ in range(5)]
        start = time.perf_counter()
        scorer(cands, refs)
        if call:  # the first call builds the table's lookup structure, once per training set
            times.append(time.perf_counter() - start)
    return t_df, table.nbytes / 1e6, peak, float(np.median(times)) * 1e3


def reward_rows(sizes: list[int], args: argparse.Namespace) -> None:
    """Print the SCST table: cider_df over N training images, its memory, and one reward-sized call."""
    print(f"\nSCST reward: cider_df over N training images x 5 references, then calls of 32 images x 5 samples "
          f"(median of {args.calls})")
    print(f"{'N':>8} {'cider_df s':>11} {'table MB':>9} {'peak MB':>8} {'call ms':>8} {'vs first':>9}")
    first = None
    for count in sizes:
        t_df, table_mb, peak, call_ms = reward_row(count, args)
        first = first or call_ms
        print(f"{count:>8,} {t_df:11.3f} {table_mb:9.1f} {peak:8.1f} {call_ms:8.2f} {call_ms / first:8.2f}x")


def main() -> None:
    """Run the benchmark and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="5000,25000,125000", help="numbers of candidates, comma-separated")
    parser.add_argument("--candidates", type=int, help="one size only (the benchmark of pacs <= 0.4)")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many (pycocoevalcap above 25k: 1)")
    parser.add_argument("--trace-coco-max", type=int, default=25_000)
    parser.add_argument("--reward-sizes", default="1000,4000,16000,64000", help="training images; '' to skip")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--data", choices=["synthetic", "flickr8k"], default="synthetic")
    args = parser.parse_args()
    sizes = [args.candidates] if args.candidates else [int(s) for s in args.sizes.split(",") if s]
    by_name: dict[str, list[tuple[float, float]]] = {}
    print(f"CIDEr-D: {args.data} captions, 5 references per image, best of {args.repeats} "
          f"(pycocoevalcap above 25,000 candidates: 1)")
    print(f"{'candidates':>10} {'implementation':<28} {'wall s':>8} {'cpu s':>8} {'speed-up':>9} {'peak MB':>8} "
          f"{'max |diff|':>10}")
    for count in sizes:
        rows = measure_size(count, args)
        baseline = rows[0][1]
        for name, wall, cpu, peak, diff in rows:
            by_name.setdefault(name, []).append((wall, cpu))
            print(f"{count:>10,} {name:<28} {wall:8.3f} {cpu:8.3f} {baseline / wall:8.1f}x {peak:8.1f} {diff:10.1e}")
    if len(sizes) > 1:
        print(f"\ngrowth exponent (log-log slope of seconds vs candidates, {sizes[0]:,}..{sizes[-1]:,}): 1.0 = linear")
        for name, values in by_name.items():
            print(f"  {name:<28} wall {slope(sizes, [v[0] for v in values]):.3f}  "
                  f"cpu {slope(sizes, [v[1] for v in values]):.3f}")
    reward_sizes = [int(s) for s in args.reward_sizes.split(",") if s]
    if reward_sizes:
        reward_rows(reward_sizes, args)


if __name__ == "__main__":
    main()
