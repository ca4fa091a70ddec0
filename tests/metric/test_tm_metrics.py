"""torchmetrics metrics (`pacs.metric.scoring.tm_metrics`): the numbers of `pacs score`, tensor images, a 2-process gloo sync."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("torchmetrics")

from pacs.cli import main
from pacs.metric.common.errors import InputError
from pacs.metric.models.families import FamilyMismatchError
from pacs.metric.scoring.tm_metrics import (
    CLIPScore,
    PACScore,
    PACScorePlusPlus,
    pac_score,
    pac_score_plus_plus,
)

TOLERANCE = 1e-6
# fixture folder -> (metric class, family metric name)
FIXTURES = {"A": (PACScorePlusPlus, "pac-s++"), "C": (PACScore, "pac-s")}


def _fixture(root: Path, name: str) -> dict:
    """Instances, image paths, checkpoint and arch of one official-format fixture folder."""
    folder = root / name
    expected = json.loads((folder / "expected.json").read_text())
    instances = expected["instances"]
    return {"expected": expected, "instances": instances,
            "images": [str(root / "inputs" / "images" / inst["image"]) for inst in instances],
            "captions": [inst["candidate"] for inst in instances],
            "references": [inst["references"] for inst in instances],
            "checkpoint": str(folder / expected["checkpoint"]), "arch": str(folder / "arch.json")}


def _cli_scores(fixture: dict, metric: str, work: Path, extra: list[str]) -> dict:
    """`pacs score` on the fixture (one image id per instance, as the parity test), parsed output JSON."""
    ids = [f"instance{index:04d}" for index in range(len(fixture["instances"]))]
    candidates, references, image_map = work / "c.json", work / "r.json", work / "m.json"
    candidates.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in zip(ids, fixture["captions"])]))
    references.write_text(json.dumps(dict(zip(ids, fixture["references"]))))
    image_map.write_text(json.dumps(dict(zip(ids, fixture["images"]))))
    out = work / f"{metric}.json"
    code = main(["score", "--metric", metric, "--checkpoint", fixture["checkpoint"], "--arch", fixture["arch"],
                 "--candidates", str(candidates), "--references", str(references), "--image-map", str(image_map),
                 "--out", str(out), "--batch-size", "8", *extra])
    assert code == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_metrics_equal_pacs_score_on_official_fixtures(pacscore_fixtures, tmp_path, name):
    """Reference-free and Ref- metric, updated in two batches, give `pacs score`'s per-instance values and mean."""
    fixture = _fixture(pacscore_fixtures, name)
    metric_class, family = FIXTURES[name]
    half = len(fixture["captions"]) // 2
    for metric_name, reference_based in ((family, False), (f"ref-{family}", True)):
        cli = _cli_scores(fixture, metric_name, tmp_path, ["--w", "2.0"])
        metric = metric_class(checkpoint=fixture["checkpoint"], arch=fixture["arch"], w=2.0, batch_size=8,
                              reference_based=reference_based, return_per_sample=True)
        assert metric.metric_name == metric_name
        for part in (slice(0, half), slice(half, None)):
            metric.update(fixture["images"][part], fixture["captions"][part],
                          fixture["references"][part] if reference_based else None)
        result = metric.compute()
        expected = np.array([row["score"] for row in cli["per_instance"]])
        assert np.abs(result["per_sample"].numpy() - expected).max() <= TOLERANCE
        assert abs(float(result["score"]) - cli["mean"]) <= TOLERANCE
    # the official code's mean PAC-S (w = 2.0), independently of pacs score
    assert abs(float(result["per_sample"].double().mean()) - fixture["expected"]["mean"]["ref_pac_s"]) <= 1e-4


def test_clipscore_default_w_and_functional_twin(pacscore_fixtures, tmp_path):
    """CLIPScore on fixture C (family not established) uses w = 2.5 like `pacs score --metric clip-s`."""
    fixture = _fixture(pacscore_fixtures, "C")
    cli = _cli_scores(fixture, "clip-s", tmp_path, [])
    metric = CLIPScore(checkpoint=fixture["checkpoint"], arch=fixture["arch"])
    metric.update(fixture["images"], fixture["captions"])
    assert metric.w == 2.5 and cli["w"] == 2.5
    assert abs(float(metric.compute()) - cli["mean"]) <= TOLERANCE
    # the functional twin: references given -> the Ref- variant; per-sample on request
    cli_ref = _cli_scores(fixture, "ref-pac-s", tmp_path, ["--w", "2.0"])
    functional = pac_score(fixture["images"], fixture["captions"], fixture["references"], return_per_sample=True,
                           checkpoint=fixture["checkpoint"], arch=fixture["arch"], w=2.0)
    expected = np.array([row["score"] for row in cli_ref["per_instance"]])
    assert np.abs(functional["per_sample"].numpy() - expected).max() <= TOLERANCE


