"""Benchmark: pacs on one GPU in at most 5 minutes — the main command, scoring, decoding, metric training, XE/SCST.

Sections (each a table; `--sections` picks some):
  main      the smoke preset of the main command, as a new user runs it: `accelerate launch recipes/scst_pacs.py
            --config recipes/configs/demo_smoke.yaml` in a fresh process (`demo.device` auto): exit code, seconds.
  overlap   the Scorer's wall time against decode-only (towers that cost nothing) and towers-only, ViT-B/32 and
            ViT-L/14, fp32 and bf16: Scorer / max(decode, towers) (issue 43; targets in docs/performance.md)
  scoring   pairs/s of the pacs `Scorer` (cold caches, JPEG files: decode + preprocess + towers), of the bare
            towers on tensors already on the device (the ceiling), and of torchmetrics' `CLIPScore` (a random
            transformers CLIPModel of the same shape, ViT-B/32 only) for ViT-B/32 and ViT-L/14 in fp32 and bf16
            (random weights; `--images` JPEGs of 480×360, five captions each; the Scorer with `workers=` all
            cores and, on CUDA, also `decode="gpu"` where it has those options). The Scorer's cosines are checked
            against the towers' (max |Δcos|).
  decode    images/s of JPEG decode + the backbone's preprocessing: 1 worker, all cores (a thread pool), and on
            the GPU (torchvision `decode_jpeg` on CUDA + antialiased resize, crop and normalisation on the device).
  train     metric training steps/s, peak memory and model FLOP utilisation (FLOPs of one step counted by
            `torch.utils.flop_counter`, against the card's dense peak; `--peak-tflops`) for projection (PAC-S),
            LoRA (PAC-S++) and full fine-tuning of ViT-B/32 in fp32 and bf16 (autocast, fp32 weights), batch 64.
  captioner XE and SCST steps/s at COCO shape (bench_scale's synthetic data: Karpathy-format captions, random
            ViT-B/32-shaped 50×768 grid features, the paper's 3+3-layer d512 captioner; SCST batch 32 × k=5 beam)
            with the `cider` and `pac-s++` rewards (a random ViT-B/32 reward model on the JPEG files), fp32 and
            bf16, and the reward's share of an SCST step.

`--device cpu --tiny` runs every section at toy sizes (tests/tools/test_bench_gpu.py runs it so the script
cannot rot). `--json FILE` also writes every row.

    python bench/bench_gpu.py [--device auto] [--tiny] [--sections main,scoring,overlap,decode,train,captioner]
        [--images 300] [--work DIR] [--peak-tflops BF16,FP32] [--json FILE]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import inspect
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_scale import write_features, write_karpathy

REPO = Path(__file__).resolve().parents[1]
SECTIONS = ("main", "scoring", "overlap", "decode", "train", "captioner")
#: dense peak TFLOP/s by card (bf16 tensor cores; fp32 without TF32, torch's default matmul precision)
PEAK_TFLOPS = {"H100 PCIe": (756.0, 51.2), "H100": (989.4, 66.9), "H200": (989.4, 66.9), "A100": (312.0, 19.5),
               "L40S": (362.0, 91.6), "L4": (121.0, 30.3), "A10": (125.0, 31.2)}
THINGS = ["dog", "cat", "man", "woman", "child", "bus", "train", "bicycle", "horse", "bird"]
PLACES = ["on the grass", "in the street", "near the water", "in a kitchen", "on a beach", "in the snow"]


def sync(device: str) -> None:
    """Wait for the device's queued work (timings on CUDA)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn) -> tuple[float, Any]:
    """Wall seconds of `fn()` (synchronised) and its result."""
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return time.perf_counter() - start, result


