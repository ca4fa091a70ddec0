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

`--sim-device MS` (issue 43) measures instead how well the Scorer overlaps its host side with an accelerator,
without one: both towers are replaced by a stand-in that sleeps MS milliseconds per batch with the GIL released
(`time.sleep`) and returns embeddings of the right shape, a CPU model of a device that computes while the host
prepares the next batch. On the same JPEG paths it prints, per tree: decode-only (the Scorer with towers that
cost nothing: decoding, preprocessing and the Scorer's own work), towers-only (the stand-in's calls of that
Scorer run, back to back) and the Scorer's wall time with the stand-in, and Scorer / max(decode, towers)
(1.0: perfect overlap; 2.0: none). `--sim-device auto` sets MS per run so that towers-only = decode-only
(that run's decode time over its tower calls), the case of the issue's target on a machine whose speed varies.

    python bench/bench_scorer_overhead.py [--before DIR] [--images 300] [--repeats 3] [--workers N]
        [--torch-threads 1] [--sim-device MS] [--json FILE]
"""
from __future__ import annotations

import argparse
import collections
import configparser
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
AUTO_MS = -1.0  # `--sim-device auto`: per run, the time per batch that makes towers-only equal decode-only
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
    pool_module = getattr(scorer_module, "decode_pool", None)  # trees with decoding processes (issue 43)
    original_batches = pool_module.DecodePool.batches if pool_module is not None else None

    def waited_batches(self: Any, *args: Any, **kwargs: Any) -> Any:  # the main thread's wait for the processes
        results = original_batches(self, *args, **kwargs)  # submitted now, as unpatched

        def timed_results() -> Any:
            while True:
                start = time.perf_counter()
                try:
                    item = next(results)
                except StopIteration:
                    return
                finally:
                    spent["(b) waiting for decode + preprocess (worker processes)"] += time.perf_counter() - start
                yield item
        return timed_results()
    keys = getattr(scorer_module.image_sources, "image_keys", None)
    patches = [(scorer_module, "ordered_map", waited),
               (torch, "stack", timed("(d) stacking batches and embeddings", original_stack)),
               (backbone, "encode_image", timed("towers: image", backbone.encode_image)),
               (backbone, "encode_text", timed("towers: text", backbone.encode_text)),
               (backbone, "tokenize_batch", timed("(c) tokenization (ids cached by the tokenizer)",
                                                  backbone.tokenize_batch)),
               (scorer_module, "check_embeddings", timed("(d) check_embeddings", scorer_module.check_embeddings))]
    if pool_module is not None:
        patches.append((pool_module.DecodePool, "batches", waited_batches))
    if keys is not None:
        patches.append((scorer_module.image_sources, "image_keys", timed("(a) image keys", keys)))
    else:
        patches.append((scorer_module.Scorer, "image_key",
                        staticmethod(timed("(a) image keys", scorer_module.image_sources.image_key))))
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


class SimTowers:
    """Stand-in towers: each call sleeps `ms` (the GIL released, as a device computing) and returns fixed
    embeddings of the model's width; counts its calls."""

    def __init__(self, backbone: Any, ms: float) -> None:
        import torch
        from PIL import Image

        pixels = torch.zeros(1, *backbone.preprocess(Image.new("RGB", (8, 8))).shape)
        with torch.no_grad():
            width = backbone.encode_image(pixels).shape[-1]
        self.row = torch.nn.functional.normalize(torch.arange(1.0, width + 1.0), dim=0)
        self.seconds, self.calls = ms / 1000, 0

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.seconds:
            time.sleep(self.seconds)
        return self.row.expand(len(inputs), -1).clone()


def sim_device(work: Path, n_images: int, batch: int, workers: int, ms: float) -> dict[str, Any]:
    """Decode-only, towers-only and Scorer wall times (s) on JPEG paths with the stand-in towers."""
    from pacs.metric.scoring.scorer import Scorer

    backbone = toy_backbone()
    images, captions, _ = inputs(work, n_images, "path", backbone)
    options = {"batch_size": batch, "progress": False, "prompt": "", "workers": workers}
    backbone.tokenize(captions)  # the tokenizer's id cache warm in both runs (as the other rows)
    backbone.encode_image = backbone.encode_text = SimTowers(backbone, 0.0)
    warm = min(batch, 16)  # first-call costs (imports, preprocessing) out of the timings
    Scorer(backbone, **options).score(images[:warm], captions[:warm])
    seconds, calls = {}, 0
    for name in ("decode", "scorer"):
        if name == "scorer" and ms == AUTO_MS:  # towers ≈ decode: this run's decode time over its tower calls
            ms = 1000 * seconds["decode"] / calls
        towers = SimTowers(backbone, 0.0 if name == "decode" else ms)
        backbone.encode_image = backbone.encode_text = towers  # the instance's attributes: this process only
        scorer = Scorer(backbone, **options)
        start = time.perf_counter()
        scorer.score(images, captions)
        seconds[name] = time.perf_counter() - start
        getattr(scorer, "close", lambda: None)()
        calls = towers.calls
    start = time.perf_counter()
    for _ in range(calls):  # the same calls back to back: what the towers alone would take
        time.sleep(ms / 1000)
    seconds["towers"] = time.perf_counter() - start
    return {**seconds, "tower batches": calls, "pairs": len(captions), "ms": ms}


def child(args: argparse.Namespace) -> None:
    """One measurement of this process's `metric` package, as JSON on stdout."""
    import torch

    import pacs.metric.scoring.scorer

    torch.set_num_threads(args.torch_threads)  # intra-op threads (of the towers, and of torch ops in the workers)
    module = str(Path(pacs.metric.scoring.scorer.__file__).resolve())  # the tree measured, checked by the parent
    if args.sim_device is not None:
        print(json.dumps({"sim": sim_device(Path(args.work), args.images, args.batch, args.workers,
                                            args.sim_device), "module": module}))
        return
    rows = measure(Path(args.work), args.images, args.batch, args.workers)
    split = stage_split(Path(args.work), args.images, args.batch, args.workers) if args.split else []
    print(json.dumps({"rows": rows, "split": split, "module": module}))


def import_root(tree: Path, work: Path) -> Path:
    """A folder whose ``pacs`` package is `tree`'s: links laid out as `tree`'s setup.cfg ``package_dir`` maps them.

    The editable install's finder maps ``pacs.metric`` (and the other mapped packages) to this checkout whatever
    PYTHONPATH says, so a tree's root on PYTHONPATH would still run this tree's `metric`; a plain ``pacs`` package
    found first on the path, with the mapped folders inside it, is found before that finder is asked.
    """
    parser = configparser.ConfigParser()
    parser.read(tree / "setup.cfg", encoding="utf-8")
    mapping = dict(line.split("=", 1) for line in parser.get("options", "package_dir", fallback="").split("\n")
                   if "=" in line)
    mapping = {name.strip(): tree / folder.strip() for name, folder in mapping.items()}
    root = work / f"import-{abs(hash(str(tree))):x}"
    package = root / "pacs"
    if root.exists():
        return root
    package.mkdir(parents=True)
    for item in mapping.get("pacs", tree / "pacs").iterdir():
        (package / item.name).symlink_to(item)
    for name, folder in mapping.items():
        if name != "pacs":
            (package / name.split(".", 1)[1]).symlink_to(folder, target_is_directory=True)
    return root


def run_child(tree: Path, args: argparse.Namespace, split: bool) -> dict[str, Any]:
    """Run `child` in a fresh process whose `pacs` package (its `metric`) is `tree`'s."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(import_root(tree, Path(args.work))), str(REPO / "bench")])}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--work", args.work, "--images",
               str(args.images), "--batch", str(args.batch), "--workers", str(args.workers), "--torch-threads",
               str(args.torch_threads)]
    if args.sim_device is not None:
        command += ["--sim-device", "auto" if args.sim_device == AUTO_MS else str(args.sim_device)]
    done = subprocess.run(command + (["--split"] if split else []), capture_output=True, text=True, env=env,
                          cwd=tree, check=False)
    if done.returncode:
        raise SystemExit(f"the measurement in {tree} failed: {done.stderr.strip().splitlines()[-1:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(result["module"]).is_relative_to(tree.resolve()):
        raise SystemExit(f"the measurement of {tree} ran {result['module']}, another tree's code")
    return result


def fail(message: str) -> None:
    """One error line on stderr, exit 2 (the CLI convention)."""
    print(f"bench_scorer_overhead: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_flags(args: argparse.Namespace) -> None:
    """`--workers` a whole number >= 0, `--sim-device` a positive time in ms: else one line and exit 2."""
    try:
        args.workers = int(args.workers)
    except ValueError:
        fail(f"--workers {args.workers!r}: give a whole number of decoding workers (0 or more)")
    if args.workers < 0:
        fail(f"--workers {args.workers}: give a whole number of decoding workers (0 or more)")
    if args.sim_device is not None:
        try:
            ms = AUTO_MS if args.sim_device == "auto" else float(args.sim_device)
        except ValueError:
            ms = float("nan")
        if not (ms > 0 or args.sim_device == "auto") or ms == float("inf"):
            fail(f"--sim-device {args.sim_device!r}: give the simulated towers' time per batch in ms, a positive "
                 "number (or auto)")
        args.sim_device = ms


def simulated(args: argparse.Namespace) -> None:
    """`--sim-device`: the three wall times per tree (interleaved repeats, medians) and the overlap ratio."""
    with tempfile.TemporaryDirectory() as temporary:
        args.work = args.work or temporary
        trees = {"this tree": REPO} | ({"before": Path(args.before).resolve()} if args.before else {})
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(args.repeats):
            for name, tree in trees.items():
                runs[name].append(run_child(tree, args, split=False)["sim"])
    rows = []
    for name in trees:
        row: dict[str, Any] = {"tree": name, "pairs": runs[name][0]["pairs"],
                               "tower batches": runs[name][0]["tower batches"]}
        for what in ("decode", "towers", "scorer"):
            row[f"{what} s"] = statistics.median(run[what] for run in runs[name])
        row["ms per batch"] = statistics.median(run["ms"] for run in runs[name])
        row["towers / decode"] = row["towers s"] / row["decode s"]
        row["Scorer / max(decode, towers)"] = statistics.median(
            run["scorer"] / max(run["decode"], run["towers"]) for run in runs[name])
        rows.append(row)
    if args.before:
        rows.append({"tree": "this tree / before: Scorer time",
                     "scorer s": rows[0]["scorer s"] / rows[1]["scorer s"]})
    columns = ["tree", "pairs", "tower batches", "ms per batch", "decode s", "towers s", "scorer s", "towers / decode",
               "Scorer / max(decode, towers)"]
    per_batch = "towers ≈ decode" if args.sim_device == AUTO_MS else f"{args.sim_device:g} ms per tower batch"
    print_table(f"Simulated device ({per_batch}): {args.images} JPEGs (480×360) × 5 "
                f"captions, batch {args.batch}, workers={args.workers}, torch threads {args.torch_threads}, "
                f"median of {args.repeats} (interleaved)", columns, rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"sim_ms": args.sim_device, "rows": rows, "runs": runs}, indent=1),
                                   encoding="utf-8")


def main() -> None:
    """Parse the flags; measure this tree (and `--before`) interleaved; print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a checkout of the code to compare with (its repository root)")
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", default=str(os.cpu_count() or 1),
                        help="the Scorer's decoding workers (default: the cores)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch's intra-op threads (torch's own default is one per core)")
    parser.add_argument("--work", default=None, help="folder for the JPEGs (default: a temporary folder)")
    parser.add_argument("--json", help="also write every row to this file")
    parser.add_argument("--sim-device", metavar="MS", default=None,
                        help="replace the towers by a stand-in sleeping MS ms per batch (a simulated device) and "
                             "print decode-only, towers-only and Scorer wall times")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--split", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    check_flags(args)
    if args.child:
        child(args)
        return
    if args.sim_device is not None:
        simulated(args)
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
