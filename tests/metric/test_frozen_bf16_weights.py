"""bf16 that pays (issue 43 item 4): a frozen model that only its scorer runs gets its Linear / conv weights cast
to bf16 once, instead of autocast casting them again on every call; the scores do not move by a bit.

Autocast computes a linear layer in bf16 from `weight.to(bf16)`; a weight cast beforehand is that same tensor, so
the embeddings must be equal exactly (no tolerance), while the parameters that meet other ops (embeddings,
LayerNorm, the class and positional embeddings) must stay fp32, or type promotion would change the sums.
"""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from pacs.metric.common.errors import InputError
from pacs.metric.scoring import decode_pool
from pacs.metric.scoring.model_options import ModelOptions, build_scorer
from pacs.metric.scoring.precision import cast_frozen_weights, weights_dtype
from pacs.metric.scoring.scorer import Scorer

IMAGES = [Image.new("RGB", (64, 64), colour) for colour in ("red", "green", "navy", "white", "orange")]
# a shared prompt prefix: the prefix-state path (pruned_forward) runs on the cast weights too
CAPTIONS = ["a red square", "a green field at dawn", "a dark blue night", "snow", "an orange on a table"]


def _copy(backbone):
    return dataclasses.replace(backbone, model=copy.deepcopy(backbone.model))


def _score(backbone, cast: bool) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    scorer = Scorer(backbone, progress=False, dtype="bf16", workers=0, cast_weights=cast)
    result = scorer.score(IMAGES, CAPTIONS)
    return result.scores, scorer.embed_images(IMAGES), scorer.embed_texts(CAPTIONS)


def _copies(model: torch.nn.Module) -> int:
    """The `aten::_to_copy` calls of one bf16 forward of both towers (a fresh batch: no cache)."""
    pixels, tokens = torch.randn(2, 3, 64, 64), torch.randint(1, 400, (2, 77))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile, \
            torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model.encode_image(pixels)
        model.encode_text(tokens)
    return sum(event.count for event in profile.key_averages() if event.key == "aten::_to_copy")


def test_cast_weights_score_bit_for_bit_as_autocast_does(tiny_backbone):
    autocast = _score(_copy(tiny_backbone), cast=False)
    cast_backbone = _copy(tiny_backbone)
    cast = _score(cast_backbone, cast=True)
    for before, after in zip(autocast, cast):
        assert np.array_equal(np.asarray(before), np.asarray(after))
    kinds = {name: parameter.dtype for name, parameter in cast_backbone.model.named_parameters()}
    assert kinds["visual.conv1.weight"] == kinds["visual.proj"] == kinds["text_projection"] == torch.bfloat16
    assert kinds["transformer.resblocks.0.attn.out_proj.weight"] == torch.bfloat16
    assert kinds["transformer.resblocks.1.mlp.c_fc.bias"] == kinds["transformer.resblocks.0.mlp.c_proj.weight"] \
        == torch.bfloat16
    for kept in ("transformer.resblocks.0.attn.in_proj_weight", "transformer.resblocks.0.mlp.c_fc.weight",
                 "visual.transformer.resblocks.0.mlp.c_fc.weight", "token_embedding.weight", "positional_embedding", "visual.class_embedding",
                 "visual.positional_embedding", "ln_final.weight", "visual.ln_pre.bias"):
        assert kinds[kept] == torch.float32, kept


@pytest.mark.parametrize("name", ["open_clip-siglip", "open_clip-siglip2", "transformers-clip",
                                  "transformers-siglip", "transformers-siglip2"])
def test_every_family_scores_bit_for_bit_on_cast_weights(name, tiny_family_folder):
    from backbone_fixtures import BUILDERS  # noqa: F401 (the fixture builds from it)

    from pacs.metric.models.factory import load_backbone

    folder = tiny_family_folder(name)
    autocast = _score(load_backbone(checkpoint=folder), cast=False)
    cast_backbone = load_backbone(checkpoint=folder)
    cast = _score(cast_backbone, cast=True)
    for before, after in zip(autocast, cast):
        assert np.array_equal(np.asarray(before), np.asarray(after)), name
    assert weights_dtype(cast_backbone.model) == torch.bfloat16


def test_the_cast_removes_autocasts_per_call_weight_copies(tiny_backbone):
    model = copy.deepcopy(tiny_backbone.model).eval().requires_grad_(False)
    before = _copies(model)
    cast = cast_frozen_weights(model, "bf16")
    after = _copies(model)
    # every cast tensor was copied at least once per forward before (some are used more than once); none is now
    assert cast > 0 and before - after >= cast, (before, after, cast)
    assert cast_frozen_weights(model, "bf16") == 0  # twice is once
    assert cast_frozen_weights(copy.deepcopy(tiny_backbone.model), "fp32") == 0


def test_build_scorer_casts_only_a_model_it_owns(tiny_backbone, adapted):
    options = ModelOptions(dtype="bf16", device="cpu", workers=0)
    given = _copy(tiny_backbone)
    scorer = build_scorer("clip-s", options, given, progress=False)
    assert scorer.backbone is given and weights_dtype(given.model) == torch.float32  # another may run it in fp32
    merged = build_scorer(None, options, adapted, progress=False)  # a LoRA model: scored on a merged copy
    assert merged.backbone is not adapted and weights_dtype(merged.backbone.model) == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in adapted.model.parameters())  # the model given is left as it is


def test_a_cast_model_scored_in_another_precision_is_one_clear_error(tiny_backbone):
    backbone = _copy(tiny_backbone)
    Scorer(backbone, progress=False, dtype="bf16", workers=0, cast_weights=True)
    with pytest.raises(InputError, match=r"^tiny-test: its weights are bf16 \(a bf16 scorer cast them once\); "
                                         r"score it with dtype='bf16'"):
        Scorer(backbone, progress=False, dtype="fp32", workers=0)
    Scorer(backbone, progress=False, dtype="bf16", workers=0)  # the same precision: fine


def test_the_prefetch_depth_is_bounded_by_its_budget_and_half_the_free_shared_memory():
    shape = (3, 224, 224)  # 602,112 bytes of fp32 pixels per image, 38,535,168 per batch of 64
    assert decode_pool.prefetch_batches(64, shape, budget=512 * 2**20, shared_free=10 * 2**30) == 13  # 536,870,912 //
    assert decode_pool.prefetch_batches(64, shape, budget=512 * 2**20, shared_free=200 * 2**20) == 2  # 100 MiB: 2
    assert decode_pool.prefetch_batches(64, shape, budget=10**6, shared_free=10 * 2**30) == 2  # at least two
    assert decode_pool.prefetch_batches(8, (3, 336, 336), budget=512 * 2**20, shared_free=2**40) == 49