def autocast(device: str, dtype: str):
    """`torch.autocast` for bf16, nothing for fp32."""
    import torch

    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def write_images(folder: Path, n: int, size: tuple[int, int], seed: int = 0) -> list[str]:
    """`n` JPEG files of `size` (smooth random colour fields, quality 90); their paths."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for index in range(n):
        path = folder / f"{index}.jpg"
        if not path.is_file():
            small = Image.fromarray(rng.integers(0, 256, (9, 12, 3), dtype=np.uint8))
            small.resize(size, Image.BICUBIC).save(path, quality=90)
        paths.append(str(path))
    return paths


def captions_for(n_images: int, per_image: int = 5, seed: int = 0) -> list[list[str]]:
    """`per_image` short real-looking captions per image."""
    rng = random.Random(seed)
    return [[f"a {rng.choice(THINGS)} and a {rng.choice(THINGS)} {rng.choice(PLACES)}" for _ in range(per_image)]
            for _ in range(n_images)]


def model_config(name: str, tiny: bool) -> dict:
    """The open_clip config of `name` (ViT-B-32, ViT-L-14), or a toy CLIP with `tiny`."""
    import open_clip

    from pacs.metric.models.backbones import tiny_clip_config

    return tiny_clip_config() if tiny else open_clip.get_model_config(name)


def print_table(title: str, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """A markdown table of `rows` (missing values: —)."""
    def cell(value: Any) -> str:
        if value is None:
            return "—"
        if isinstance(value, float):
            return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
        return str(value)

    print(f"\n### {title}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        print("| " + " | ".join(cell(row.get(column)) for column in columns) + " |")
    sys.stdout.flush()


# --- main command ----------------------------------------------------------------------------------------------

def run_main_command(device: str, tiny: bool, work: Path) -> list[dict[str, Any]]:
    """`accelerate launch recipes/scst_pacs.py --config recipes/configs/demo_smoke.yaml` in a fresh process."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no"]
    if device == "cpu":
        command.append("--cpu")
    command += [str(REPO / "recipes" / "scst_pacs.py"), "--config", str(REPO / "recipes" / "configs" / "demo_smoke.yaml"),
                f"runs_dir={work / 'main'}"]
    if device == "cpu":
        command.append("device=cpu")
    if tiny:  # the metric stages only, two steps each
        command += ["captioning=false", "clip.max_steps=2", "pacs.max_steps=2"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    seconds = time.perf_counter() - start
    tail = (done.stderr.strip().splitlines() or [""])[-1][:160]
    row = {"command": "accelerate launch recipes/scst_pacs.py --config demo_smoke.yaml" + (" (tiny)" if tiny else ""),
           "exit code": done.returncode, "seconds": seconds,
           "table printed": "| model |" in done.stdout or "tau" in done.stdout, "last stderr line": tail}
    print_table("The main command, smoke preset", ["command", "exit code", "seconds", "table printed"], [row])
    if done.returncode:
        print(f"\nits last stderr line: {tail}")
    return [row]


# --- scoring ---------------------------------------------------------------------------------------------------

def clip_processor(tiny: bool):
    """A transformers `CLIPProcessor` with CLIP's BPE built from open_clip's merges (no download)."""
    import gzip

    from open_clip.tokenizer import bytes_to_unicode, default_bpe
    from transformers import CLIPImageProcessor, CLIPProcessor, CLIPTokenizer

    with gzip.open(default_bpe(), "rt", encoding="utf-8") as handle:
        merges = handle.read().split("\n")[1:49152 - 256 - 2 + 1]
    alphabet = list(bytes_to_unicode().values())
    vocab = alphabet + [char + "</w>" for char in alphabet] + ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    tokenizer = CLIPTokenizer(vocab={token: index for index, token in enumerate(vocab)},
                              merges=[tuple(merge.split()) for merge in merges])
    size = 32 if tiny else 224
    return CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": size},
                                                            crop_size={"height": size, "width": size}),
                         tokenizer=tokenizer)


