"""`mixed_precision: bf16` is honoured (issue 30 item 2): metric training and feature extraction run their towers
under autocast with fp32 weights, losses stay fp32, and a bf16 feature cache is never mixed with an fp32 one.
CPU autocast knows bfloat16, so this runs anywhere."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from pacs.captioner.modeling.features import extract_features
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.models.grid import visual_grid_features
from pacs.metric.training import trainer
from pacs.metric.training.data import TensorPositivesDataset
from pacs.metric.training.encoding import DualEncoder
from pacs.metric.training.trainer import LoraOptions, MetricTrainConfig, train_metric


def _images(folder: Path, n: int = 3) -> dict[str, Path]:
    folder.mkdir()
    paths = {}
    for index, colour in enumerate(["red", "green", "blue", "white"][:n]):
        paths[str(index)] = folder / f"{index}.png"
        Image.new("RGB", (40, 30), colour).save(paths[str(index)])
    return paths


def test_feature_extraction_under_bf16_autocast_keeps_its_own_cache(tmp_path: Path) -> None:
    backbone = build_backbone_from_config(tiny_clip_config(), seed=0)
    images = _images(tmp_path / "images")
    low = extract_features(backbone, images, tmp_path / "bf16", batch_size=2, dtype="float32", mixed_precision="bf16")
    assert low.meta["mixed_precision"] == "bf16"
    pixels = torch.stack([backbone.preprocess(Image.open(images[i]).convert("RGB")) for i in sorted(images)])
    exact = visual_grid_features(backbone, pixels)  # fp32, computed here without the extractor
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = visual_grid_features(backbone, pixels).float()
    got = low.get(sorted(images))
    assert got.dtype == torch.float32
    # the extractor's batches (2, then 1) may round otherwise than one batch of 3: within bf16's resolution of the
    # autocast result computed here, and of the fp32 one (8 mantissa bits: 2^-8 relative, a few roundings deep)
    scale = exact.abs().max()
    assert (got - expected).abs().max() <= 2 ** -8 * scale * 8
    assert (got - exact).abs().max() <= 2 ** -8 * scale * 8
    assert not torch.equal(got, exact)  # bf16 really ran: some feature differs from fp32
    with pytest.raises(InputError, match="mixed_precision='bf16', this run asks for None"):
        extract_features(backbone, images, tmp_path / "bf16", batch_size=2, dtype="float32")


def test_metric_training_runs_its_forward_under_bf16_autocast_with_fp32_losses(tmp_path: Path, monkeypatch) -> None:
    seen = []
    forward = DualEncoder.forward

    def recording(self, images, tokens):
        out = forward(self, images, tokens)
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), out[0].dtype,
                     next(self.model.parameters()).dtype))
        return out

    monkeypatch.setattr(DualEncoder, "forward", recording)
    losses = []
    loss_on_embeddings = trainer.loss_on_embeddings

    def recording_loss(embeddings, scale, options):
        terms = loss_on_embeddings(embeddings, scale, options)
        losses.append(({e.dtype for e in embeddings if e is not None}, terms.total.dtype))
        return terms

    monkeypatch.setattr(trainer, "loss_on_embeddings", recording_loss)
    backbone = build_backbone_from_config(tiny_clip_config(), seed=0)
    generator = torch.Generator().manual_seed(0)
    images = list(torch.randn(8, 3, 64, 64, generator=generator))
    captions = [f"a photo of {i} dogs" for i in range(8)]
    data = TensorPositivesDataset(images, captions, images, [c + " outside" for c in captions],
                                  image_ids=[str(i) for i in range(8)])
    config = MetricTrainConfig(mode="lora", backbone=None, random_init=True, lora=LoraOptions(rank=2), batch_size=4,
                               max_steps=2, eval_every=0, patience=10**9, log_every=1, seed=0,
                               output_dir=str(tmp_path / "run"), mixed_precision="bf16", device="cpu")
    log = train_metric(config, data, data, backbone=backbone) / "train_log.json"
    assert log.is_file()
    training = [entry for entry in seen if entry[0]]  # the prepared encoder's calls (validation runs unwrapped)
    assert training and all(dtype == torch.bfloat16 and out == torch.bfloat16 and weights == torch.float32
                            for _, dtype, out, weights in training)
    assert any(not enabled for enabled, *_ in seen)  # validation embeds in fp32
    assert losses and all(dtypes == {torch.float32} and total == torch.float32 for dtypes, total in losses)
