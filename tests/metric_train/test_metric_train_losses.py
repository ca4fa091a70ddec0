"""The positive-augmented loss and the optional terms against direct (loop) computations."""
from __future__ import annotations

import math

import pytest
import torch

from pacs.metric.training.losses import (
    hard_negative_margin,
    positive_augmented_loss,
    relative_infonce,
    relative_positive_loss,
    sigmoid_pairwise,
    symmetric_infonce,
)


def _unit(n, e, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, e, generator=generator, dtype=torch.float64), dim=-1)


def _loop_infonce(v, t, scale):
    n = v.shape[0]
    cos = [[float(v[i] @ t[j]) for j in range(n)] for i in range(n)]
    i2t = -sum(math.log(math.exp(cos[i][i] * scale) / sum(math.exp(cos[i][j] * scale) for j in range(n)))
               for i in range(n)) / n
    t2i = -sum(math.log(math.exp(cos[i][i] * scale) / sum(math.exp(cos[j][i] * scale) for j in range(n)))
               for i in range(n)) / n
    return i2t, t2i


@pytest.mark.parametrize("scale", [1.0, 14.3, 100.0])
def test_symmetric_infonce_matches_loop(scale):
    v, t = _unit(6, 8, 0), _unit(6, 8, 1)
    i2t, t2i = _loop_infonce(v, t, scale)
    assert float(symmetric_infonce(v, t, scale)) == pytest.approx((i2t + t2i) / 2, rel=1e-9)
    assert float(symmetric_infonce(v, t, scale, directions="sum")) == pytest.approx(i2t + t2i, rel=1e-9)


def test_symmetric_infonce_is_asymmetric_per_direction_but_symmetric_overall():
    v, t = _unit(5, 4, 2), _unit(5, 4, 3)
    assert float(symmetric_infonce(v, t, 10.0)) == pytest.approx(float(symmetric_infonce(t, v, 10.0)), rel=1e-12)
    i2t, t2i = _loop_infonce(v, t, 10.0)
    assert abs(i2t - t2i) > 1e-6  # the two directions differ; the loss averages both


def test_positive_augmented_loss_combines_three_terms():
    v, t, vg, tg = (_unit(7, 8, s) for s in range(4))
    scale = 20.0
    expected = {}
    for name, (a, b) in {"real": (v, t), "gen_image": (vg, t), "gen_text": (v, tg)}.items():
        i2t, t2i = _loop_infonce(a, b, scale)
        expected[name] = (i2t + t2i) / 2
    terms = positive_augmented_loss(v, t, vg, tg, scale, lambda_v=0.1, lambda_t=0.001)
    assert float(terms.real) == pytest.approx(expected["real"], rel=1e-9)
    assert float(terms.gen_image) == pytest.approx(expected["gen_image"], rel=1e-9)
    assert float(terms.gen_text) == pytest.approx(expected["gen_text"], rel=1e-9)
    total = expected["real"] + 0.1 * expected["gen_image"] + 0.001 * expected["gen_text"]
    assert float(terms.total) == pytest.approx(total, rel=1e-9)
    pac_s = positive_augmented_loss(v, t, vg, tg, scale, lambda_v=0.05, lambda_t=0.1)
    assert float(pac_s.total) == pytest.approx(expected["real"] + 0.05 * expected["gen_image"]
                                               + 0.1 * expected["gen_text"], rel=1e-9)
    assert terms.relative is None and terms.margin is None  # extra terms are off by default


def test_loss_gradient_flows_to_logit_scale_only_when_it_requires_grad():
    v = _unit(4, 8, 0).requires_grad_(True)
    t = _unit(4, 8, 1)
    log_scale = torch.tensor(math.log(1 / 0.07), dtype=torch.float64, requires_grad=True)
    loss = symmetric_infonce(v, t, log_scale.exp())
    loss.backward()
    assert log_scale.grad is not None and v.grad is not None


def _loop_relative(anchors, cands, mask, scale, weights=None):
    total, count = 0.0, 0
    for i in range(anchors.shape[0]):
        pos = [m for m in range(cands.shape[0]) if mask[i][m]]
        if not pos:
            continue
        neg = [m for m in range(cands.shape[0]) if not mask[i][m]]
        s = [float(anchors[i] @ cands[m]) * scale for m in range(cands.shape[0])]
        neg_sum = sum(math.exp(s[m]) for m in neg)
        anchor_loss = 0.0
        for p in pos:
            q = 1.0 if weights is None else float(weights[i][p])
            anchor_loss += -q * math.log(math.exp(s[p]) / (math.exp(s[p]) + neg_sum))
        total += anchor_loss / len(pos)
        count += 1
    return total / count