def torchmetrics_clipscore(device: str, tiny: bool, paths: list[str], captions: list[str]) -> float | None:
    """Pairs/s of torchmetrics' `CLIPScore` (`paths[i]`, `captions[i]` pairs; files decoded first, as tensors) on a
    random transformers CLIP of ViT-B/32's shape (None: torchmetrics not installed)."""
    try:
        from torchmetrics.multimodal.clip_score import CLIPScore
    except ImportError:
        return None
    import torch
    from PIL import Image
    from torchvision.transforms.functional import pil_to_tensor
    from transformers import CLIPConfig, CLIPModel

    processor = clip_processor(tiny)
    if tiny:
        tower = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
        config = CLIPConfig(text_config={**tower, "vocab_size": len(processor.tokenizer)},
                            vision_config={**tower, "image_size": 32, "patch_size": 16}, projection_dim=32)
    else:
        config = CLIPConfig()  # ViT-B/32's shape
    class FeatureTensors(CLIPModel):
        """transformers 5 returns the projected features as `pooler_output` of an output object; torchmetrics 1.9
        expects the tensor itself."""

        def get_image_features(self, *args: Any, **kwargs: Any) -> Any:
            out = super().get_image_features(*args, **kwargs)
            return out if isinstance(out, torch.Tensor) else out.pooler_output

        def get_text_features(self, *args: Any, **kwargs: Any) -> Any:
            out = super().get_text_features(*args, **kwargs)
            return out if isinstance(out, torch.Tensor) else out.pooler_output

    torch.manual_seed(0)
    model = FeatureTensors(config).eval()
    metric = CLIPScore(model_name_or_path=lambda: (model, processor)).to(device)
    decoded = {}
    for path in dict.fromkeys(paths):
        with Image.open(path) as image:
            decoded[path] = pil_to_tensor(image.convert("RGB"))
    batch = 64

    def run() -> None:
        for start in range(0, len(captions), batch):
            metric.update([decoded[path].to(device) for path in paths[start:start + batch]],
                          captions[start:start + batch])
        metric.compute()

    seconds, _ = timed(device, run)
    return len(captions) / seconds


def scorer_keywords() -> dict[str, Any]:
    """The Scorer's parallel input keywords where it has them (`workers`: all cores)."""
    from pacs.metric.scoring.scorer import Scorer

    known = inspect.signature(Scorer).parameters
    return {"workers": os.cpu_count()} if "workers" in known else {}


def run_scoring(device: str, tiny: bool, work: Path, n_images: int) -> list[dict[str, Any]]:
    """The Scorer against the bare towers and torchmetrics, per model and precision."""
    import torch

    from pacs.metric.models.backbones import build_backbone_from_config
    from pacs.metric.scoring.scorer import Scorer

    paths = write_images(work / "images", n_images, (96, 72) if tiny else (480, 360))
    per_image = captions_for(n_images)
    images = [path for path, caps in zip(paths, per_image) for _ in caps]
    captions = [caption for caps in per_image for caption in caps]
    batch = 16 if tiny else 256
    extra = scorer_keywords()
    rows = []
    for name in ("ViT-B-32", "ViT-L-14"):
        backbone = build_backbone_from_config(model_config(name, tiny), seed=0, name=name, device=device)
        pixels = torch.stack([backbone.preprocess(_open(path)) for path in paths]).to(device)
        tokens = backbone.tokenize(captions).to(device)
        model = backbone.model.eval()
        tm_rate = torchmetrics_clipscore(device, tiny, images, captions) if name == "ViT-B-32" else None
        for dtype in ("fp32", "bf16"):
            Scorer(backbone, device=device, dtype=dtype, batch_size=batch, progress=False, prompt="", **extra).score(
                images[:batch], captions[:batch])  # warm-up: kernels, allocator
            scorer = Scorer(backbone, device=device, dtype=dtype, batch_size=batch, progress=False, prompt="", **extra)
            seconds, result = timed(device, lambda scorer=scorer: scorer.score(images, captions))
            tower_cosines(model, pixels, tokens, len(per_image[0]), batch, device, dtype)  # warm-up
            tower_seconds, cosines = timed(device, lambda dtype=dtype, model=model, pixels=pixels, tokens=tokens:
                                           tower_cosines(model, pixels, tokens, len(per_image[0]), batch, device,
                                                         dtype))
            pacs_rate, tower_rate = len(captions) / seconds, len(captions) / tower_seconds
            gpu_rate = None
            if device.startswith("cuda") and "decode" in inspect.signature(Scorer).parameters:
                Scorer(backbone, device=device, dtype=dtype, batch_size=batch, progress=False, prompt="",
                       decode="gpu", **extra).score(images[:batch], captions[:batch])  # warm-up
                gpu_scorer = Scorer(backbone, device=device, dtype=dtype, batch_size=batch, progress=False,
                                    prompt="", decode="gpu", **extra)
                gpu_seconds, _ = timed(device, lambda gpu_scorer=gpu_scorer: gpu_scorer.score(images, captions))
                gpu_rate = len(captions) / gpu_seconds
            rows.append({"model": name, "dtype": dtype, "pairs": len(captions), "pacs Scorer pairs/s": pacs_rate,
                         "bare towers pairs/s": tower_rate, "Scorer / towers %": 100 * pacs_rate / tower_rate,
                         "Scorer decode=gpu pairs/s": gpu_rate,
                         "torchmetrics CLIPScore pairs/s": tm_rate if dtype == "fp32" else None,
                         "max abs Δcos Scorer vs towers": float((torch.as_tensor(result.cosines, dtype=torch.float32)
                                                              - cosines.cpu()).abs().max())})
        del backbone, model, pixels
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    workers = f", Scorer workers={extra['workers']}" if extra else ", Scorer without a workers option (one thread)"
    print_table(f"Scoring: {n_images} JPEGs × 5 captions, batch {batch}, random weights{workers}",
                ["model", "dtype", "pairs", "pacs Scorer pairs/s", "bare towers pairs/s", "Scorer / towers %",
                 "Scorer decode=gpu pairs/s", "torchmetrics CLIPScore pairs/s", "max abs Δcos Scorer vs towers"],
                rows)
    return rows


