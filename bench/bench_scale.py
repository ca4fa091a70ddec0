"""Benchmark: `pacs train` at COCO scale on one machine — time and peak memory of every stage as N grows.

For each N (training images; default 1,000 / 4,000 / 16,000 / 64,000, `--coco` adds 113,287) it builds
COCO-shaped synthetic data: a Karpathy-format JSON (N train, `--val-images` val, `--test-images` test images, five
synthetic captions each over a 3,000-word vocabulary, no image files) and ViT-B/32-shaped grid features (50 × 768,
fp16, random) written by the project's own streaming writer (`write_feature_cache`, bounded shards). Then it runs
the real recipe pipeline on it in a fresh process (`features.cache_dir`: the features are checked, not extracted):
vocab, the feature stages, an XE slice, an SCST slice with the `cider` reward, and the evaluation of the test
split (beam 1, CIDEr-D). A sampler thread in that process reads its resident memory every 20 ms; each stage's
row is its wall seconds and the peak RSS between the end of the stage before it and its own end.

It prints, per stage, seconds and peak RSS (MB) for every N, the growth exponent (log-log least-squares slope over
the sizes run: 1.0 is linear, 0 flat) and the extrapolation to COCO Karpathy's 113,287 training images. The
feature pages the OS maps in from disk count in RSS; they are also reported on their own ("feature pages": the
resident pages of the mapped shard files, from /proc/self/smaps) and subtracted ("peak RSS − feature pages": the
process's own memory), with RssAnon (heap only). The feature files' size is reported on its own row. Each size's
result is appended to `<work>/results.jsonl` as it finishes; `--table-from FILE` prints the table of such a file.

    python bench/bench_scale.py [--sizes 1000,4000,16000,64000] [--coco] [--test-images 5000]
        [--xe-steps 20] [--scst-steps 10] [--threads 1] [--work /tmp/pacs-scale] [--keep]
        [--data-only | --reuse-data]   # write the data once, then measure (and re-measure) on it
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

COCO_TRAIN = 113_287
WORDS = 3000


def synthetic_caption(rng: random.Random) -> str:
    """A random sentence of 8-14 words over a Zipf-like vocabulary."""
    return " ".join(f"w{min(int(rng.paretovariate(1.1)), WORDS)}" for _ in range(rng.randint(8, 14)))


def write_karpathy(path: Path, n_train: int, n_val: int, n_test: int, seed: int = 0) -> dict[str, list[str]]:
    """A Karpathy-format split file with five captions per image (no image files); the ids per split."""
    rng = random.Random(seed)
    images, ids = [], {"train": [], "val": [], "test": []}
    for index in range(n_train + n_val + n_test):
        split = "train" if index < n_train else "val" if index < n_train + n_val else "test"
        ids[split].append(str(index))
        images.append({"cocoid": index, "filepath": "images", "filename": f"{index}.jpg", "split": split,
                       "sentences": [{"raw": synthetic_caption(rng)} for _ in range(5)]})
    path.write_text(json.dumps({"images": images}))
    return ids


def write_features(folder: Path, ids: list[str], meta: dict[str, Any], seed: int) -> float:
    """Random ViT-B/32-shaped grid features for `ids`, streamed into a cache; seconds taken."""
    import torch

    from pacs.captioner.modeling.features import write_feature_cache

    generator = torch.Generator().manual_seed(seed)

    def stream():
        for image_id in ids:
            yield image_id, (torch.randn(50, 768, generator=generator) * 0.1).half()

    start = time.perf_counter()
    write_feature_cache(stream(), folder, meta=meta)
    return time.perf_counter() - start


def tiny_source() -> dict[str, Any]:
    """The feature source the cache claims (a seeded tiny random CLIP: its fingerprint is checked)."""
    from pacs.metric.models.backbones import tiny_clip_config

    return {"random_config": tiny_clip_config(), "random_seed": 0}


def recipe(work: Path, data: Path, features: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The pipeline config of one size."""
    return {
        "run_dir": str(work / "run"),
        "data": {"name": "coco-karpathy", "path": str(data), "missing_images": "keep"},
        "vocab": {"kind": "word", "min_count": 5, "max_length": 16},
        "features": {"source": tiny_source(), "cache_dir": str(features)},
        "model": {"d_model": 64, "n_heads": 4, "encoder_layers": 1, "decoder_layers": 1, "ffn_dim": 128},
        "xe": {"max_steps": args.xe_steps, "batch_size": 50, "micro_batch_size": 50, "eval_every": 0,
               "save_every": args.xe_steps, "val_max_images": 100, "val_beam_size": 1, "trackers": []},
        "scst": {"batch_size": 16, "micro_batch_size": 16, "max_steps": args.scst_steps, "k": 5, "lr": 5e-6,
                 "save_every": args.scst_steps, "trackers": []},
        "rewards": ["cider"],
        "reward_models": {"clip": {"backbone": ""}, "pac": {"backbone": ""}},
        "evaluation": {"test_sets": {"coco": {"name": "coco-karpathy", "path": str(data), "split": "test",
                                              "missing_images": "keep"}},
                       "beam_size": 1, "text_metrics": ["cider"], "bootstrap": 0},
    }