def test_relative_infonce_matches_loop_and_ignores_other_positives():
    anchors, cands = _unit(4, 6, 5), _unit(9, 6, 6)
    mask = torch.zeros(4, 9, dtype=torch.bool)
    mask[0, [0, 4]] = True
    mask[1, [1]] = True
    mask[2, [2, 5, 7]] = True  # anchor 3 has no positive: not counted
    weights = torch.rand(4, 9, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.5
    assert float(relative_infonce(anchors, cands, mask, 5.0)) == pytest.approx(
        _loop_relative(anchors, cands, mask, 5.0), rel=1e-9)
    assert float(relative_infonce(anchors, cands, mask, 5.0, weights)) == pytest.approx(
        _loop_relative(anchors, cands, mask, 5.0, weights), rel=1e-9)
    # a positive is never a negative of its anchor: moving another positive changes nothing for this one
    moved = cands.clone()
    moved[4] = -moved[4]
    single = torch.zeros_like(mask)
    single[0, 0] = True
    other_as_neg = relative_infonce(anchors, moved, single, 5.0)
    assert float(relative_infonce(anchors, moved, mask, 5.0)) != pytest.approx(float(other_as_neg))


def test_relative_positive_loss_two_positives_per_anchor():
    v, t, vg, tg = (_unit(5, 8, s) for s in range(10, 14))
    n = 5
    mask = [[j == i or j == i + n for j in range(2 * n)] for i in range(n)]
    expected = (_loop_relative(v, torch.cat([t, tg]), mask, 12.0)
                + _loop_relative(t, torch.cat([v, vg]), mask, 12.0)) / 2
    assert float(relative_positive_loss(v, t, vg, tg, 12.0)) == pytest.approx(expected, rel=1e-9)
    weighted = relative_positive_loss(v, t, vg, tg, 12.0, weighting="similarity")
    assert torch.isfinite(weighted) and float(weighted) != pytest.approx(expected)
    terms = positive_augmented_loss(v, t, vg, tg, 12.0, relative_weight=0.5)
    assert float(terms.total) == pytest.approx(float(terms.real + 0.1 * terms.gen_image + 0.001 * terms.gen_text
                                                     + 0.5 * terms.relative), rel=1e-9)


def test_hard_negative_margin_matches_loop():
    v, t = _unit(6, 8, 20), _unit(6, 8, 21)
    cos = v @ t.t()
    n = 6
    image_side = sum(max(0.0, 0.2 - (float(cos[i, i]) - max(float(cos[i, j]) for j in range(n) if j != i)))
                     for i in range(n)) / n
    text_side = sum(max(0.0, 0.2 - (float(cos[i, i]) - max(float(cos[j, i]) for j in range(n) if j != i)))
                    for i in range(n)) / n
    assert float(hard_negative_margin(v, t, 0.2)) == pytest.approx((image_side + text_side) / 2, rel=1e-9)
    # perfectly separated pairs with a margin smaller than the gap cost nothing
    eye = torch.eye(4, dtype=torch.float64)
    assert float(hard_negative_margin(eye, eye, 0.5)) == 0.0
    assert float(hard_negative_margin(eye, eye, 1.5)) == pytest.approx(0.5)
    terms = positive_augmented_loss(v, t, v, t, 10.0, margin_weight=2.0)
    assert float(terms.margin) == pytest.approx((image_side + text_side) / 2, rel=1e-9)


def _loop_sigmoid(v, t, scale, bias):
    """SigLIP's loss by hand: -sum_ij log sigmoid(z_ij (s cos_ij + b)) / n, z = +1 on the diagonal, -1 elsewhere."""
    n = v.shape[0]
    total = 0.0
    for i in range(n):
        for j in range(n):
            z = 1.0 if i == j else -1.0
            total += -math.log(1.0 / (1.0 + math.exp(-z * (scale * float(v[i] @ t[j]) + bias))))
    return total / n


@pytest.mark.parametrize(("scale", "bias"), [(10.0, -10.0), (1.0, 0.0), (117.3, -12.9)])
def test_sigmoid_pairwise_matches_hand_computation(scale, bias):
    v, t = _unit(6, 8, 30), _unit(6, 8, 31)
    assert float(sigmoid_pairwise(v, t, scale, bias)) == pytest.approx(_loop_sigmoid(v, t, scale, bias), rel=1e-9)
    # swapping the two sets transposes the logit matrix; the labels are symmetric, so the sum is the same
    assert float(sigmoid_pairwise(t, v, scale, bias)) == pytest.approx(_loop_sigmoid(v, t, scale, bias), rel=1e-9)


def test_positive_augmented_sigmoid_loss_combines_three_terms():
    v, t, vg, tg = (_unit(5, 8, s) for s in range(40, 44))
    scale, bias = 9.0, -4.0
    terms = positive_augmented_loss(v, t, vg, tg, scale, lambda_v=0.1, lambda_t=0.001, kind="sigmoid",
                                    logit_bias=bias)
    expected = {"real": _loop_sigmoid(v, t, scale, bias), "gen_image": _loop_sigmoid(vg, t, scale, bias),
                "gen_text": _loop_sigmoid(v, tg, scale, bias)}
    for name, value in expected.items():
        assert float(getattr(terms, name)) == pytest.approx(value, rel=1e-9), name
    assert float(terms.total) == pytest.approx(expected["real"] + 0.1 * expected["gen_image"]
                                               + 0.001 * expected["gen_text"], rel=1e-9)
    # directions applies to InfoNCE only; the relative term keeps its InfoNCE form with the model's scale
    summed = positive_augmented_loss(v, t, vg, tg, scale, kind="sigmoid", logit_bias=bias, directions="sum")
    assert float(summed.total) == pytest.approx(float(terms.total), rel=1e-12)
    with_relative = positive_augmented_loss(v, t, vg, tg, scale, kind="sigmoid", logit_bias=bias, relative_weight=0.5)
    assert float(with_relative.relative) == pytest.approx(float(relative_positive_loss(v, t, vg, tg, scale)), rel=1e-12)


def test_sigmoid_loss_needs_a_bias_and_trains_scale_and_bias():
    from pacs.metric.common.errors import PacsError

    v, t = _unit(4, 8, 50).requires_grad_(True), _unit(4, 8, 51)
    with pytest.raises(PacsError, match="logit_bias"):
        positive_augmented_loss(v, t, v, t, 10.0, kind="sigmoid")
    log_scale = torch.tensor(math.log(10.0), dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(-10.0, dtype=torch.float64, requires_grad=True)
    positive_augmented_loss(v, t, None, None, log_scale.exp(), lambda_v=0.0, lambda_t=0.0, kind="sigmoid",
                            logit_bias=bias).total.backward()
    # d/db of -sum_ij log sigmoid(z (s c + b)) / n = -sum_ij z (1 - sigmoid(z (s c + b))) / n
    cos = (v @ t.t()).detach()
    z = 2 * torch.eye(4, dtype=torch.float64) - 1
    expected = float(-(z * (1 - torch.sigmoid(z * (10.0 * cos - 10.0)))).sum() / 4)
    assert float(bias.grad) == pytest.approx(expected, rel=1e-9)
    assert log_scale.grad is not None and abs(float(log_scale.grad)) > 0 and v.grad is not None


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="same shape"):
        symmetric_infonce(_unit(3, 4, 0), _unit(4, 4, 1), 1.0)


@pytest.mark.parametrize("name", ["train_metric.yaml", "train_metric_pacs.yaml", "train_metric_vitl14.yaml",
                                  "train_metric_correlation.yaml"])
def test_recipe_configs_load(name):
    from pathlib import Path

    from pacs.metric.common.config import load_config
    from pacs.metric.training.trainer import MetricTrainConfig

    config = load_config(MetricTrainConfig, Path(__file__).parents[2] / "recipes" / "configs" / name)
    config.validate()
    if name == "train_metric_pacs.yaml":
        assert (config.mode, config.loss.lambda_v, config.loss.lambda_t) == ("projection", 0.05, 0.1)
        assert config.lora.rank == 4 and config.loss.margin == 0.2  # the rest comes from the base file
    else:
        assert (config.mode, config.loss.lambda_v, config.loss.lambda_t) == ("lora", 0.1, 0.001)
    assert (config.lr, config.batch_size, config.patience) == (1e-4, 256, 1500)


@pytest.mark.parametrize("name", ["generate_positives.yaml", "generate_positives_smoke.yaml"])
def test_generator_configs_load(name):
    from pathlib import Path

    from pacs.metric.common.config import load_config
    from pacs.metric.training.positives import PositivesConfig

    config = load_config(PositivesConfig, Path(__file__).parents[2] / "recipes" / "configs" / name)
    assert config.captioner and config.text_to_image and config.safety_checker
