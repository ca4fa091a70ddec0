"""bench/bench_gpu.py at toy sizes on the CPU (`--device cpu --tiny`): every section runs, so the GPU benchmark
cannot rot between the runs on a card (issue 30 item 5)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_section_runs_at_toy_sizes_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--device", "cpu", "--tiny",
                           "--threads", "1", "--work", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["device"] == "cpu" and results["tiny"] is True
    # the main command: the smoke preset (metric stages) in a fresh `accelerate launch` process, exit 0, its run dir
    (main,) = results["main"]
    assert main["exit code"] == 0, main
    assert (tmp_path / "work" / "main" / "demo_smoke" / "pacs" / "checkpoint.safetensors").is_file()
    # scoring: 2 models x 2 precisions over 6 images x 5 captions; the Scorer's cosines are the bare towers' own
    scoring = results["scoring"]
    assert [(r["model"], r["dtype"]) for r in scoring] == [
        ("ViT-B-32", "fp32"), ("ViT-B-32", "bf16"), ("ViT-L-14", "fp32"), ("ViT-L-14", "bf16")]
    assert all(r["pairs"] == 30 for r in scoring)
    for row in scoring:  # fp32: the same products summed in other batch shapes; bf16: 8 mantissa bits (2^-8 = 0.004)
        assert row["max abs Δcos Scorer vs towers"] < (1e-5 if row["dtype"] == "fp32" else 0.05), row
    assert scoring[0]["torchmetrics CLIPScore pairs/s"] > 0 and scoring[1]["torchmetrics CLIPScore pairs/s"] is None
    # decoding: one worker, every core, and the GPU row that says it needs CUDA here
    decode = results["decode"]
    assert [r["decoder"] for r in decode] == ["PIL + preprocess, 1 worker", f"PIL + preprocess, {os.cpu_count()} threads",
                                              "nvJPEG on the GPU: n/a without CUDA"]
    # metric training: 3 modes x 2 precisions; the FLOPs of a step do not depend on the precision; no MFU on a CPU
    train = results["train"]
    assert [(r["mode"], r["dtype"]) for r in train] == [
        (mode, dtype) for mode in ("projection", "lora", "full") for dtype in ("fp32", "bf16")]
    for fp32, bf16 in zip(train[::2], train[1::2]):
        assert fp32["GFLOP per step"] == bf16["GFLOP per step"] and fp32["trainable"] == bf16["trainable"]
    assert train[0]["trainable"] < train[2]["trainable"] < train[4]["trainable"]  # projection < LoRA < full
    assert all(r["MFU %"] is None for r in train)
    # XE and SCST with both rewards in both precisions, every configured step taken
    captioner = results["captioner"]
    assert [(r["stage"], r["reward"], r["dtype"]) for r in captioner] == [
        (stage, reward, dtype) for dtype in ("fp32", "bf16")
        for stage, reward in (("XE", "—"), ("SCST", "cider"), ("SCST", "pac-s++"))]
    assert all(r["steps"] == 2 for r in captioner)
    for heading in ("The main command, smoke preset", "Scoring:", "Decoding:", "Metric training:", "Captioner at COCO"):
        assert f"### {heading}" in done.stdout