def run_overlap(device: str, tiny: bool, work: Path, n_images: int) -> list[dict[str, Any]]:
    """The simulated-device section's counterpart on the card (issue 43): decode-only (the Scorer with towers that
    cost nothing), towers-only (the bare towers on device tensors) and the Scorer, per model and precision."""
    import torch

    from pacs.metric.models.backbones import build_backbone_from_config
    from pacs.metric.scoring.scorer import Scorer

    paths = write_images(work / "images", n_images, (96, 72) if tiny else (480, 360))
    per_image = captions_for(n_images)
    images = [path for path, caps in zip(paths, per_image) for _ in caps]
    captions = [caption for caps in per_image for caption in caps]
    batch = 16 if tiny else 256
    options = {"device": device, "batch_size": batch, "progress": False, "prompt": "", **scorer_keywords()}
    rows = []
    for name in ("ViT-B-32", "ViT-L-14"):
        backbone = build_backbone_from_config(model_config(name, tiny), seed=0, name=name, device=device)
        pixels = torch.stack([backbone.preprocess(_open(path)) for path in paths]).to(device)
        tokens = backbone.tokenize(captions).to(device)
        model = backbone.model.eval()
        for dtype in ("fp32", "bf16"):
            Scorer(backbone, dtype=dtype, **options).score(images[:batch], captions[:batch])  # warm-up
            scorer_seconds, _ = timed(device, lambda dtype=dtype, backbone=backbone: Scorer(
                backbone, dtype=dtype, **options).score(images, captions))
            tower_cosines(model, pixels, tokens, len(per_image[0]), batch, device, dtype)  # warm-up
            tower_seconds, _ = timed(device, lambda dtype=dtype, model=model, pixels=pixels, tokens=tokens:
                                     tower_cosines(model, pixels, tokens, len(per_image[0]), batch, device, dtype))
            width = model.encode_image(pixels[:1]).shape[-1]
            def free(inputs: Any, *args: Any, width: int = width, **kwargs: Any) -> Any:
                return torch.ones(len(inputs), width, device=device)
            saved = backbone.encode_image, backbone.encode_text
            backbone.encode_image = backbone.encode_text = free  # this backbone object only: towers that cost nothing
            try:
                decode_seconds, _ = timed(device, lambda dtype=dtype, backbone=backbone: Scorer(
                    backbone, dtype=dtype, **options).score(images, captions))
            finally:
                backbone.encode_image, backbone.encode_text = saved
            rows.append({"model": name, "dtype": dtype, "pairs": len(captions), "decode-only s": decode_seconds,
                         "towers-only s": tower_seconds, "Scorer s": scorer_seconds,
                         "Scorer / max(decode, towers)": scorer_seconds / max(decode_seconds, tower_seconds),
                         "Scorer / towers %": 100 * tower_seconds / scorer_seconds})
        del backbone, model, pixels
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    print_table(f"Overlap: {n_images} JPEGs × 5 captions, batch {batch}, random weights, "
                f"Scorer workers={options.get('workers', 'none')}",
                ["model", "dtype", "pairs", "decode-only s", "towers-only s", "Scorer s",
                 "Scorer / max(decode, towers)", "Scorer / towers %"], rows)
    return rows