MEASURES = ("rss", "own", "features", "anon")  # bytes: VmRSS; VmRSS - feature pages; feature pages; RssAnon


def status_rss() -> tuple[int, int]:
    """(VmRSS, RssAnon) of this process in bytes, from /proc/self/status."""
    values = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(("VmRSS:", "RssAnon:")):
                values[line.split(":")[0]] = int(line.split()[1]) * 1024
    return values.get("VmRSS", 0), values.get("RssAnon", 0)


def mapped_rss(prefix: str) -> int:
    """Resident bytes of this process's mappings of files under `prefix` (the feature shards), from /proc/self/smaps."""
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as smaps:
        for line in smaps:
            if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:  # a mapping's header line
                fields = line.split(None, 5)
                inside = len(fields) == 6 and fields[5].strip().startswith(prefix)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


class StagePeaks(logging.Handler):
    """Peak memory between stage ends: a sampler thread reads this process's RSS (every 20 ms) and the resident
    pages of the feature shards it maps (/proc/self/smaps, every 200 ms); each 'stage X: done' closes a row.

    Per row: `rss` (VmRSS, everything resident), `own` (VmRSS minus the feature-shard pages: the process's own
    memory and its libraries), `features` (the feature-shard pages) and `anon` (RssAnon: heap and stacks only).
    """

    def __init__(self, feature_dir: str) -> None:
        super().__init__()
        self.prefix = str(Path(feature_dir).resolve())
        self.peak = dict.fromkeys(MEASURES, 0)
        self.overall = dict.fromkeys(MEASURES, 0)
        self.rows: dict[str, dict[str, int]] = {}
        self.stop = threading.Event()
        self.features = 0
        self._close_stage = False
        threading.Thread(target=self._sample, daemon=True).start()

    def sample(self) -> dict[str, int]:
        """One reading of the four measures (feature pages from the last smaps reading)."""
        rss, anon = status_rss()
        return {"rss": rss, "own": rss - self.features, "features": self.features, "anon": anon}

    def _sample(self) -> None:
        last_smaps = 0.0
        while not self.stop.is_set():
            if time.monotonic() - last_smaps >= 0.2:
                self.features, last_smaps = mapped_rss(self.prefix), time.monotonic()
            self._update(self.sample())
            time.sleep(0.02)

    def _update(self, reading: dict[str, int]) -> None:
        for key, value in reading.items():
            self.peak[key] = max(self.peak[key], value)
            self.overall[key] = max(self.overall[key], value)

    def emit(self, record: logging.LogRecord) -> None:
        """Close the row of a stage that finished (or was skipped)."""
        message = record.getMessage()
        if message.startswith("stage ") and (": done in " in message or ": unchanged" in message):
            self.features = mapped_rss(self.prefix)
            self._update(self.sample())
            self.rows[message.split()[1].rstrip(":")] = dict(self.peak)
            self.peak = dict.fromkeys(MEASURES, 0)


def drive(config_path: str, threads: int) -> None:
    """The measured process: run the pipeline, print one JSON line of stage seconds and peaks."""
    import torch

    torch.set_num_threads(threads)
    start = time.perf_counter()
    logging.basicConfig(level=logging.WARNING)
    import yaml

    settings = yaml.safe_load(Path(config_path).read_text())
    peaks = StagePeaks(settings["features"]["cache_dir"])
    stages_logger = logging.getLogger("pacs.captioner.orchestration.stages")
    stages_logger.setLevel(logging.INFO)
    stages_logger.addHandler(peaks)
    from pacs.captioner.entry import run_from_config

    run_from_config(config_path, [])
    peaks.stop.set()
    records = Path(settings["run_dir"]) / "stages"
    seconds = {}
    for path in sorted(records.rglob("*.json")):
        record = json.loads(path.read_text())
        if isinstance(record, dict) and "stage" in record:
            seconds[record["stage"]] = float(record.get("seconds", 0.0))
    print("RESULT " + json.dumps({"seconds": seconds, "peak_rss": peaks.rows,
                                  "overall_peak_rss": peaks.overall, "wall": time.perf_counter() - start}))


