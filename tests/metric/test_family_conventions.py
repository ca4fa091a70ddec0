"""Score conventions and long captions on the other backbone families (tiny SigLIP / SigLIP2 / transformers models
built offline by tests/backbone_fixtures.py): sigmoid equals the hand formula with the model's own scale and bias,
truncated captions are marked, chunking equals pieces embedded by the model and averaged by hand."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from pacs.metric.common.errors import InputError
from pacs.metric.models.factory import load_backbone
from pacs.metric.scoring.long_captions import pack_pieces
from pacs.metric.scoring.scorer import Scorer

SIGMOID_FAMILIES = ["open_clip-siglip", "open_clip-siglip2", "transformers-siglip", "transformers-siglip2"]
SHORT = "a dog. a cat."
LONG = "a dog. a cat. a man. a boy. two dogs run. a dog. a cat. a man."


@pytest.fixture(scope="module")
def family(request, tiny_family_folder):
    """The loaded tiny backbone of one family."""
    return load_backbone(checkpoint=tiny_family_folder(request.param))


@torch.no_grad()
def own_text(backbone, texts: list[str]) -> torch.Tensor:
    """Normalised text embeddings through the backbone's full-context tokenizer and text forward."""
    return torch.nn.functional.normalize(backbone.encode_text(backbone.tokenize(texts)).float(), dim=-1)


@torch.no_grad()
def own_image(backbone, image: Image.Image) -> torch.Tensor:
    """Normalised image embedding through the backbone's preprocessing and image forward."""
    return torch.nn.functional.normalize(backbone.encode_image(backbone.preprocess(image)[None]).float(), dim=-1)[0]


@pytest.mark.parametrize("family", SIGMOID_FAMILIES, indirect=True)
def test_sigmoid_equals_the_models_calibrated_probability(family):
    image = Image.new("RGB", (40, 30), (200, 30, 60))
    result = Scorer(family, score="sigmoid", prompt="", progress=False).score([image], [SHORT], [["a cat.", "a man."]])
    candidate = own_text(family, [SHORT])[0]
    cos = float(own_image(family, image) @ candidate)
    ref_cos = float((own_text(family, ["a cat.", "a man."]) @ candidate).max())
    scale, bias = family.logit_scale, family.logit_bias
    free = 1 / (1 + np.exp(-(scale * cos + bias)))
    ref = 1 / (1 + np.exp(-(scale * ref_cos + bias)))
    # compared on the logit scale: the tiny models' bias (-10) puts the probabilities near 0
    logit = np.log(result.clip_scores[0] / (1 - result.clip_scores[0]))
    assert logit == pytest.approx(scale * cos + bias, abs=1e-3)
    assert result.scores[0] == pytest.approx(2 * free * ref / (free + ref), rel=1e-4)
    assert result.score_kind == "sigmoid"


@pytest.mark.parametrize("family", SIGMOID_FAMILIES, indirect=True)
def test_long_captions_are_marked_and_chunked_on_every_family(family):
    truncated = family.tokenize_batch([SHORT, LONG]).truncated
    assert truncated == [False, True]  # the premise: LONG does not fit the 16-token context
    plain = Scorer(family, prompt="", progress=False).embed_texts_detailed([SHORT, LONG])
    assert plain.truncated == [False, True]
    chunked = Scorer(family, prompt="", progress=False, long_captions="chunk").embed_texts_detailed([SHORT, LONG])
    pieces = pack_pieces(LONG, lambda text: not family.tokenize_batch([text]).truncated[0])
    assert len(pieces) > 1 and chunked.pieces == [1, len(pieces)] and chunked.truncated == [False, False]
    # A caption that fits is embedded as it is. Chunking embeds [SHORT, *pieces] in one call, plain [SHORT, LONG]:
    # batches of other sizes and lengths, which a CPU's fp32 GEMM may block differently (a few ulp). Bit-equal only
    # against a plain embedding of the same texts in the same batch (same computation, same shapes, any machine)...
    same_batch = Scorer(family, prompt="", progress=False).embed_texts_detailed([SHORT, *pieces])
    assert torch.equal(chunked.embeddings[0], same_batch.embeddings[0])
    # ...and within float rounding of the plain [SHORT, LONG] batch: unit vectors, a few ulp (1.2e-7) per layer
    assert torch.allclose(chunked.embeddings[0], plain.embeddings[0], rtol=1e-5, atol=1e-6)
    mean = own_text(family, pieces).mean(0)
    assert torch.allclose(chunked.embeddings[1], mean / mean.norm(), atol=1e-5)


@pytest.mark.parametrize("family", ["transformers-clip"], indirect=True)
def test_sigmoid_is_refused_on_a_transformers_clip(family):
    assert family.logit_bias is None
    with pytest.raises(InputError, match="sigmoid needs a model trained with the sigmoid loss"):
        Scorer(family, score="sigmoid")


@pytest.mark.parametrize("family", [*SIGMOID_FAMILIES, "transformers-clip"], indirect=True)
def test_default_truncation_keeps_the_end_token_in_place(family):
    (short, long), truncated = family.tokenize_batch([SHORT, LONG]).ids, family.tokenize_batch([SHORT, LONG]).truncated
    assert truncated == [False, True] and len(long) == family.context_length
    # the short caption is a prefix of the long one: where their ids first differ, the short one has its end token
    split = next(i for i, (a, b) in enumerate(zip(short, long)) if a != b)
    assert long[-1] == short[split]
