"""What docs/train_metric.md says of a trained run's `adapter/` and `checkpoint.safetensors` (issue 21, item 10.5).

They hold the same model up to float rounding, not bit for bit: during training peft merges the attention LoRA
deltas into the base weights and takes them out again at every forward pass, so the trained model's base drifts by
rounding errors from the base file the adapter is later merged onto. Their fingerprints differ by definition.
"""
from __future__ import annotations

import hashlib
import json

import torch
from PIL import Image

from pacs.metric.common.provenance import sha256_file
from pacs.metric.models.backbones import model_fingerprint, save_backbone
from pacs.metric.models.factory import load_backbone
from pacs.metric.scoring.scorer import Scorer
from pacs.metric.training.trainer import MetricTrainConfig, train_metric

from .metric_train_driver import positives, tiny_backbone

TOLERANCE = 1e-6  # the bound docs/train_metric.md states (measured: weights 3e-8, embeddings 9e-8 apart)


def test_adapter_and_checkpoint_of_a_trained_run_agree_to_rounding(tmp_path) -> None:
    save_backbone(tiny_backbone(), tmp_path / "base.safetensors")  # a base file, as the demo's `pacs` stage has
    base = load_backbone(checkpoint=str(tmp_path / "base.safetensors"))
    config = MetricTrainConfig(mode="lora", random_init=True, batch_size=8, max_steps=3, eval_every=0, log_every=0,
                               lr=1e-2, seed=0, cpu=True, output_dir=str(tmp_path / "run"))
    out = train_metric(config, positives(24, 0), positives(8, 1), backbone=base)
    merged = load_backbone(checkpoint=str(out / "checkpoint.safetensors"))
    adapter = load_backbone(checkpoint=str(out / "adapter"))

    adapter_weights = adapter.model.state_dict()
    for key, value in merged.model.state_dict().items():
        assert (value - adapter_weights[key]).abs().max() <= TOLERANCE, key
    images = [Image.new("RGB", (32, 32), colour) for colour in ("red", "blue", "white")]
    captions = ["dog runs", "blue water", "snow"]
    embeddings = [(Scorer(b, progress=False).embed_images(images), Scorer(b, progress=False).embed_texts(captions))
                  for b in (merged, adapter)]
    assert torch.allclose(embeddings[0][0], embeddings[1][0], atol=TOLERANCE, rtol=0)
    assert torch.allclose(embeddings[0][1], embeddings[1][1], atol=TOLERANCE, rtol=0)

    # the checkpoint's fingerprint is that of its weights; the adapter's names its base and adapter file
    assert merged.fingerprint == model_fingerprint(merged.model, merged.open_clip_config, merged.preprocess)
    record = json.loads((out / "adapter" / "pacs_base.json").read_text())
    adapter_file = sha256_file(out / "adapter" / "adapter_model.safetensors")
    assert record["base_fingerprint"] == base.fingerprint
    assert adapter.fingerprint == hashlib.sha256(f"{base.fingerprint}+{adapter_file}".encode()).hexdigest()
    assert adapter.fingerprint != merged.fingerprint