def tower_cosines(model: Any, pixels: Any, tokens: Any, per_image: int, batch: int, device: str, dtype: str) -> Any:
    """The bare towers on device tensors: the cosine of every (image, caption) pair, `per_image` captions each."""
    import torch

    with torch.no_grad(), autocast(device, dtype):
        image_emb = torch.cat([model.encode_image(pixels[i:i + batch]) for i in range(0, len(pixels), batch)])
        text_emb = torch.cat([model.encode_text(tokens[i:i + batch]) for i in range(0, len(tokens), batch)])
    image_emb = torch.nn.functional.normalize(image_emb.float(), dim=-1)
    text_emb = torch.nn.functional.normalize(text_emb.float(), dim=-1)
    index = torch.arange(len(pixels), device=image_emb.device).repeat_interleave(per_image)
    return (image_emb[index] * text_emb).sum(-1)


def _open(path: str):
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB")


# --- decoding --------------------------------------------------------------------------------------------------

def gpu_preprocess(device: str, raw: list, size: int, mean: list[float], std: list[float]):
    """nvJPEG decode on the device, then CLIP's preprocessing there (antialiased resize, centre crop, normalise)."""
    import torch
    from torchvision.io import decode_jpeg
    from torchvision.transforms.v2 import functional as F

    decoded = decode_jpeg(raw, device=device)
    mean_t = torch.tensor(mean, device=device).view(3, 1, 1)
    std_t = torch.tensor(std, device=device).view(3, 1, 1)
    out = []
    for image in decoded:
        image = F.resize(image.float(), [size], antialias=True, interpolation=F.InterpolationMode.BICUBIC)
        image = F.center_crop(image, [size, size]).clamp(0, 255)
        out.append((image / 255 - mean_t) / std_t)
    return torch.stack(out)


def run_decode(device: str, tiny: bool, work: Path, n_images: int) -> list[dict[str, Any]]:
    """Decode + preprocess rates: 1 worker, all cores (threads), the GPU."""
    import torch
    from torchvision.io import read_file

    from pacs.metric.models.backbones import build_backbone_from_config

    paths = write_images(work / "images", n_images, (96, 72) if tiny else (480, 360))
    backbone = build_backbone_from_config(model_config("ViT-B-32", tiny), seed=0, name="ViT-B-32")

    def load(path: str):
        return backbone.preprocess(_open(path))

    cores = os.cpu_count() or 1
    rows = []
    seconds, _ = timed("cpu", lambda: [load(path) for path in paths])
    rows.append({"decoder": "PIL + preprocess, 1 worker", "images/s": n_images / seconds, "x 1 worker": 1.0})
    base = n_images / seconds
    with concurrent.futures.ThreadPoolExecutor(cores) as pool:
        seconds, _ = timed("cpu", lambda: list(pool.map(load, paths)))
    rows.append({"decoder": f"PIL + preprocess, {cores} threads", "images/s": n_images / seconds,
                 "x 1 worker": n_images / seconds / base})
    if device.startswith("cuda"):
        spec = backbone.preprocess  # pacs' ImagePreprocess: size, mean, std (bicubic, shortest side, centre crop)
        size, mean, std = int(spec.size), list(spec.mean), list(spec.std)
        raw = [read_file(path) for path in paths]
        gpu_preprocess(device, raw[:8], size, mean, std)  # warm-up
        seconds, pixels = timed(device, lambda: gpu_preprocess(device, raw, size, mean, std))
        reference = torch.stack([load(path) for path in paths[:16]])
        delta = float((pixels[:16].cpu() - reference).abs().max())
        rows.append({"decoder": "nvJPEG + resize on the GPU (files read first)", "images/s": n_images / seconds,
                     "x 1 worker": n_images / seconds / base, "max abs Δpixel vs PIL": delta})
    else:
        rows.append({"decoder": "nvJPEG on the GPU: n/a without CUDA"})
    print_table(f"Decoding: {n_images} JPEGs ({'96×72' if tiny else '480×360'}) to {'toy' if tiny else 'ViT-B/32'} "
                "input tensors", ["decoder", "images/s", "x 1 worker", "max abs Δpixel vs PIL"], rows)
    return rows