def fit_exponent(sizes: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(size)."""
    points = [(math.log(s), math.log(max(v, 1e-9))) for s, v in zip(sizes, values)]
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    den = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / den if den else float("nan")


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Build the data of size n and run the pipeline on it in a fresh process."""
    from pacs.captioner.orchestration.backbone_source import BackboneSource, load_source_backbone

    work = Path(args.work) / f"n{n}"
    data, features = work / "dataset_coco.json", work / "features"
    made = work / "data.json"  # written once the data of this size is complete (what `--reuse-data` reuses)
    shape = {"n": n, "val": args.val_images, "test": args.test_images}
    if args.reuse_data and made.is_file() and json.loads(made.read_text())["shape"] == shape:
        write_s, feature_mb = json.loads(made.read_text())["write_features_s"], json.loads(made.read_text())["mb"]
        shutil.rmtree(work / "run", ignore_errors=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        ids = write_karpathy(data, n, args.val_images, args.test_images)
        source = load_source_backbone(BackboneSource(**tiny_source()), "cpu")
        meta = {"backbone": source.name, "fingerprint": source.fingerprint}
        write_s = write_features(features / "train", ids["train"] + ids["val"], meta, 1)
        write_s += write_features(features / "coco", ids["test"], meta, 2)
        feature_mb = sum(p.stat().st_size for p in features.rglob("*.safetensors")) / 2**20
        made.write_text(json.dumps({"shape": shape, "write_features_s": write_s, "mb": feature_mb}))
    if args.data_only:
        return {"write_features_s": write_s, "feature_mb": feature_mb}
    config = work / "recipe.yaml"
    import yaml

    config.write_text(yaml.safe_dump(recipe(work, data, features, args)))
    done = subprocess.run([sys.executable, __file__, "--driver", str(config), "--threads", str(args.threads)],
                          capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"n={n}: the pipeline failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    result.update(write_features_s=write_s, feature_mb=feature_mb)
    if not (args.keep or args.reuse_data):
        shutil.rmtree(work, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> None:
    """Run the sizes and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,4000,16000,64000")
    parser.add_argument("--coco", action="store_true", help=f"also N = {COCO_TRAIN:,} (COCO Karpathy train)")
    parser.add_argument("--val-images", type=int, default=500)
    parser.add_argument("--test-images", type=int, default=5000)
    parser.add_argument("--xe-steps", type=int, default=20)
    parser.add_argument("--scst-steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", default="/tmp/pacs-scale")
    parser.add_argument("--keep", action="store_true", help="keep each size's data and run folder")
    parser.add_argument("--reuse-data", action="store_true",
                        help="reuse a size's data and features from an earlier --reuse-data/--data-only run (kept)")
    parser.add_argument("--data-only", action="store_true", help="only write each size's data and features")
    parser.add_argument("--table-from", help="print the table of a results.jsonl written by earlier runs")
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.driver:
        drive(args.driver, args.threads)
        return
    if args.table_from:
        lines = [json.loads(line) for line in Path(args.table_from).read_text().splitlines() if line.strip()]
        done = {line.pop("n"): line for line in lines}
        print_table(sorted(done), done)
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sizes = [int(s) for s in args.sizes.split(",")] + ([COCO_TRAIN] if args.coco else [])
    log = Path(args.work) / "results.jsonl"  # one line per size as it finishes (a long run can be read midway)
    log.parent.mkdir(parents=True, exist_ok=True)
    results = {}
    for n in sizes:
        results[n] = measure(n, args)
        if args.data_only:
            print(f"n={n:,}: data written ({results[n]['write_features_s']:.1f} s)", flush=True)
            continue
        with log.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"n": n, **results[n]}) + "\n")
        print(f"n={n:,}: done ({results[n]['wall']:.1f} s)", flush=True)
    if not args.data_only:
        print_table(sizes, results)


def print_table(sizes: list[int], results: dict[int, dict[str, Any]]) -> None:
    """The markdown table: per stage and measure, the value at each size, the exponent and the COCO extrapolation."""
    stages = list(next(iter(results.values()))["peak_rss"])  # in the order they ran
    header = " | ".join(f"{n:,}" for n in sizes)
    print(f"| stage | what | {header} | exponent | at {COCO_TRAIN:,} |")
    print("|---|---|" + "---|" * len(sizes) + "---|---|")
    rows = [("write features (streamed)", "s", [results[n]["write_features_s"] for n in sizes]),
            ("feature files", "MB on disk", [results[n]["feature_mb"] for n in sizes])]
    for stage in stages:
        rows.append((stage, "s", [results[n]["seconds"].get(stage, float("nan")) for n in sizes]))
        for key, label in (("rss", "peak RSS MB"), ("own", "peak RSS − feature pages MB")):
            rows.append((stage, label, [results[n]["peak_rss"].get(stage, {}).get(key, 0) / 2**20 for n in sizes]))
    labels = {"rss": "peak RSS MB", "own": "peak RSS − feature pages MB", "features": "feature pages MB"}
    for key, label in labels.items():
        rows.append(("whole process", label, [results[n]["overall_peak_rss"][key] / 2**20 for n in sizes]))
    rows.append(("whole process", "peak RssAnon MB", [results[n]["overall_peak_rss"]["anon"] / 2**20 for n in sizes]))
    rows.append(("whole process", "s", [results[n]["wall"] for n in sizes]))
    for name, what, values in rows:
        fits = len(sizes) > 1 and min(values) >= 0.05  # values that round to 0.0 have no meaningful slope
        exponent = fit_exponent(sizes, values) if fits else float("nan")
        at_coco = values[-1] * (COCO_TRAIN / sizes[-1]) ** exponent if fits else float("nan")
        cells = " | ".join(f"{v:,.1f}" for v in values)
        shown = (f"{exponent:.2f}", f"{at_coco:,.1f}") if fits else ("–", "–")
        print(f"| {name} | {what} | {cells} | {shown[0]} | {shown[1]} |")


if __name__ == "__main__":
    main()
