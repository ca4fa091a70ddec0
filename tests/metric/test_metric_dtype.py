"""`--dtype` / `Scorer(dtype=...)`: fp32 runs without autocast and is unchanged; bf16/fp16 really compute in low
precision and stay close to fp32 (measured on the official-format fixture A); rewards, CLI and torchmetrics pass it."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau

from pacs.cli import main
from pacs.metric.common.errors import InputError
from pacs.metric.models.factory import load_backbone
from pacs.metric.scoring.scorer import Scorer, check_dtype

# Measured on fixture A (32 instances, w = 2.0): max |Δ PAC-S| bf16 0.025, fp16 0.0034 (docs/metric.md).
BOUNDS = {"bf16": 0.06, "fp16": 0.01}


@pytest.fixture(scope="module")
def fixture_a(pacscore_fixtures):
    """Backbone, images, captions and references of fixture A (PAC-S++ with LoRA, tiny ViT)."""
    folder = pacscore_fixtures / "A"
    expected = json.loads((folder / "expected.json").read_text())
    instances = expected["instances"]
    return {"backbone": load_backbone(checkpoint=str(folder / expected["checkpoint"]), arch=str(folder / "arch.json")),
            "checkpoint": str(folder / expected["checkpoint"]), "arch": str(folder / "arch.json"),
            "images": [str(pacscore_fixtures / "inputs" / "images" / inst["image"]) for inst in instances],
            "captions": [inst["candidate"] for inst in instances],
            "references": [inst["references"] for inst in instances],
            "official": np.array([inst["pac_s"] for inst in instances])}


class _AutocastSpy:
    """Wraps a backbone's encoders and records (autocast enabled, autocast dtype) at every call."""

    def __init__(self, backbone, monkeypatch) -> None:
        self.seen: list[tuple[bool, torch.dtype]] = []
        for name in ("encode_image", "encode_text"):
            original = getattr(backbone, name)

            def spy(*args, _original=original, **kwargs):
                self.seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
                return _original(*args, **kwargs)

            monkeypatch.setattr(backbone, name, spy)


def test_check_dtype_names():
    assert [check_dtype(x) for x in (None, "FP32", " bf16", torch.float16, torch.bfloat16)] == [
        "fp32", "fp32", "bf16", "fp16", "bf16"]
    with pytest.raises(InputError, match="unknown dtype 'int8'"):
        check_dtype("int8")
    with pytest.raises(InputError, match="unknown dtype"):
        check_dtype(torch.float64)


def test_fp32_runs_without_autocast_and_is_unchanged(fixture_a, monkeypatch):
    """fp32 never enters autocast; its scores equal the default scorer's bit for bit and the official ones."""
    default = Scorer(fixture_a["backbone"], w=2.0).score(fixture_a["images"], fixture_a["captions"]).scores
    spy = _AutocastSpy(fixture_a["backbone"], monkeypatch)
    fp32 = Scorer(fixture_a["backbone"], w=2.0, dtype="fp32").score(fixture_a["images"], fixture_a["captions"]).scores
    assert spy.seen and not any(enabled for enabled, _ in spy.seen)
    assert np.array_equal(fp32, default)  # the same fp32 computation on the same batches: bit-equal on any CPU
    assert np.abs(fp32 - fixture_a["official"]).max() <= 1e-4


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_low_precision_is_used_and_close_to_fp32(fixture_a, monkeypatch, dtype):
    """The towers run under autocast(dtype); scores move (so it took effect) but by little, and rank alike."""
    reference = fixture_a["official"]
    spy = _AutocastSpy(fixture_a["backbone"], monkeypatch)
    scorer = Scorer(fixture_a["backbone"], w=2.0, dtype=dtype)
    scores = scorer.score(fixture_a["images"], fixture_a["captions"]).scores
    wanted = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    assert spy.seen and all(seen == (True, wanted) for seen in spy.seen)
    delta = np.abs(scores.astype(np.float64) - reference)
    assert 1e-5 < delta.max() <= BOUNDS[dtype]
    assert kendalltau(scores, reference).statistic > 0.9
    embeddings = scorer.embed_images(fixture_a["images"][:2])
    assert embeddings.dtype == torch.float32  # low precision inside, fp32 out
    assert torch.allclose(embeddings.norm(dim=-1), torch.ones(2), atol=1e-6)


