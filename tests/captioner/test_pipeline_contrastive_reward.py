"""The pipeline's `contrastive_reward` section: typed `score` / `long_captions`, passed to `build_reward`, in the
SCST stage fingerprint only when off its defaults.

The sigmoid reward's expected values come from open_clip's own tokenizer, transform and forward on the tiny
SigLIP-style folder of `tests/backbone_fixtures.py`, never from pacs.
"""
from __future__ import annotations

import math
import typing
from pathlib import Path

import pytest
import torch
from PIL import Image

from pacs.captioner.orchestration.pipeline_config import ContrastiveRewardConfig, PipelineConfig
from pacs.captioner.orchestration.pipeline_rewards import build_pipeline_reward, guard_reward_settings
from pacs.metric.common.config import from_dict, load_config
from pacs.metric.common.errors import InputError
from pacs.metric.scoring.conventions import LONG_CAPTION_MODES, SCORE_KINDS

torch.set_num_threads(1)
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "configs" / "coco_vitb32_pac-spp.yaml"
PROMPT = "A photo depicts "


def test_the_keys_are_typed_with_the_conventions_names_and_default_to_the_papers():
    hints = typing.get_type_hints(ContrastiveRewardConfig)
    assert typing.get_args(hints["score"]) == SCORE_KINDS
    assert typing.get_args(hints["long_captions"]) == LONG_CAPTION_MODES
    config = load_config(PipelineConfig, RECIPE, [])
    assert (config.contrastive_reward.score, config.contrastive_reward.long_captions) == ("cosine", "truncate")
    changed = load_config(PipelineConfig, RECIPE, ["contrastive_reward.score=sigmoid",
                                                   "contrastive_reward.long_captions=chunk"])
    assert (changed.contrastive_reward.score, changed.contrastive_reward.long_captions) == ("sigmoid", "chunk")


@pytest.mark.parametrize("key, value", [("score", "cos"), ("score", "Sigmoid"), ("long_captions", "cut")])
def test_a_bad_value_is_refused_at_load_naming_file_key_and_value(key, value):
    with pytest.raises(InputError) as error:
        load_config(PipelineConfig, RECIPE, [f"contrastive_reward.{key}={value}"])
    message = str(error.value)
    assert RECIPE.name in message and f"contrastive_reward.{key}={value!r}" in message and "\n" not in message


def _config(**section: str) -> PipelineConfig:
    return from_dict(PipelineConfig, {"contrastive_reward": section}, "test")


def test_fingerprint_holds_only_changed_keys_and_only_for_specs_with_a_contrastive_term():
    assert guard_reward_settings(_config(), "pac-s++") == {}  # run folders made before the section stay done
    assert guard_reward_settings(_config(score="cosine", long_captions="truncate"), "clip-s") == {}
    sigmoid = _config(score="sigmoid")
    assert guard_reward_settings(sigmoid, "pac-s++") == {"contrastive_reward": {"score": "sigmoid"}}
    assert guard_reward_settings(sigmoid, "cider:1,ref-clip-s:0.5") == {"contrastive_reward": {"score": "sigmoid"}}
    assert guard_reward_settings(sigmoid, "cider") == {}  # a CIDEr-D stage is not re-run
    both = _config(score="sigmoid", long_captions="chunk")
    settings = guard_reward_settings(both, "cider:1,rep-penalty:0.5,clip-s:1")
    assert settings["contrastive_reward"] == {"score": "sigmoid", "long_captions": "chunk"}
    assert set(settings) == {"contrastive_reward", "reward_guards"}


@pytest.fixture(scope="module")
def siglip(tmp_path_factory) -> str:
    """A tiny open_clip SigLIP-style `local-dir` folder (logit scale 10, bias −10)."""
    from backbone_fixtures import tiny_open_clip_siglip

    return tiny_open_clip_siglip(tmp_path_factory.mktemp("siglip"))


@pytest.fixture(scope="module")
def photos(shared_data) -> dict[str, Path]:
    folder = shared_data / "flickr8k" / "images"
    return {f"img{i}": path for i, path in enumerate(sorted(folder.iterdir())[:2])}


def _siglip_config(siglip: str, **section: str) -> PipelineConfig:
    return from_dict(PipelineConfig, {"rewards": ["clip-s"], "contrastive_reward": section, "reward_models": {
        "clip": {"backbone": "", "checkpoint": siglip, "device": "cpu"}, "device": "cpu"}}, "test")


def test_sigmoid_reward_is_the_models_calibrated_probability(siglip, photos):
    import open_clip

    captions = [["a dog runs on the grass", "two people"], ["a child climbs the stairs", "a red car"]]
    reward = build_pipeline_reward("clip-s", _siglip_config(siglip, score="sigmoid"), {}, photos)
    values = reward(list(photos), captions, [["a reference"]] * 2)
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{siglip}")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{siglip}")
    model.eval()
    with torch.no_grad():
        images = []
        for path in photos.values():
            with Image.open(path) as handle:
                images.append(model.encode_image(transform(handle.convert("RGB"))[None])[0])
        image = torch.nn.functional.normalize(torch.stack(images), dim=-1)
        text = torch.nn.functional.normalize(model.encode_text(tokenizer([PROMPT + c for row in captions
                                                                         for c in row])), dim=-1).view(2, 2, -1)
        cosines = (image[:, None, :] * text).sum(-1)
        expected = torch.sigmoid(math.exp(model.logit_scale.item()) * cosines + model.logit_bias.item())
    assert torch.allclose(values, expected, rtol=1e-4, atol=0), (values, expected)
    cosine = build_pipeline_reward("clip-s", _siglip_config(siglip), {}, photos)(list(photos), captions,
                                                                                   [["a reference"]] * 2)
    assert not torch.allclose(cosine, values)  # the default (w·max(cos, 0)) is another scale


def test_long_captions_reaches_every_contrastive_term_of_a_mix(siglip, photos):
    reward = build_pipeline_reward("cider:1,clip-s:0.5,ref-clip-s:0.5",
                                   _siglip_config(siglip, long_captions="chunk"), {"img0": ["a dog"]}, photos)
    terms = {name: term.fn for name, _, term in reward.components if name != "cider"}
    assert {name: (fn.score_kind, fn.long_captions) for name, fn in terms.items()} == {
        "clip-s": ("cosine", "chunk"), "ref-clip-s": ("cosine", "chunk")}