# --- metric training -------------------------------------------------------------------------------------------

def peak_tflops(device: str, override: str | None) -> tuple[float, float] | None:
    """The card's dense (bf16, fp32) peak TFLOP/s: `--peak-tflops`, else the table, else None (unknown / CPU)."""
    import torch

    if override:
        bf16, fp32 = (float(value) for value in override.split(","))
        return bf16, fp32
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    for card, peaks in PEAK_TFLOPS.items():
        if card in name:
            return peaks
    return None


def train_step(encoder: Any, tokenize: Any, data: tuple, optimizer: Any, device: str, dtype: str) -> None:
    """One metric-training step as the trainer takes it: autocast forward, fp32 loss, backward, AdamW."""
    import torch

    from pacs.metric.training.trainer import LossOptions, compute_loss

    with autocast(device, dtype):
        terms = compute_loss(encoder, tokenize, data, LossOptions(), torch.device(device))
    terms.total.backward()  # the loss is fp32 (embeddings are cast up before it)
    optimizer.step()
    optimizer.zero_grad()


def run_train(device: str, tiny: bool, peaks: tuple[float, float] | None) -> list[dict[str, Any]]:
    """Metric training steps/s, peak memory and MFU per mode and precision."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from pacs.metric.models.backbones import build_backbone_from_config
    from pacs.metric.training.trainer import DualEncoder, MetricTrainConfig, prepare_trainable, trainable_parameters

    batch, warmup, steps = (4, 1, 2) if tiny else (64, 3, 10)
    config = model_config("ViT-B-32", tiny)
    size = config["vision_cfg"]["image_size"]
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, size, size, generator=generator).to(device)
    captions = [caption for caps in captions_for(batch, 1) for caption in caps]
    data = (images, captions, images.flip(-1), [c.replace("a ", "one ", 1) for c in captions])
    rows = []
    for mode in ("projection", "lora", "full"):
        for dtype in ("fp32", "bf16"):
            backbone = build_backbone_from_config(config, seed=0, name="ViT-B-32", device=device)
            trained = prepare_trainable(backbone, MetricTrainConfig(mode=mode))
            model = trained.model.to(device).train()
            params = trainable_parameters(model)
            optimizer = torch.optim.AdamW(list(params.values()), lr=1e-5)
            encoder = DualEncoder(model)

            def step(encoder=encoder, tokenize=trained.tokenize, optimizer=optimizer, dtype=dtype) -> None:
                train_step(encoder, tokenize, data, optimizer, device, dtype)

            counter = FlopCounterMode(display=False)
            with counter:
                step()
            flops = counter.get_total_flops()
            for _ in range(warmup):
                step()
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            seconds, _ = timed(device, lambda: [step() for _ in range(steps)])
            rate = steps / seconds
            achieved = flops * rate / 1e12
            peak = None if peaks is None else peaks[0 if dtype == "bf16" else 1]
            rows.append({"mode": mode, "dtype": dtype, "steps/s": rate, "TFLOP/s": achieved,
                         "MFU %": None if peak is None else 100 * achieved / peak,
                         "peak GB": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None,
                         "GFLOP per step": flops / 1e9, "trainable": sum(p.numel() for p in params.values())})
            del backbone, trained, model, optimizer, encoder
    for row in rows:
        fp32 = next(r for r in rows if r["mode"] == row["mode"] and r["dtype"] == "fp32")
        row["x fp32"] = row["steps/s"] / fp32["steps/s"]
    peak_text = "no peak known for this device: MFU —" if peaks is None else \
        f"MFU against {peaks[0]:g} (bf16) / {peaks[1]:g} (fp32) dense TFLOP/s"
    print_table(f"Metric training: {'toy CLIP' if tiny else 'ViT-B/32'}, batch {batch} (+ {batch} positives), "
                f"{steps} timed steps; {peak_text}",
                ["mode", "dtype", "steps/s", "x fp32", "TFLOP/s", "MFU %", "peak GB", "GFLOP per step", "trainable"],
                rows)
    return rows


# --- XE and SCST -----------------------------------------------------------------------------------------------

class TimedReward:
    """A reward that adds up the (synchronised) seconds of its calls; everything else is the wrapped reward's."""

    def __init__(self, reward: Any, device: str) -> None:
        self.reward, self.device, self.seconds, self.calls = reward, device, 0.0, 0

    def __call__(self, *args: Any) -> Any:
        seconds, values = timed(self.device, lambda: self.reward(*args))
        self.seconds += seconds
        self.calls += 1
        return values

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reward, name)


