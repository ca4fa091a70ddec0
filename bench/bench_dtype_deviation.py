"""Deviation of bf16 / fp16 scores from fp32 (`Scorer(dtype=...)`, `--dtype`): max and mean |Δ|, Kendall τ.

Setups (each scored once per dtype, same inputs, same weights):
  fixture A / C  the official-format fixtures ($PACS_SHARED/fixtures/pacscore), 32 instances, w = 2.0 as the
                 official PAC-S scripts (PAC-S++ for A, PAC-S for C);
  flickr8k       the first N distinct (image, candidate) pairs of Flickr8k-Expert, then Flickr8k-CF, whose image
                 is in $PACS_SHARED/data/flickr8k/images (judged candidates of every quality, matching and not),
                 with their references (`pacs.eval.benchmarks.flickr8k.load_raw`), scored with CLIP-S (w = 2.5)
                 (a) by `--checkpoint` (e.g. the demo's trained CLIP) and (b) by a random open_clip ViT-B-32
                 (torch seed 0, no download).
For each setup and dtype it prints, for the reference-free score, the Ref- score and the raw cosine, the
largest and the mean |Δ| against fp32 and Kendall τ-b between the fp32 and the low-precision values, and the
seconds each dtype took.

Training (`--sections training`): the same few optimizer steps run twice through the real trainers, with
`mixed_precision` no and bf16 (accelerate's autocast, fp32 master weights, fp32 losses), from the same seed on the
same data: metric training (`train_metric`, LoRA, a random ViT-B-32 or `--train-model tiny`, random images with
real-looking captions and their positives) and XE (`train_xe`, the paper's 3+3-layer d512 captioner on
bench_scale's synthetic COCO-shaped captions and random 50×768 grid features). Per step: the fp32 loss, the bf16
loss and their difference; then how far the bf16 run's trained weights are from the fp32 run's, relative to how
far training moved them (‖W_bf16 − W_fp32‖ / ‖W_fp32 − W_0‖ over the trained tensors).

Run: PACS_SHARED=/work/shared HF_HUB_OFFLINE=1 python bench/bench_dtype_deviation.py \
         [--checkpoint runs/demo/clip/checkpoint.safetensors] [--pairs 1000] [--threads 2] [--device auto] \
         [--sections scores,training] [--train-steps 5] [--train-model ViT-B-32]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kendalltau

from pacs.eval.benchmarks.flickr8k import load_raw
from pacs.metric.common.shared_data import shared_dir
from pacs.metric.models.backbones import Backbone
from pacs.metric.models.factory import load_backbone
from pacs.metric.scoring.scorer import Scorer, ScoreResult

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


def _trained_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "checkpoint.safetensors"))


def metric_training(precision: str, model: str, steps: int, batch: int, device: str, work: Path) -> tuple[list, dict]:
    """`train_metric` (LoRA) for `steps` steps in `precision`: the per-step losses and the trained weights."""
    import open_clip

    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    from pacs.metric.training.data import TensorPositivesDataset
    from pacs.metric.training.trainer import LoraOptions, MetricTrainConfig, train_metric

    config = tiny_clip_config() if model == "tiny" else open_clip.get_model_config(model)
    backbone = build_backbone_from_config(config, seed=0, name=model)
    size = config["vision_cfg"]["image_size"]
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(batch * 2, 3, size, size, generator=generator)
    things = ["dog", "cat", "man", "horse", "bus", "bird", "child", "train"]
    captions = [f"a {things[i % 8]} next to a {things[(i * 3 + 1) % 8]} number {i}" for i in range(batch * 2)]
    data = TensorPositivesDataset(list(images), captions, list(images.flip(-1)),
                                  [c.replace("next to", "beside") for c in captions],
                                  image_ids=[str(i) for i in range(batch * 2)])
    out = work / f"metric-{precision}"
    trainer = MetricTrainConfig(mode="lora", backbone=None, random_init=True, lora=LoraOptions(rank=4), lr=1e-4,
                                batch_size=batch, max_steps=steps, max_epochs=1000, eval_every=0, patience=10**9,
                                log_every=1, seed=0, output_dir=str(out), mixed_precision=precision, device=device)
    train_metric(trainer, data, data, backbone=backbone)
    log = json.loads((out / "train_log.json").read_text())
    return log["train_losses"], _trained_weights(out)


def xe_training(precision: str, steps: int, batch: int, work: Path) -> tuple[list, dict]:
    """`train_xe` (the paper's captioner) for `steps` steps in `precision` on COCO-shaped synthetic data."""
    from bench_scale import write_features, write_karpathy
    from safetensors.torch import load_file

    from pacs.captioner.modeling.features import FeatureCache
    from pacs.captioner.modeling.model import CaptionerConfig
    from pacs.captioner.modeling.train_xe import XEConfig, train_xe
    from pacs.captioner.modeling.vocab import build_vocab

    data = work / "coco" / "dataset_coco.json"
    data.parent.mkdir(parents=True, exist_ok=True)
    ids = write_karpathy(data, 200, 8, 0)
    if not (work / "coco" / "features" / "meta.json").is_file():
        write_features(work / "coco" / "features", ids["train"] + ids["val"], {"backbone": "random", "fingerprint": "x"},
                       1)
    records = {str(image["cocoid"]): [s["raw"] for s in image["sentences"]]
               for image in json.loads(data.read_text())["images"]}
    pairs = [(i, caption) for i in ids["train"] for caption in records[i]]
    vocab = build_vocab("word", [caption for _, caption in pairs], min_count=1, max_length=16)
    out = work / f"xe-{precision}"
    config = XEConfig(output_dir=str(out), max_steps=steps, batch_size=batch, micro_batch_size=batch, eval_every=0,
                      save_every=steps, val_max_images=8, val_beam_size=1, trackers=[], log_every=1,
                      mixed_precision=precision)
    result = train_xe(config, dataclasses.replace(CaptionerConfig(), dropout=0.0), vocab,
                      FeatureCache(work / "coco" / "features"), pairs, {i: records[i] for i in ids["val"]})
    weights = load_file(str(next((out / "final").glob("*.safetensors"))))
    return result.losses, weights


def report_training(name: str, runs: dict[str, tuple[list, dict]], initial: dict[str, torch.Tensor] | None) -> None:
    """Per-step losses of the fp32 and bf16 runs, and the bf16 weights' distance relative to training's update."""
    (losses32, weights32), (losses16, weights16) = runs["no"], runs["bf16"]
    print(f"\n{name}: {len(losses32)} optimizer steps, fp32 vs bf16 autocast (fp32 weights and losses)")
    print(f"{'step':>4}{'fp32 loss':>12}{'bf16 loss':>12}{'|Δ|':>11}{'|Δ| / loss':>12}")
    for step, (a, b) in enumerate(zip(losses32, losses16), start=1):
        print(f"{step:>4}{a:>12.5f}{b:>12.5f}{abs(a - b):>11.2e}{abs(a - b) / abs(a):>12.2e}")
    names = [key for key in weights32 if weights32[key].is_floating_point()]
    if initial is not None:
        names = [key for key in names if key in initial and not torch.equal(weights32[key], initial[key])]
    diff = sum(float((weights16[k].double() - weights32[k].double()).pow(2).sum()) for k in names) ** 0.5
    if initial is not None:
        moved = sum(float((weights32[k].double() - initial[k].double()).pow(2).sum()) for k in names) ** 0.5
        print(f"trained tensors: {len(names)}; ‖W_bf16 − W_fp32‖ = {diff:.3e}, ‖W_fp32 − W_0‖ = {moved:.3e}, "
              f"ratio {diff / moved:.3f}")
    else:
        norm = sum(float(weights32[k].double().pow(2).sum()) for k in names) ** 0.5
        print(f"‖W_bf16 − W_fp32‖ = {diff:.3e} over {len(names)} tensors (‖W_fp32‖ = {norm:.3e}, ratio "
              f"{diff / norm:.2e})")


def training_sections(args: argparse.Namespace) -> None:
    """The training deviation of metric training and XE."""
    from pacs.metric.common.device import resolve_device
    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config

    device = resolve_device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runs = {p: metric_training(p, args.train_model, args.train_steps, args.train_batch, device, work)
                for p in ("no", "bf16")}
        import open_clip

        config = tiny_clip_config() if args.train_model == "tiny" else open_clip.get_model_config(args.train_model)
        initial = build_backbone_from_config(config, seed=0, name=args.train_model).model.state_dict()
        report_training(f"metric training (LoRA rank 4, {args.train_model}, batch {args.train_batch}, lr 1e-4; "
                        "the checkpoint holds the merged weights)", runs, initial)
        runs = {p: xe_training(p, args.train_steps, args.xe_batch, work) for p in ("no", "bf16")}
        report_training(f"XE (3+3-layer d512 captioner, batch {args.xe_batch}, dropout 0)", runs, None)


def main() -> None:
    """Measure every setup and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None,
                        help="a trained CLIP (e.g. the demo's clip/checkpoint.safetensors); without it, no trained setup")
    parser.add_argument("--pairs", type=int, default=1000, help="Flickr8k-Expert/CF pairs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--skip-random", action="store_true", help="skip the random ViT-B-32 (slow on CPU)")
    parser.add_argument("--sections", default="scores,training", help="scores, training or both")
    parser.add_argument("--train-steps", type=int, default=5)
    parser.add_argument("--train-batch", type=int, default=16, help="metric training's batch")
    parser.add_argument("--xe-batch", type=int, default=32)
    parser.add_argument("--train-model", default="ViT-B-32", help="open_clip name or tiny (metric training)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    from pacs.metric.common.device import resolve_device

    device = resolve_device(args.device)
    sections = args.sections.split(",")
    print(f"bench_dtype_deviation: torch {torch.__version__}, device {device}, {args.threads} threads; "
          f"low precision = torch.autocast(dtype), weights fp32")
    if "scores" in sections:
        fixtures = shared_dir() / "fixtures" / "pacscore"
        for name in ("A", "C"):
            backbone, inputs = fixture_inputs(fixtures / name)
            report(f"fixture {name} ({backbone.family}, {backbone.name})", backbone, inputs, 2.0, device)
        pairs = flickr8k_pairs(args.pairs)
        if args.checkpoint:
            trained = load_backbone(checkpoint=args.checkpoint)
            report(f"flickr8k, trained CLIP {args.checkpoint}", trained, pairs, 2.5, device)
        if not args.skip_random:
            torch.manual_seed(0)
            random_b32 = load_backbone("ViT-B-32")  # open_clip architecture, random init, nothing downloaded
            report("flickr8k, random open_clip ViT-B-32 (seed 0)", random_b32, pairs, 2.5, device)
    if "training" in sections:
        training_sections(args)


if __name__ == "__main__":
    main()