def test_image_tensors_score_as_their_files(pacscore_fixtures, tmp_path):
    """uint8 [N,3,H,W], float [0,1] and 1-channel tensors of the decoded pixels give the files' own scores."""
    fixture = _fixture(pacscore_fixtures, "A")
    options = {"checkpoint": fixture["checkpoint"], "arch": fixture["arch"], "return_per_sample": True}
    # three different JPEG files: instances sharing a file would be encoded once from paths but once per copy from
    # the crops' files, and a batch of another size may round differently on some CPUs (torch.equal below)
    firsts = {path: i for i, path in reversed(list(enumerate(fixture["images"]))) if path.endswith(".jpg")}
    jpegs = sorted(firsts.values())[:3]
    assert len(jpegs) == 3
    paths = [fixture["images"][i] for i in jpegs]
    captions = [fixture["captions"][i] for i in jpegs]
    arrays = [np.array(Image.open(path)) for path in paths]  # RGB JPEGs: decoding is what the scorer does
    assert all(Image.open(path).mode == "RGB" for path in paths)
    from_files = pac_score_plus_plus(paths, captions, **options)["per_sample"]
    height, width = min(a.shape[0] for a in arrays), min(a.shape[1] for a in arrays)
    crops = [a[:height, :width] for a in arrays]
    crop_paths = []
    for index, crop in enumerate(crops):  # lossless copies of equal-size crops, for one [N, 3, H, W] batch
        crop_paths.append(str(tmp_path / f"crop{index}.png"))
        Image.fromarray(crop).save(crop_paths[-1])
    batch = torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2).contiguous()  # uint8 [N, 3, H, W]
    assert batch.dtype == torch.uint8 and batch.shape[1] == 3
    from_crop_files = pac_score_plus_plus(crop_paths, captions, **options)["per_sample"]
    assert torch.equal(pac_score_plus_plus(batch, captions, **options)["per_sample"], from_crop_files)
    assert torch.equal(pac_score_plus_plus(batch.float() / 255, captions, **options)["per_sample"], from_crop_files)
    as_list = [torch.from_numpy(a).permute(2, 0, 1) for a in arrays]  # list of [3, H, W] of different sizes
    assert torch.equal(pac_score_plus_plus(as_list, captions, **options)["per_sample"], from_files)
    gray = np.array(Image.open(paths[0]).convert("L"))
    gray_path = tmp_path / "gray.png"
    Image.fromarray(gray).save(gray_path)
    assert torch.equal(pac_score_plus_plus(torch.from_numpy(gray)[None], captions[:1], **options)["per_sample"],
                       pac_score_plus_plus([str(gray_path)], captions[:1], **options)["per_sample"])


def test_bad_input_is_one_clear_error(pacscore_fixtures):
    fixture = _fixture(pacscore_fixtures, "A")
    free = PACScorePlusPlus(checkpoint=fixture["checkpoint"], arch=fixture["arch"])
    with pytest.raises(InputError, match="reference_based=True"):
        free.update(fixture["images"][:1], fixture["captions"][:1], [fixture["references"][0]])
    with pytest.raises(InputError, match=r"image #1: a float image tensor must hold values in \[0, 1\]"):
        free.update(torch.stack([torch.zeros(3, 8, 8), torch.full((3, 8, 8), 2.0)]), ["a", "b"])
    with pytest.raises(InputError, match=r"2 images but 1 captions"):
        free.update(fixture["images"][:2], ["a"])
    ref = PACScorePlusPlus(checkpoint=fixture["checkpoint"], arch=fixture["arch"], reference_based=True)
    with pytest.raises(InputError, match="reference-based"):
        ref.update(fixture["images"][:1], fixture["captions"][:1])
    with pytest.raises(InputError, match="caption #0: expected a list of strings"):
        ref.update(fixture["images"][:1], fixture["captions"][:1], ["a single string"])
    with pytest.raises(FamilyMismatchError, match="pac-s needs a pac-s model"):
        PACScore(checkpoint=fixture["checkpoint"], arch=fixture["arch"])  # a PAC-S++ file (LoRA keys)
    with pytest.raises(InputError, match="either a loaded Backbone or checkpoint="):
        PACScorePlusPlus(backbone=free.scorer.backbone, checkpoint=fixture["checkpoint"])
    assert free.scores == []  # nothing was kept from the refused updates
    assert torch.isnan(free.compute())


