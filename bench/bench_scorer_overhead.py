"""Benchmark: the Scorer's CPU side with towers that cost almost nothing (issue 30), this tree against another.

bench_gpu.py's scoring section (JPEGs of 480×360, five captions each, batch 256, `workers` = all cores, random
weights), with a toy CLIP whose towers are nearly free (2 layers of width 64 per tower) but whose input is the
real 224-pixel ViT-B/32 preprocessing, so that what remains is the Scorer's own work: image keys, decoding and
preprocessing, stacking, tokenization, synchronisation and scoring. Rows: the Scorer's pairs/s on file paths
(the bench's input), on decoded PIL images and on preprocessed tensors (decoding taken out), in fp32 and bf16
(autocast), against the bare towers on tensors already built (the same toy towers) in the same process; and the
Scorer's wall time split by stage (this tree only).

`--before DIR` (a checkout of the code to compare, e.g. `git worktree add /tmp/scorer_before <commit>`) runs the
same measurements with that tree's `metric` package, interleaved with this tree's runs (`--repeats` each; medians).

    python bench/bench_scorer_overhead.py [--before DIR] [--images 300] [--repeats 3] [--workers N]
        [--torch-threads 1] [--json FILE]
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_gpu import captions_for, print_table, tower_cosines, write_images

REPO = Path(__file__).resolve().parents[1]
KINDS = ("path", "pil", "tensor")
KIND_LABEL = {"path": "JPEG paths", "pil": "PIL images (decoded)", "tensor": "preprocessed tensors"}


def toy_backbone() -> Any:
    """A CLIP with nearly free towers and the real 224-pixel preprocessing (ViT-B/32's input)."""
    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config

    config = tiny_clip_config(vision_cfg={"image_size": 224, "patch_size": 32})
    return build_backbone_from_config(config, seed=0, name="toy-224")


def inputs(work: Path, n_images: int, kind: str, backbone: Any) -> tuple[list[Any], list[str], list[str]]:
    """(images, captions, distinct paths): each image once per caption, as paths, PIL images or tensors."""
    from pacs.metric.models.preprocess import open_image

    paths = write_images(work / "images", n_images, (480, 360))
    per_image = captions_for(n_images)
    if kind == "path":
        distinct: list[Any] = paths
    elif kind == "pil":
        distinct = [open_image(path) for path in paths]
    else:
        distinct = [backbone.preprocess(open_image(path)) for path in paths]
    images = [image for image, caps in zip(distinct, per_image) for _ in caps]
    return images, [caption for caps in per_image for caption in caps], paths


def measure(work: Path, n_images: int, batch: int, workers: int) -> list[dict[str, Any]]:
    """Scorer and bare-tower pairs/s of this process's `metric` package, per input kind and dtype."""
    import torch

    from pacs.metric.models.preprocess import open_image
    from pacs.metric.scoring.scorer import Scorer

    backbone = toy_backbone()
    rows = []
    _, captions, paths = inputs(work, n_images, "path", backbone)  # the same files and captions for every kind
    pixels = torch.stack([backbone.preprocess(open_image(path)) for path in paths])
    tokens = backbone.tokenize(captions)  # as bench_gpu: the towers' tokens first (the tokenizer keeps its ids)
    for kind in KINDS:
        images, captions, paths = inputs(work, n_images, kind, backbone)
        for dtype in ("fp32", "bf16"):
            options = {"dtype": dtype, "batch_size": batch, "progress": False, "prompt": "", "workers": workers}
            Scorer(backbone, **options).score(images[:batch], captions[:batch])  # warm-up, as bench_gpu
            scorer = Scorer(backbone, **options)
            start = time.perf_counter()
            scorer.score(images, captions)
            seconds = time.perf_counter() - start
            tower_cosines(backbone.model, pixels, tokens, 5, batch, "cpu", dtype)  # warm-up
            start = time.perf_counter()
            tower_cosines(backbone.model, pixels, tokens, 5, batch, "cpu", dtype)
            towers = time.perf_counter() - start
            rows.append({"input": KIND_LABEL[kind], "dtype": dtype, "pairs": len(captions),
                         "Scorer pairs/s": len(captions) / seconds, "bare towers pairs/s": len(captions) / towers})
    return rows


def stage_split(work: Path, n_images: int, batch: int, workers: int) -> list[dict[str, Any]]:
    """The Scorer's wall time on JPEG paths (fp32) split by stage: the main thread's time in each."""
    import torch

    import pacs.metric.scoring.scorer as scorer_module
    from pacs.metric.models.tokenizer import ClipTokenizer

    backbone = toy_backbone()
    images, captions, _ = inputs(work, n_images, "path", backbone)
    spent: dict[str, float] = collections.defaultdict(float)

    def timed(name: str, function: Any) -> Any:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start
        return wrapper

    def waited(*args: Any, **kwargs: Any) -> Any:  # the main thread's wait for decoded images
        results = original_map(*args, **kwargs)
        while True:
            start = time.perf_counter()
            try:
                item = next(results)
            except StopIteration:
                return
            finally:
                spent["(b) waiting for decode + preprocess (worker threads)"] += time.perf_counter() - start
            yield item

    original_map, original_stack = scorer_module.ordered_map, torch.stack
    keys = getattr(scorer_module.image_inputs, "image_keys", None)
    patches = [(scorer_module, "ordered_map", waited),
               (torch, "stack", timed("(d) stacking batches and embeddings", original_stack)),
               (backbone, "encode_image", timed("towers: image", backbone.encode_image)),
               (backbone, "encode_text", timed("towers: text", backbone.encode_text)),
               (backbone, "tokenize_batch", timed("(c) tokenization (ids cached by the tokenizer)",
                                                  backbone.tokenize_batch)),
               (scorer_module, "check_embeddings", timed("(d) check_embeddings", scorer_module.check_embeddings))]
    if keys is not None:
        patches.append((scorer_module.image_inputs, "image_keys", timed("(a) image keys", keys)))
    else:
        patches.append((scorer_module.Scorer, "image_key",
                        staticmethod(timed("(a) image keys", scorer_module.image_inputs.image_key))))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    backbone.tokenize(captions)
    options = {"batch_size": batch, "progress": False, "prompt": "", "workers": workers}
    scorer_module.Scorer(backbone, **options).score(images[:batch], captions[:batch])
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        scorer = scorer_module.Scorer(backbone, **options)
        start = time.perf_counter()
        result = scorer.score(images, captions)
        total = time.perf_counter() - start
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
    start = time.perf_counter()
    ClipTokenizer().encode(list(dict.fromkeys(captions)))
    tokenize_cold = time.perf_counter() - start
    rows = [{"stage": name, "ms": 1000 * seconds, "% of the call": 100 * seconds / total}
            for name, seconds in sorted(spent.items())]
    rows.append({"stage": "(e) rest: pairing, scoring, text caching, Python", "ms": 1000 * (total - sum(spent.values())),
                 "% of the call": 100 * (total - sum(spent.values())) / total})
    rows.append({"stage": "whole Scorer.score call", "ms": 1000 * total, "% of the call": 100.0})
    rows.append({"stage": f"(c) for comparison: tokenizing the {len(set(captions))} distinct captions cold (ftfy + BPE)",
                 "ms": 1000 * tokenize_cold})
    assert len(result.scores) == len(captions)
    return rows


def child(args: argparse.Namespace) -> None:
    """One measurement of this process's `metric` package, as JSON on stdout."""
    import torch

    torch.set_num_threads(args.torch_threads)  # intra-op threads (of the towers, and of torch ops in the workers)
    rows = measure(Path(args.work), args.images, args.batch, args.workers)
    split = stage_split(Path(args.work), args.images, args.batch, args.workers) if args.split else []
    print(json.dumps({"rows": rows, "split": split}))


def run_child(tree: Path, args: argparse.Namespace, split: bool) -> dict[str, Any]:
    """Run `child` in a fresh process whose `metric` package is `tree`'s."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(REPO / "bench")])}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--work", args.work, "--images",
               str(args.images), "--batch", str(args.batch), "--workers", str(args.workers), "--torch-threads",
               str(args.torch_threads)]
    done = subprocess.run(command + (["--split"] if split else []), capture_output=True, text=True, env=env,
                          cwd=tree, check=False)
    if done.returncode:
        raise SystemExit(f"the measurement in {tree} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Parse the flags; measure this tree (and `--before`) interleaved; print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a checkout of the code to compare with (its repository root)")
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch's intra-op threads (torch's own default is one per core)")
    parser.add_argument("--work", default=None, help="folder for the JPEGs (default: a temporary folder)")
    parser.add_argument("--json", help="also write every row to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--split", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory() as temporary:
        args.work = args.work or temporary
        trees = {"this tree": REPO} | ({"before": Path(args.before).resolve()} if args.before else {})
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        splits: dict[str, list] = {}
        for repeat in range(args.repeats):
            for name, tree in trees.items():
                run = run_child(tree, args, split=repeat == 0)
                runs[name].append(run)
                splits.setdefault(name, run["split"])
    rows = []
    for index, row in enumerate(runs["this tree"][0]["rows"]):
        out = {"input": row["input"], "dtype": row["dtype"], "pairs": row["pairs"]}
        for name in trees:
            scorer = statistics.median(run["rows"][index]["Scorer pairs/s"] for run in runs[name])
            towers = statistics.median(run["rows"][index]["bare towers pairs/s"] for run in runs[name])
            out[f"{name}: Scorer pairs/s"] = scorer
            out[f"{name}: towers pairs/s"] = towers
            out[f"{name}: Scorer / towers %"] = 100 * scorer / towers
        if args.before:
            out["Scorer this tree / before"] = out["this tree: Scorer pairs/s"] / out["before: Scorer pairs/s"]
        rows.append(out)
    columns = ["input", "dtype", "pairs"] + [f"{name}: {what}" for name in trees for what in
                                             ("Scorer pairs/s", "towers pairs/s", "Scorer / towers %")]
    columns += ["Scorer this tree / before"] if args.before else []
    print_table(f"The Scorer with nearly free towers: {args.images} JPEGs (480×360) × 5 captions, batch {args.batch}, "
                f"workers={args.workers}, torch threads {args.torch_threads}, median of {args.repeats} (interleaved)", columns, rows)
    for name, split in splits.items():
        print_table(f"Where a Scorer.score call goes ({name}, JPEG paths, fp32, one run)",
                    ["stage", "ms", "% of the call"], split)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "splits": splits}, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
