"""Scorer: image cache (encode once), batch-size/order invariance, persistent cache, PIL inputs, counts."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from pacs.metric.common.errors import InputError
from pacs.metric.scoring.scorer import Scorer
from pacs.metric.scoring.scores import clip_score, ref_score

CAPTIONS = ["a dog runs on the grass", "two people", "", "a red car parked next to a tall building at night",
            "noise", "a cat", " ".join(["word"] * 100), "A photo of colours"]


def _inputs(image_dir):
    images = sorted(str(p) for p in image_dir.iterdir())
    paths = [images[i % len(images)] for i in range(len(CAPTIONS) * 2)]
    captions = [CAPTIONS[i % len(CAPTIONS)] + ("" if i < len(CAPTIONS) else " again") for i in range(len(paths))]
    references = [[f"reference {i}", "a dog", CAPTIONS[(i + 1) % len(CAPTIONS)]] for i in range(len(paths))]
    return paths, captions, references


def test_each_image_encoded_once_for_many_captions(tiny_backbone, image_dir):
    scorer = Scorer(tiny_backbone, w=2.0, batch_size=4)
    path = str(min(image_dir.iterdir()))
    result = scorer.score([path] * 5, ["a", "b", "c", "d", "e"])
    assert scorer.images_encoded == 1 and len(result.scores) == 5
    scorer.score([path] * 5, ["f", "g", "h", "i", "j"])
    assert scorer.images_encoded == 1  # still cached for the scorer's lifetime
    scorer.clear_caches()  # e.g. after the weights changed
    again = scorer.score([path] * 5, ["a", "b", "c", "d", "e"])
    assert scorer.images_encoded == 2 and np.array_equal(again.scores, result.scores)


def test_scores_match_pure_functions_on_full_length_embeddings(tiny_backbone, image_dir):
    paths, captions, references = _inputs(image_dir)
    result = Scorer(tiny_backbone, w=2.5, batch_size=3).score(paths, captions, references)
    with torch.no_grad():
        pixels = torch.stack([tiny_backbone.preprocess(Image.open(p)) for p in paths])
        image = tiny_backbone.model.encode_image(pixels)
        text = tiny_backbone.model.encode_text(tiny_backbone.tokenize(["A photo depicts " + c for c in captions]))
        expected_clip = clip_score(image, text, 2.5).numpy()
        refs = [torch.nn.functional.normalize(tiny_backbone.model.encode_text(
            tiny_backbone.tokenize(["A photo depicts " + r for r in rs])), dim=-1) for rs in references]
    text_n = torch.nn.functional.normalize(text, dim=-1)
    ref_terms = np.array([float((r @ t).max()) for r, t in zip(refs, text_n)])
    assert np.abs(result.clip_scores - expected_clip).max() <= 1e-5
    assert np.abs(result.ref_terms - ref_terms).max() <= 1e-5
    assert np.abs(result.scores - ref_score(expected_clip, ref_terms)).max() <= 1e-5
    assert result.n_empty == 1 and result.n_truncated == 2 and result.w == 2.5


def test_results_independent_of_batch_size_and_order(tiny_backbone, image_dir):
    paths, captions, references = _inputs(image_dir)
    baseline = Scorer(tiny_backbone, w=2.0, batch_size=64).score(paths, captions, references)
    rng = np.random.default_rng(3)
    for batch_size in (1, 2, 5):
        order = rng.permutation(len(paths))
        result = Scorer(tiny_backbone, w=2.0, batch_size=batch_size).score(
            [paths[i] for i in order], [captions[i] for i in order], [references[i] for i in order])
        assert np.abs(result.scores - baseline.scores[order]).max() <= 1e-5
        assert np.abs(result.clip_scores - baseline.clip_scores[order]).max() <= 1e-5


def test_persistent_cache_reuses_embeddings(tiny_backbone, image_dir, tmp_path):
    paths, captions, _ = _inputs(image_dir)
    first = Scorer(tiny_backbone, batch_size=4, cache_dir=tmp_path)
    expected = first.score(paths, captions)
    assert first.images_encoded == 6 and len(first.disk_cache) == 6
    second = Scorer(tiny_backbone, batch_size=4, cache_dir=tmp_path)
    again = second.score(paths, captions)
    assert second.images_encoded == 0 and second.disk_cache.hits == 6
    assert np.array_equal(again.scores, expected.scores)
    # A different model never sees these entries: the cache is keyed by fingerprint.
    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config

    other = Scorer(build_backbone_from_config(tiny_clip_config(), seed=9), cache_dir=tmp_path)
    other.embed_images(paths[:1])
    assert other.images_encoded == 1


def test_pil_images_and_default_w_by_family(tiny_backbone, image_dir):
    scorer = Scorer(tiny_backbone)
    assert scorer.w == 2.5  # a plain CLIP backbone: CLIP-S
    path = sorted(image_dir.iterdir())[1]
    image = Image.open(path)
    from_pil = scorer.score([image, image], ["a", "b"])
    from_path = Scorer(tiny_backbone).score([str(path)] * 2, ["a", "b"])
    assert scorer.images_encoded == 1
    assert np.abs(from_pil.scores - from_path.scores).max() <= 1e-6


def test_non_string_candidates_and_references_are_named(tiny_backbone, image_dir):
    scorer = Scorer(tiny_backbone)
    path = str(min(image_dir.iterdir()))
    with pytest.raises(InputError, match="candidate #1 is not a string: 3"):
        scorer.score([path, path], ["ok", 3])
    with pytest.raises(InputError, match="candidate #0 has no references"):
        scorer.score([path], ["ok"], [[]])
    with pytest.raises(InputError, match="image file not found: .*missing.jpg"):
        scorer.score([str(image_dir / "missing.jpg")], ["ok"])


def test_corrupt_disk_cache_entry_is_recomputed(tiny_backbone, image_dir, tmp_path):
    path = str(sorted(image_dir.iterdir())[2])
    first = Scorer(tiny_backbone, cache_dir=tmp_path)
    expected = first.embed_images([path])
    entry = next(first.disk_cache.root.glob("*.npy"))
    entry.write_bytes(b"garbage")
    second = Scorer(tiny_backbone, cache_dir=tmp_path)
    assert torch.equal(second.embed_images([path]), expected) and second.images_encoded == 1
    assert np.array_equal(np.load(entry), expected[0].numpy())  # rewritten