def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str, fixture: dict, split: int) -> None:
    """One of two gloo processes: update its part of the fixture, compute (torchmetrics syncs), save the result."""
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        part = slice(0, split) if rank == 0 else slice(split, None)
        metric = PACScorePlusPlus(checkpoint=fixture["checkpoint"], arch=fixture["arch"], reference_based=True,
                                  return_per_sample=True)
        metric.update(fixture["images"][part], fixture["captions"][part], fixture["references"][part])
        torch.save(metric.compute(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


def test_two_gloo_processes_equal_one(pacscore_fixtures, tmp_path):
    """Uneven halves (13 / 19) on two processes: torchmetrics' sync gives every rank the 1-process result."""
    fixture = _fixture(pacscore_fixtures, "A")
    fixture = {key: fixture[key] for key in ("checkpoint", "arch", "images", "captions", "references")}
    # fork: the children inherit the imported modules (spawn would re-import torch and open_clip in each)
    torch.multiprocessing.start_processes(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path), fixture, 13),
                                          nprocs=2, join=True, start_method="fork")
    single = PACScorePlusPlus(checkpoint=fixture["checkpoint"], arch=fixture["arch"], reference_based=True,
                              return_per_sample=True)
    # the same two updates on one process: every image and text is encoded in a batch of the same size as on the
    # ranks (a batch of another size may round differently on some CPUs, and torch.equal is asked for below)
    for part in (slice(0, 13), slice(13, None)):
        single.update(fixture["images"][part], fixture["captions"][part], fixture["references"][part])
    expected = single.compute()
    assert expected["per_sample"].shape == (32,)
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert torch.equal(result["per_sample"], expected["per_sample"])
        assert abs(float(result["score"]) - float(expected["score"])) <= TOLERANCE


class _PacsAsHfClip(torch.nn.Module):
    """A pacs backbone behind the two methods torchmetrics' CLIPScore calls on a transformers CLIPModel."""

    def __init__(self, backbone) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = object()  # no text_config: torchmetrics then does no truncation of its own

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.backbone.model.encode_image(pixel_values)

    def get_text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.backbone.model.encode_text(input_ids)


def _pacs_as_hf_processor(backbone):
    """A processor callable as torchmetrics calls CLIPProcessor: images -> pixel_values, text -> input_ids."""
    from pacs.metric.scoring.tm_metrics import to_image_inputs

    def processor(images=None, text=None, return_tensors="pt", padding=True):
        if images is not None:
            return {"pixel_values": torch.stack([backbone.preprocess(image) for image in to_image_inputs(images)])}
        ids = backbone.tokenize(list(text))  # [N, 77], no prompt (torchmetrics adds none)
        return {"input_ids": ids, "attention_mask": (ids != 0).long()}

    return processor


@pytest.mark.parametrize("name", ["C", "tiny-seed10", "tiny-seed6"])
def test_torchmetrics_clipscore_is_100_times_the_clamped_mean_cosine(pacscore_fixtures, name):
    """torchmetrics' CLIPScore on the same model = max(100 · mean(cos), 0) with no prompt; = 40 · pacs CLIP-S
    (w = 2.5, prompt "") only when no cosine is negative (pacs clamps each sample, torchmetrics the mean)."""
    from torchmetrics.multimodal import CLIPScore as TorchmetricsCLIPScore

    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    from pacs.metric.models.factory import load_backbone
    from pacs.metric.scoring.scorer import Scorer

    fixture = _fixture(pacscore_fixtures, "C")
    if name == "C":
        backbone = load_backbone(checkpoint=fixture["checkpoint"], arch=fixture["arch"])
    else:  # random tiny models whose cosines on these pairs have both signs (mean > 0 for seed 10, < 0 for 6)
        backbone = build_backbone_from_config(tiny_clip_config(), seed=int(name.removeprefix("tiny-seed")))
    jpegs = [path for path in fixture["images"] if path.endswith(".jpg")][:4]
    captions = ["a dog runs on the grass", "two people on a street", "a red car", "a child in a pool"]
    pixels = [torch.from_numpy(np.array(Image.open(path))).permute(2, 0, 1) for path in jpegs]  # uint8 [3, H, W]
    theirs = TorchmetricsCLIPScore(model_name_or_path=lambda: (_PacsAsHfClip(backbone),
                                                               _pacs_as_hf_processor(backbone)))
    theirs.update(pixels, captions)
    ours = Scorer(backbone, w=2.5, prompt="").score(jpegs, captions)
    cosines = ours.cosines.astype(np.float64)
    assert abs(float(theirs.compute()) - max(100 * cosines.mean(), 0.0)) <= 1e-3
    forty_times_pacs = 40 * float(np.mean(ours.scores, dtype=np.float64))
    if name == "C":  # every cosine positive: the two scales differ by 100 / w only
        assert cosines.min() > 0
        assert abs(float(theirs.compute()) - forty_times_pacs) <= 1e-3
    else:  # negative cosines count in torchmetrics' mean; pacs clamps them to 0 first, so it is above 40x
        assert cosines.min() < 0 < cosines.max()
        assert forty_times_pacs - float(theirs.compute()) > 1e-2
