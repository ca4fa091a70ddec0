"""Contrastive rewards: equal to Scorer.score, images encoded once per run, frozen model, mixes."""
from __future__ import annotations

import pytest
import torch

from pacs.metric.common.errors import InputError
from pacs.metric.scoring.registry import default_w
from pacs.metric.scoring.scorer import Scorer
from pacs.rewards import build_reward

CONTRASTIVE = ["clip-s", "ref-clip-s", "pac-s", "ref-pac-s", "pac-s++", "ref-pac-s++"]


def _count_image_encodes(backbone, monkeypatch) -> list[int]:
    """Patch the backbone's image encoder (every scoring path goes through it) to record images per call."""
    calls: list[int] = []
    original = backbone.encode_image

    def counting(pixels, *args, **kwargs):
        calls.append(pixels.shape[0])
        return original(pixels, *args, **kwargs)

    monkeypatch.setattr(backbone, "encode_image", counting)
    return calls


@pytest.mark.parametrize("name", CONTRASTIVE)
def test_reward_equals_scorer_score(name, tiny_backbone, images, batch):
    ids, captions, refs = batch
    reward = build_reward(name, backbone=tiny_backbone, image_loader=images.__getitem__)
    values = reward(ids, captions, refs)
    assert values.shape == (2, 3) and values.dtype == torch.float32 and not values.requires_grad
    reference_based = name.startswith("ref-")
    expected = Scorer(tiny_backbone, progress=False).score(
        [images[i] for i in ids for _ in range(3)], [c for row in captions for c in row],
        references=[r for r in refs for _ in range(3)] if reference_based else None, w=default_w(name, tiny_backbone))
    assert torch.allclose(values.flatten(), torch.from_numpy(expected.scores), atol=1e-5)
    assert values.abs().sum() > 0


def test_each_image_is_encoded_once_across_calls_and_mix_components(tiny_backbone, images, batch, monkeypatch):
    calls = _count_image_encodes(tiny_backbone, monkeypatch)
    ids, captions, refs = batch
    reward = build_reward("clip-s:1,ref-clip-s:0.5,pac-s++:2", backbone=tiny_backbone,
                          image_loader=images.__getitem__)
    first = reward(ids, captions, refs)
    assert sum(calls) == 2  # red, green: once for the three components together
    second = reward(ids[::-1], captions[::-1], refs[::-1])
    assert torch.allclose(second, first.flip(0))
    reward(["noise", "red", "noise"], [["a", "b"], ["c", "d"], ["e", "f"]], [["x"], ["y"], ["z"]])
    assert sum(calls) == 3  # only the new image was encoded
    assert len({id(component.fn.images) for _, _, component in reward.components}) == 1  # one shared cache
    assert reward.components[0][2].fn.images.n_encoded == 3


def test_empty_batch(tiny_backbone, images):
    reward = build_reward("clip-s:1,ref-clip-s:1", backbone=tiny_backbone, image_loader=images.__getitem__)
    assert reward([], [], []).shape == (0, 0)


def test_mix_is_the_weighted_sum_of_its_terms(tiny_backbone, images, batch):
    ids, captions, refs = batch
    context = {"backbone": tiny_backbone, "image_loader": images.__getitem__}
    mix = build_reward("clip-s:1,ref-pac-s:-0.5,pac-s++:2", **context)(ids, captions, refs)
    terms = {name: build_reward(name, **context)(ids, captions, refs) for name in ("clip-s", "ref-pac-s", "pac-s++")}
    assert torch.allclose(mix, terms["clip-s"] - 0.5 * terms["ref-pac-s"] + 2 * terms["pac-s++"], atol=1e-6)


def test_default_and_explicit_w(tiny_backbone, images, batch):
    ids, captions, refs = batch
    context = {"backbone": tiny_backbone, "image_loader": images.__getitem__}
    clip = build_reward("clip-s", **context)(ids, captions, refs)  # w = 2.5
    pac = build_reward("pac-s", **context)(ids, captions, refs)  # w = 2.0, same model
    assert torch.allclose(clip / 2.5, pac / 2.0, atol=1e-6)
    assert torch.allclose(build_reward("clip-s", w=1.0, **context)(ids, captions, refs), clip / 2.5, atol=1e-6)


def test_image_sources_paths_and_precomputed_embeddings(tiny_backbone, shared_data, monkeypatch):
    folder = shared_data / "flickr8k" / "images"
    paths = {"1000268201_693b08cb0e": folder / "1000268201_693b08cb0e.jpg",
             "1001773457_577c3a7d70": folder / "1001773457_577c3a7d70.jpg"}
    ids = list(paths)
    captions, refs = [["a girl on stairs"], ["two dogs"]], [["a child"], ["dogs"]]
    from_paths = build_reward("clip-s", backbone=tiny_backbone, image_paths=paths)(ids, captions, refs)
    embeddings = Scorer(tiny_backbone, progress=False).embed_images(list(paths.values()))
    calls = _count_image_encodes(tiny_backbone, monkeypatch)
    precomputed = build_reward("clip-s", backbone=tiny_backbone,
                               image_embeddings=dict(zip(ids, embeddings)))(ids, captions, refs)
    assert calls == [] and torch.allclose(from_paths, precomputed, atol=1e-6)
    with pytest.raises(InputError, match="no image for image id 'unknown'"):
        build_reward("clip-s", backbone=tiny_backbone, image_paths=paths)(["unknown"], [["x"]], [["y"]])


def test_reward_model_is_frozen_and_needs_a_model(tiny_backbone, images, batch):
    tiny_backbone.model.train()
    tiny_backbone.model.requires_grad_(True)
    reward = build_reward("ref-pac-s++", backbone=tiny_backbone, image_loader=images.__getitem__)
    assert not tiny_backbone.model.training
    assert not any(p.requires_grad for p in tiny_backbone.model.parameters())
    with pytest.raises(InputError, match="ref-pac-s\\+\\+ reward: image 'green' has no references"):
        reward(["red", "green"], [["a"], ["b"]], [["a red box"], []])
    with pytest.raises(InputError, match="the pac-s\\+\\+ reward needs a model"):
        build_reward("pac-s++", image_loader=images.__getitem__)


def test_given_scorer_and_per_reward_scorers(tiny_backbone, images, batch):
    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config

    ids, captions, refs = batch
    other = Scorer(build_backbone_from_config(tiny_clip_config(), seed=1, family="pac-s++"), progress=False)
    shared = Scorer(tiny_backbone, progress=False)
    reward = build_reward("clip-s:1,pac-s++:1", scorer=shared, scorers={"pac-s++": other},
                          image_loader=images.__getitem__)
    assert reward.components[0][2].fn.scorer is shared and reward.components[1][2].fn.scorer is other
    expected = (build_reward("clip-s", scorer=shared, image_loader=images.__getitem__)(ids, captions, refs)
                + build_reward("pac-s++", scorer=other, image_loader=images.__getitem__)(ids, captions, refs))
    assert torch.allclose(reward(ids, captions, refs), expected, atol=1e-6)
