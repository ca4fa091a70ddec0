"""The exact inference shortcuts (trimmed text, shared prompt prefix, pooled-row-only last block) vs open_clip."""
from __future__ import annotations

import torch

from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.models.pruned_forward import (
    common_prefix_length,
    prefix_states,
    supports_pruned_image,
    supports_pruned_text,
)

TEXTS = ["A photo depicts a dog", "A photo depicts a man riding a horse on a beach", "A photo depicts ",
         "A photo depicts <|endoftext|> after the end", "A photo depicts " + " ".join(["tree"] * 90)]


def _check(backbone):
    model = backbone.model
    assert supports_pruned_text(model) and supports_pruned_image(model)
    ids = backbone.tokenize.encode(TEXTS).ids
    prefix = common_prefix_length(ids)
    assert prefix == 4  # SOT + "a photo depicts"
    with torch.no_grad():
        full = model.encode_text(backbone.tokenize.pad(ids, 77))  # open_clip's own forward at 77 tokens
        kv = prefix_states(model, ids[0][:prefix])
        for subset in ([0, 1, 2, 3], [0, 2], [4, 1]):
            chosen = [ids[i] for i in subset]
            tokens = backbone.tokenize.pad(chosen, max(map(len, chosen)))
            trimmed = backbone.encode_text(tokens)
            cached = backbone.encode_text(tokens, prefix, kv)
            assert torch.allclose(trimmed, full[subset], atol=1e-5, rtol=0)
            assert torch.allclose(cached, full[subset], atol=1e-5, rtol=0)
        pixels = torch.randn(3, 3, *([model.visual.image_size[0]] * 2))
        assert torch.allclose(backbone.encode_image(pixels), model.encode_image(pixels), atol=1e-5, rtol=0)


def test_shortcuts_match_open_clip_forward(tiny_backbone):
    _check(tiny_backbone)


def test_shortcuts_with_gelu_layer_scale_and_other_shapes():
    config = tiny_clip_config(quick_gelu=False, vision_cfg={"ls_init_value": 0.5, "layers": 3, "head_width": 16},
                              text_cfg={"ls_init_value": 0.3, "heads": 4, "layers": 3})
    _check(build_backbone_from_config(config, seed=3, quick_gelu=False))


def test_common_prefix_stops_before_the_first_eot():
    assert common_prefix_length([[1, 2, 9, 0], [1, 2, 3, 9]]) == 2
    assert common_prefix_length([[1, 9, 9], [1, 9, 3, 9]]) == 1  # the pooled EOT is never part of the prefix
    assert common_prefix_length([[5, 9], [6, 9]]) == 0
