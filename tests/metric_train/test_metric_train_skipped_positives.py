"""Training encodes only the positives its loss uses: with λv = 0 (λt = 0) no v' (t') is encoded, same gradients."""
from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file

from pacs.metric.common.errors import PacsError
from pacs.metric.training import trainer as trainer_module
from pacs.metric.training.config import LossOptions
from pacs.metric.training.data import collate_positives, split_micro_batches
from pacs.metric.training.encoding import DualEncoder, encode_positives, loss_on_embeddings
from pacs.metric.training.grad_cache import grad_cache_step
from pacs.metric.training.losses import positive_augmented_loss, positives_needed
from pacs.metric.training.trainer import MetricTrainConfig, train_metric

from .metric_train_driver import positives, tiny_backbone

torch.set_num_threads(1)


@pytest.mark.parametrize(("lambda_v", "lambda_t", "relative", "expected"), [
    (0.1, 0.001, 0.0, (True, True)), (0.0, 0.0, 0.0, (False, False)), (0.0, 0.2, 0.0, (False, True)),
    (0.3, 0.0, 0.0, (True, False)), (0.0, 0.0, 0.5, (True, True))])
def test_positives_needed_follows_the_non_zero_weights(lambda_v, lambda_t, relative, expected):
    assert positives_needed(lambda_v, lambda_t, relative) == expected


def test_the_loss_without_an_unused_positive_equals_the_full_loss_and_refuses_a_missing_used_one():
    generator = torch.Generator().manual_seed(5)
    img, txt, gen_img, gen_txt = (torch.nn.functional.normalize(torch.randn(6, 4, generator=generator), dim=-1)
                                  for _ in range(4))
    full = positive_augmented_loss(img, txt, gen_img, gen_txt, 3.0, lambda_v=0.0, lambda_t=0.2)
    skipped = positive_augmented_loss(img, txt, None, gen_txt, 3.0, lambda_v=0.0, lambda_t=0.2)
    assert skipped.gen_image is None and "gen_image" not in skipped.as_floats()
    assert float(skipped.total) == pytest.approx(float(full.real + 0.2 * full.gen_text), abs=1e-7)
    assert float(skipped.total) == pytest.approx(float(full.total), abs=1e-7)
    with pytest.raises(PacsError, match="gen_txt is None"):
        positive_augmented_loss(img, txt, gen_img, None, 3.0, lambda_v=0.1, lambda_t=0.2)
    with pytest.raises(PacsError, match="gen_img is None"):
        positive_augmented_loss(img, txt, None, gen_txt, 3.0, lambda_v=0.0, lambda_t=0.0, relative_weight=0.5)


def _gradients(micro: int, skip: bool, options: LossOptions) -> tuple[float, dict[str, torch.Tensor], list[int]]:
    backbone = tiny_backbone()
    for param in backbone.model.parameters():
        param.requires_grad_(True)
    encoder = DualEncoder(backbone.model)
    rows: list[int] = []
    encoder.model.visual.register_forward_hook(lambda _m, args, _out: rows.append(int(args[0].shape[0])))
    batch = collate_positives([positives(8, 3)[i] for i in range(8)])
    needed = positives_needed(options.lambda_v, options.lambda_t, options.relative_weight) if skip else (True, True)
    terms = grad_cache_step(split_micro_batches(batch, micro),
                            lambda part: encode_positives(encoder, backbone.tokenize, part, torch.device("cpu"),
                                                          *needed),
                            lambda embeddings, scale: loss_on_embeddings(embeddings, scale, options),
                            lambda loss: loss.backward())
    grads = {name: p.grad.clone() for name, p in backbone.model.named_parameters() if p.grad is not None}
    return float(terms.total.detach()), grads, rows


@pytest.mark.parametrize("micro", [8, 4])  # one micro-batch (direct step) and GradCache over two
@pytest.mark.parametrize("options", [LossOptions(lambda_v=0.0, lambda_t=0.0), LossOptions(lambda_v=0.0, lambda_t=0.2),
                                     LossOptions(lambda_v=0.3, lambda_t=0.0, margin_weight=0.5)])
def test_skipping_unused_positives_keeps_the_loss_and_gradients(micro, options):
    full_loss, full_grads, full_rows = _gradients(micro, False, options)
    loss, grads, rows = _gradients(micro, True, options)
    assert loss == pytest.approx(full_loss, abs=1e-6)
    assert set(grads) == set(full_grads) and len(grads) > 10
    for name, grad in grads.items():
        assert torch.allclose(grad, full_grads[name], atol=1e-6), name
    passes = 1 if micro == 8 else 2  # GradCache encodes every micro-batch twice
    image_rows = 8 * (2 if options.lambda_v else 1)
    assert sum(rows) == passes * image_rows and sum(full_rows) == passes * 16


def test_plain_contrastive_training_skips_the_positives_and_trains_the_same_weights(tmp_path, monkeypatch, caplog):
    def config(out: str) -> MetricTrainConfig:
        return MetricTrainConfig(mode="full", random_init=True, loss=LossOptions(lambda_v=0.0, lambda_t=0.0),
                                 batch_size=8, micro_batch_size=4, max_steps=3, eval_every=0, log_every=0, lr=1e-3,
                                 cpu=True, seed=0, output_dir=out)

    with caplog.at_level(logging.INFO):
        train_metric(config(str(tmp_path / "skipped")), positives(24, 0), positives(24, 0), backbone=tiny_backbone())
    assert "encodes no generated images (v') and no generated captions (t')" in caplog.text
    monkeypatch.setattr(trainer_module, "positives_needed", lambda *_: (True, True))  # the old, full encoding
    train_metric(config(str(tmp_path / "full")), positives(24, 0), positives(24, 0), backbone=tiny_backbone())
    skipped = load_file(tmp_path / "skipped" / "checkpoint.safetensors")
    full = load_file(tmp_path / "full" / "checkpoint.safetensors")
    assert set(skipped) == set(full)
    initial = tiny_backbone().model.state_dict()
    changed = 0
    for name, tensor in skipped.items():
        if name.endswith("attn.in_proj_bias"):  # [query | key | value] biases
            third = tensor.shape[0] // 3
            # the key bias adds one constant per query to its attention logits, which softmax removes: its gradient
            # is float noise of either sign, which Adam turns into steps of about ±lr; compare query and value
            tensor, reference = (torch.cat([t[:third], t[2 * third:]]) for t in (tensor, full[name]))
        else:
            reference = full[name]
        assert torch.allclose(tensor, reference, atol=1e-5), name
        changed += not torch.equal(skipped[name], initial[name])
    assert changed > 10  # training moved the weights
    losses = [json.loads((tmp_path / run / "train_log.json").read_text())["train_losses"] for run in ("skipped", "full")]
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], abs=1e-5)