def run_captioner(device: str, tiny: bool, work: Path, n_images: int) -> list[dict[str, Any]]:
    """XE and SCST steps/s at COCO shape, per reward and precision, with the reward's share of an SCST step."""
    import torch

    from pacs.captioner.modeling.features import FeatureCache
    from pacs.captioner.modeling.model import CaptionerConfig
    from pacs.captioner.modeling.train_scst import SCSTConfig, train_scst
    from pacs.captioner.modeling.train_xe import XEConfig, train_xe
    from pacs.captioner.modeling.vocab import build_vocab
    from pacs.metric.models.backbones import build_backbone_from_config
    from pacs.rewards import build_reward

    n_train = 48 if tiny else 2000
    data = work / "coco" / "dataset_coco.json"
    data.parent.mkdir(parents=True, exist_ok=True)
    ids = write_karpathy(data, n_train, 8, 0)
    records = {str(image["cocoid"]): [s["raw"] for s in image["sentences"]]
               for image in json.loads(data.read_text())["images"]}
    folder = work / "coco" / "features"
    if not (folder / "meta.json").is_file():
        write_features(folder, ids["train"] + ids["val"], {"backbone": "random ViT-B/32 shape", "fingerprint": "bench"},
                       1)
    features = FeatureCache(folder)
    train_pairs = [(image_id, caption) for image_id in ids["train"] for caption in records[image_id]]
    vocab = build_vocab("word", [caption for _, caption in train_pairs], min_count=1 if tiny else 5, max_length=16)
    model = (CaptionerConfig(d_model=32, n_heads=4, encoder_layers=1, decoder_layers=1, ffn_dim=64) if tiny
             else CaptionerConfig())
    xe_steps, xe_batch = (2, 16) if tiny else (20, 256)
    scst_steps, scst_batch, k = (2, 4, 2) if tiny else (10, 32, 5)
    paths = write_images(work / "images", n_images, (96, 72) if tiny else (480, 360))
    scst_ids = ids["train"][:n_images]  # the SCST slice: images with a JPEG file (the pac-s++ reward reads them)
    references = [records[i] for i in ids["train"]]
    reward_model = build_backbone_from_config(model_config("ViT-B-32", tiny), seed=0, name="ViT-B-32",
                                              family="pac-s++", device=device)
    val = {image_id: records[image_id] for image_id in ids["val"]}
    rows = []
    for dtype in ("fp32", "bf16"):
        precision = "no" if dtype == "fp32" else "bf16"
        xe_config = XEConfig(output_dir=str(work / "coco" / f"xe-{dtype}"), max_steps=xe_steps, batch_size=xe_batch,
                             micro_batch_size=xe_batch, eval_every=0, save_every=xe_steps, val_max_images=8,
                             val_beam_size=1, trackers=[], mixed_precision=precision, log_every=xe_steps)
        shutil.rmtree(xe_config.output_dir, ignore_errors=True)
        seconds, xe = timed(device, lambda xe_config=xe_config: train_xe(
            xe_config, dataclasses.replace(model), vocab, features, train_pairs, val))
        rows.append({"stage": "XE", "reward": "—", "dtype": dtype, "steps": xe_steps, "batch": xe_batch,
                     "steps/s": xe_steps / seconds, "last loss": xe.losses[-1]})
        for spec in ("cider", "pac-s++"):
            context = {"train_references": references} if spec == "cider" else {
                "backbone": reward_model, "image_paths": dict(zip(scst_ids, paths)), "device": device,
                "dtype": dtype, "batch_size": 256}
            reward = TimedReward(build_reward(spec, **context), device)
            config = SCSTConfig(output_dir=str(work / "coco" / f"scst-{spec}-{dtype}"), reward=spec, batch_size=scst_batch,
                                micro_batch_size=scst_batch, max_steps=scst_steps, epochs=scst_steps, k=k,
                                save_every=scst_steps,
                                trackers=[], mixed_precision=precision, lr=5e-6)
            shutil.rmtree(config.output_dir, ignore_errors=True)
            seconds, result = timed(device, lambda config=config, reward=reward, init=xe.final_dir: train_scst(
                config, init, features, [(i, records[i]) for i in scst_ids], reward))
            rows.append({"stage": "SCST", "reward": spec, "dtype": dtype, "steps": result.steps, "batch": scst_batch,
                         "steps/s": result.steps / seconds, "reward share %": 100 * reward.seconds / seconds,
                         "last loss": result.losses[-1]})
    for row in rows:
        fp32 = next(r for r in rows if (r["stage"], r["reward"], r["dtype"]) == (row["stage"], row["reward"], "fp32"))
        row["x fp32"] = row["steps/s"] / fp32["steps/s"]
    del reward_model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    print_table(f"Captioner at COCO shape: {n_train} training images × 5 captions, 50×768 grid features, "
                f"{'a toy' if tiny else 'the paper’s 3+3-layer d512'} captioner; SCST {scst_batch} images × k={k} "
                "beam samples (times include each stage's set-up and XE's closing validation on 8 images)",
                ["stage", "reward", "dtype", "steps", "batch", "steps/s", "x fp32", "reward share %", "last loss"],
                rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto (the GPU when there is one), cuda, cuda:N or cpu")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (a test runs them on the CPU)")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--images", type=int, default=None, help="JPEGs for scoring / decoding (300; tiny: 6)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed)")
    parser.add_argument("--peak-tflops", default=None, help="BF16,FP32 dense peak TFLOP/s of the card (MFU)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", default=None, help="also write every row to this JSON file")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)} (known: {', '.join(SECTIONS)})")
    import torch

    from pacs.metric.common.device import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    n_images = args.images or (6 if args.tiny else 300)
    card = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "CPU"
    print(f"bench_gpu: device {device} ({card}), torch {torch.__version__}, {os.cpu_count()} cores"
          + (", toy sizes" if args.tiny else ""))
    results: dict[str, Any] = {"device": device, "card": card, "torch": torch.__version__, "tiny": args.tiny}
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        work = Path(args.work) if args.work else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        runs = {"main": lambda: run_main_command(device, args.tiny, work),
                "scoring": lambda: run_scoring(device, args.tiny, work, n_images),
                "overlap": lambda: run_overlap(device, args.tiny, work, n_images),
                "decode": lambda: run_decode(device, args.tiny, work, n_images),
                "train": lambda: run_train(device, args.tiny, peak_tflops(device, args.peak_tflops)),
                "captioner": lambda: run_captioner(device, args.tiny, work, n_images)}
        for section in sections:
            section_start = time.perf_counter()
            results[section] = runs[section]()
            print(f"\n({section}: {time.perf_counter() - section_start:.1f} s)")
    results["seconds"] = time.perf_counter() - started
    print(f"\nbench_gpu: {results['seconds']:.1f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
