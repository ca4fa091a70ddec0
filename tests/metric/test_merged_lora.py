"""Frozen passes of a LoRA model run on merged weights (issue 43 item 4): merged once, on a copy; the same scores.

Merging replaces W·x + s·B·(A·x) by (W + s·B·A)·x: the same function, computed with other roundings. The
tolerance of the fp32 comparison is therefore measured, not guessed: in fp64 merged and unmerged agree to ~1e-16
(the same function), and in fp32 their difference is compared with the rounding error of the unmerged fp32 pass
itself (its distance from the fp64 pass). Measured on the tiny random CLIP (max |Δ| of the normalised embeddings):
fp32 merged vs unmerged 2.2e-7, the unmerged fp32 pass vs fp64 1.9e-7 (so the bound 3× that is met with room);
merged in fp64 vs unmerged fp64 5e-16; the fp32-merged weights run in fp64 vs unmerged fp64 1e-7 (the rounding of
W + s·B·A to fp32). A wrong merge (e.g. a missing scale) moves them by the adapter's effect, 0.17 here.
"""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch
from PIL import Image

from pacs.metric.models.lora import carries_lora, merged_for_inference
from pacs.metric.scoring.model_options import ModelOptions, build_scorer
from pacs.metric.scoring.scorer import Scorer

IMAGES = [Image.new("RGB", (64, 64), colour) for colour in ("red", "green", "navy", "white")]
CAPTIONS = ["a red square", "a green field", "a dark blue night", "snow"]
#: the Scorer's documented float tolerance (results independent of batch size and order up to 1e-5)
SCORER_FLOAT_TOLERANCE = 1e-5
#: the documented bf16 deviation of a score from fp32 (docs/performance.md: max |Δ score| 2.5e-2, fixture A)
BF16_TOLERANCE = 2.5e-2



def _embeddings(model: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """Normalised image and text embeddings of fixed inputs, stacked, computed in `dtype`."""
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randn(4, 3, 64, 64, generator=generator)
    tokens = torch.randint(1, 400, (4, 77), generator=generator)  # the context length
    model = copy.deepcopy(model).to(dtype)
    with torch.no_grad():
        image = model.encode_image(pixels.to(dtype))
        text = model.encode_text(tokens)
    return torch.cat([torch.nn.functional.normalize(image, dim=-1), torch.nn.functional.normalize(text, dim=-1)])


def test_merged_weights_compute_the_unmerged_function(adapted):
    merged = merged_for_inference(adapted).model
    adapted64 = dataclasses.replace(adapted, model=copy.deepcopy(adapted.model).double())
    unmerged64 = _embeddings(adapted64.model, torch.float64)
    merged64 = _embeddings(merged_for_inference(adapted64).model, torch.float64)  # merged in fp64
    unmerged32, merged32 = _embeddings(adapted.model, torch.float32), _embeddings(merged, torch.float32)
    assert (merged64 - unmerged64).abs().max() <= 1e-12  # fp64: the same function (rounding ~1e-16)
    rounding = (unmerged32.double() - unmerged64).abs().max()  # fp32's own rounding error on this computation
    difference = (merged32 - unmerged32).abs().max()
    assert 0 < rounding < 1e-6
    assert difference <= 3 * rounding  # merging adds rounding of the order of the fp32 pass's own, nothing more
    no_adapter = _embeddings(copy.deepcopy(adapted.model).unload(), torch.float32)
    assert (no_adapter - unmerged32).abs().max() > 1000 * rounding  # the adapter does change the embeddings


def test_build_scorer_scores_a_lora_backbone_on_a_merged_copy(adapted):
    before = {name: value.clone() for name, value in adapted.model.state_dict().items()}
    trainable = sorted(name for name, p in adapted.model.named_parameters() if p.requires_grad)
    scorer = build_scorer(None, ModelOptions(workers=0), adapted, progress=False)
    assert not carries_lora(scorer.backbone) and carries_lora(adapted)
    assert not any("lora_" in name for name, _ in scorer.backbone.model.named_parameters())
    assert scorer.backbone.fingerprint == adapted.fingerprint  # the same function: the same embedding-cache key
    after = adapted.model.state_dict()  # the model given (it may still be training) is not merged into
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert sorted(name for name, p in adapted.model.named_parameters() if p.requires_grad) == trainable

    merged = scorer.score(IMAGES, CAPTIONS).scores
    unmerged = Scorer(adapted, progress=False, workers=0).score(IMAGES, CAPTIONS).scores  # as given: adapters
    np.testing.assert_allclose(merged, unmerged, rtol=0, atol=scorer.w * SCORER_FLOAT_TOLERANCE)
    bf16 = build_scorer(None, ModelOptions(workers=0, dtype="bf16"), adapted, progress=False)
    assert not carries_lora(bf16.backbone)
    assert np.abs(bf16.score(IMAGES, CAPTIONS).scores - unmerged).max() <= BF16_TOLERANCE


def test_a_backbone_without_adapters_is_not_copied(tiny_backbone):
    assert merged_for_inference(tiny_backbone) is tiny_backbone
    assert build_scorer(None, ModelOptions(workers=0), tiny_backbone, progress=False).backbone is tiny_backbone