def test_disk_cache_is_keyed_by_dtype(fixture_a, tmp_path):
    """fp32 keeps the fingerprint folder of before; bf16 gets its own, so the two never share an embedding."""
    backbone = fixture_a["backbone"]
    for dtype in ("fp32", "bf16"):
        Scorer(backbone, dtype=dtype, cache_dir=tmp_path).embed_images(fixture_a["images"][:1])
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert len(folders) == 2 and backbone.fingerprint[:32] in folders
    bf16_folder = next(tmp_path / f for f in folders if f != backbone.fingerprint[:32])
    cached = np.load(next(bf16_folder.glob("*.npy")))
    fresh = Scorer(backbone, dtype="bf16").embed_images(fixture_a["images"][:1])[0].numpy()
    assert np.array_equal(cached, fresh)


def test_cli_dtype(fixture_a, tmp_path):
    """`pacs score --dtype bf16` scores as Scorer(dtype="bf16") and records it; an unknown dtype exits 2."""
    image_map, candidates = tmp_path / "map.json", tmp_path / "cands.json"
    ids = [f"i{n}" for n in range(len(fixture_a["images"]))]
    image_map.write_text(json.dumps(dict(zip(ids, fixture_a["images"]))))
    candidates.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in zip(ids, fixture_a["captions"])]))
    base = ["score", "--metric", "pac-s++", "--w", "2.0", "--checkpoint", fixture_a["checkpoint"], "--arch",
            fixture_a["arch"], "--image-map", str(image_map), "--candidates", str(candidates)]
    assert main([*base, "--dtype", "bf16", "--out", str(tmp_path / "bf16.json")]) == 0
    output = json.loads((tmp_path / "bf16.json").read_text())
    assert output["provenance"]["config"]["dtype"] == "bf16"
    expected = Scorer(fixture_a["backbone"], w=2.0, dtype="bf16").score(fixture_a["images"], fixture_a["captions"])
    assert np.abs(np.array([r["score"] for r in output["per_instance"]]) - expected.scores).max() <= 1e-6
    with pytest.raises(SystemExit) as error:
        main([*base, "--dtype", "int8"])
    assert error.value.code == 2


def test_rewards_and_torchmetrics_take_dtype(fixture_a):
    """A reward's own scorer and a torchmetrics metric compute in the requested dtype."""
    from pacs.rewards import RewardResources, build_reward

    resources = RewardResources()
    backbone = fixture_a["backbone"]
    paths = dict(zip(fixture_a["images"], fixture_a["images"]))
    low = build_reward("pac-s++", backbone=backbone, dtype="bf16", image_paths=paths, resources=resources, w=2.0)
    full = build_reward("pac-s++", backbone=backbone, image_paths=paths, resources=resources, w=2.0)
    images, captions = fixture_a["images"][:4], fixture_a["captions"][:4]
    rewards_low = low(images, [[c] for c in captions], [[]] * 4)[:, 0].numpy()
    rewards_full = full(images, [[c] for c in captions], [[]] * 4)[:, 0].numpy()
    expected_low = Scorer(backbone, w=2.0, dtype="bf16").score(images, captions).scores
    assert np.array_equal(rewards_low, expected_low)  # the reward is this scorer on the same batches (bf16 alike)
    assert np.abs(rewards_full - fixture_a["official"][:4]).max() <= 1e-4
    assert sorted(key[-1] for key in resources.scorers) == ["bf16", "fp32"]
    tm = pytest.importorskip("pacs.metric.scoring.tm_metrics")
    metric = tm.PACScorePlusPlus(backbone=backbone, w=2.0, dtype="fp16", return_per_sample=True)
    metric.update(images, captions)
    expected_fp16 = Scorer(backbone, w=2.0, dtype="fp16").score(images, captions).scores
    assert np.array_equal(metric.compute()["per_sample"].numpy(), expected_fp16)
