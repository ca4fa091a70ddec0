"""Pure score functions on embeddings, and the metric registry."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pacs.metric.common.errors import InputError
from pacs.metric.scoring.registry import METRICS, default_w, metric_spec
from pacs.metric.scoring.scores import clip_score, cosine, ref_score, reference_term


def test_clip_score_clips_negative_cosines_and_scales_by_w():
    image = np.array([[1.0, 0.0], [1.0, 0.0], [2.0, 0.0]], dtype=np.float32)
    text = np.array([[3.0, 3.0], [-1.0, 0.0], [0.0, 5.0]], dtype=np.float32)
    scores = clip_score(image, text, w=2.5)
    assert np.allclose(scores, [2.5 / np.sqrt(2), 0.0, 0.0], atol=1e-6)
    torch_scores = clip_score(torch.from_numpy(image), torch.from_numpy(text), w=2.5)
    assert np.allclose(torch_scores.numpy(), scores, atol=1e-6)


def test_reference_term_is_max_cosine_and_not_clipped():
    cand = np.array([1.0, 0.0], dtype=np.float32)
    refs = np.array([[-1.0, 0.2], [-1.0, -0.5]], dtype=np.float32)
    expected = max(cosine(cand[None], refs[:1])[0], cosine(cand[None], refs[1:])[0])
    value = reference_term(cand, refs)
    assert value < 0 and np.isclose(value, expected, atol=1e-6)
    batch = reference_term(np.stack([cand, -cand]), [refs, refs[:1]])
    assert np.allclose(batch, [expected, cosine(-cand[None], refs[:1])[0]], atol=1e-6)


def test_ref_score_harmonic_mean_and_zero_rule():
    a = np.array([0.8, 0.0, 0.0, 0.5], dtype=np.float32)
    b = np.array([0.6, 0.7, 0.0, -0.2], dtype=np.float32)
    out = ref_score(a, b)
    assert np.allclose(out, [2 * 0.8 * 0.6 / 1.4, 0.0, 0.0, 2 * 0.5 * -0.2 / 0.3], atol=1e-6)
    assert np.isfinite(out).all()
    assert np.allclose(ref_score(torch.from_numpy(a), torch.from_numpy(b)).numpy(), out, atol=1e-6)


def test_registry_names_and_default_w():
    assert set(METRICS) == {"clip-s", "ref-clip-s", "pac-s", "ref-pac-s", "pac-s++", "ref-pac-s++"}
    assert metric_spec("PAC-S++").name == "pac-s++" and metric_spec("Ref-PAC-S").reference_based
    assert default_w("clip-s") == 2.5 and default_w("pac-s") == 2.0 and default_w("ref-pac-s") == 2.0
    b32 = {"vision_cfg": {"width": 768, "patch_size": 32}}
    l14 = {"vision_cfg": {"width": 1024, "patch_size": 14}}
    assert default_w("pac-s++", b32) == 2.5 and default_w("ref-pac-s++", l14) == 3.0
    with pytest.raises(InputError, match="bleu9.*known: clip-s"):
        metric_spec("bleu9")
