"""Backbone families behind `load_backbone`: open_clip SigLIP / SigLIP2 and transformers CLIP / SigLIP / Siglip2.

Every expected value comes from the libraries themselves (open_clip's own tokenizer, transform and forward;
transformers' own processor and `get_*_features`) or from sentencepiece directly, never from pacs.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import open_clip
import pytest
import torch
from backbone_fixtures import LOGIT_BIAS, LOGIT_SCALE, tiny_open_clip_siglip
from PIL import Image

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.models.factory import load_backbone
from pacs.metric.models.transformers_backbone import unpack_naflex
from pacs.metric.scoring.scorer import Scorer

OPEN_CLIP = ("open_clip-siglip", "open_clip-siglip2")
TRANSFORMERS = ("transformers-clip", "transformers-siglip", "transformers-siglip2")
ALL = OPEN_CLIP + TRANSFORMERS
KINDS = {"open_clip-siglip": "open_clip-siglip", "open_clip-siglip2": "open_clip-siglip",
         "transformers-clip": "transformers-clip", "transformers-siglip": "transformers-siglip",
         "transformers-siglip2": "transformers-siglip2"}
SHORT = "A dog."
LONG = ("A man in a red shirt and a woman in a blue dress walk their two black dogs along the beach while "
        "children play with a ball near the water and a boat sails past the rocks under a cloudy sky.")
TEXTS = [SHORT, "Two men.", LONG]


@pytest.fixture(scope="module")
def photo(shared_data: Path) -> Image.Image:
    """A real Flickr8k photo."""
    with Image.open(shared_data / "flickr8k" / "images" / "1000268201_693b08cb0e.jpg") as handle:
        return handle.convert("RGB")


def _hf(folder: str):
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(folder, local_files_only=True)


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    assert torch.allclose(actual, expected, atol=1e-5, rtol=0), (actual - expected).abs().max()


@pytest.mark.parametrize("name", ALL)
def test_each_family_loads_offline_with_a_stable_fingerprint(name, tiny_family_folder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tiny_family_folder(name)
    first, second = load_backbone(checkpoint=folder), load_backbone(checkpoint=folder)
    assert first.family_kind == KINDS[name]
    assert first.fingerprint == second.fingerprint
    assert first.family is None and first.family_source == "not established"  # nothing says CLIP / PAC-S
    if name in OPEN_CLIP:  # the same folder through open_clip's own spelling
        assert load_backbone(backbone=f"local-dir:{folder}").fingerprint == first.fingerprint


def test_fingerprint_tells_weights_apart(tmp_path):
    one = load_backbone(checkpoint=tiny_open_clip_siglip(tmp_path / "a", seed=0))
    two = load_backbone(checkpoint=tiny_open_clip_siglip(tmp_path / "b", seed=1))
    assert one.fingerprint != two.fingerprint


@pytest.mark.parametrize("name", ALL)
def test_scale_bias_and_context_are_the_models(name, tiny_family_folder):
    backbone = load_backbone(checkpoint=tiny_family_folder(name))
    if name == "transformers-clip":
        assert backbone.logit_bias is None
        assert backbone.logit_scale == pytest.approx(math.exp(2.6592), rel=1e-6)  # CLIPConfig's initial value
        assert backbone.context_length == 24
    else:
        assert backbone.logit_scale == pytest.approx(LOGIT_SCALE, rel=1e-6)
        assert backbone.logit_bias == pytest.approx(LOGIT_BIAS)
        assert backbone.context_length == 16
    assert backbone.supports_trimmed_text is False  # no family but open_clip CLIP may cut padding


def test_open_clip_clip_keeps_its_declarations(tiny_backbone):
    assert tiny_backbone.family_kind == "open_clip-clip"
    assert tiny_backbone.logit_bias is None
    assert tiny_backbone.logit_scale == pytest.approx(1 / 0.07, rel=1e-5)
    assert tiny_backbone.supports_trimmed_text and tiny_backbone.traits.pruned_image


def _reference_lengths(name: str, folder: str, texts: list[str]) -> list[int]:
    """Untruncated id counts (special tokens included) computed without pacs: sentencepiece, or the BPE."""
    if name == "transformers-clip":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
        return [len(tokenizer.tokenize(text)) + 2 for text in texts]  # + SOT + EOT
    import sentencepiece

    spiece = Path(folder) / "spiece.model"  # the open_clip folders hold it; the transformers ones lie beside it
    if name in TRANSFORMERS:
        spiece = Path(folder).parent / name.replace("transformers-", "").replace("-", "") / "spiece.model"
        spiece = spiece.parent.with_name(spiece.parent.name + "_spiece") / "spiece.model"
    processor = sentencepiece.SentencePieceProcessor(model_file=str(spiece))
    if name in OPEN_CLIP:
        clean = open_clip.tokenizer.get_clean_fn("canonicalize")
        texts = [clean(text) for text in texts]
    return [len(processor.encode(text)) + 1 for text in texts]  # + EOS


@pytest.mark.parametrize("name", ALL)
def test_tokenizer_reports_truncation(name, tiny_family_folder):
    folder = tiny_family_folder(name)
    backbone = load_backbone(checkpoint=folder)
    batch = backbone.tokenize_batch(TEXTS)
    expected = [n > backbone.context_length for n in _reference_lengths(name, folder, TEXTS)]
    assert expected == [False, False, True]
    assert batch.truncated == expected and batch.n_truncated == 1
    assert all(len(ids) == backbone.context_length for ids in batch.ids)  # padded to the full context
    assert batch.ids[0][-1] == backbone.traits.pad_id  # right-padded with the pad id
    assert batch.ids[2][-1] == backbone.tokenize.tokenizer.eos_token_id  # truncated: the end token kept last
    if name in OPEN_CLIP:  # the ids are open_clip's own
        assert torch.equal(torch.tensor(batch.ids), open_clip.get_tokenizer(f"local-dir:{folder}")(TEXTS))


@pytest.mark.parametrize("name", OPEN_CLIP)
def test_open_clip_preprocessing_is_the_folders(name, tiny_family_folder, photo):
    folder = tiny_family_folder(name)
    backbone = load_backbone(checkpoint=folder)
    _, _, transform = open_clip.create_model_and_transforms(f"local-dir:{folder}")
    assert torch.equal(backbone.preprocess(photo), transform(photo))
    assert backbone.preprocess.config() == {"size": 32, "mean": [0.5] * 3, "std": [0.5] * 3,
                                            "interpolation": "bicubic", "resize_mode": "squash"}


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformers_preprocessing_is_the_image_processors(name, tiny_family_folder, photo):
    folder = tiny_family_folder(name)
    backbone = load_backbone(checkpoint=folder)
    _, processor = _hf(folder)
    expected = processor.image_processor(images=[photo], return_tensors="pt")
    pixels = backbone.preprocess(photo)
    if name == "transformers-siglip2":
        unpacked = unpack_naflex(pixels[None])
        for key in ("pixel_values", "pixel_attention_mask", "spatial_shapes"):
            assert torch.equal(unpacked[key], expected[key].to(unpacked[key].dtype)), key
    else:
        assert torch.equal(pixels, expected["pixel_values"][0])
        assert backbone.preprocess.config()["image_mean"] == list(processor.image_processor.image_mean)


@pytest.mark.parametrize("name", OPEN_CLIP)
def test_open_clip_embeddings_equal_the_models_forward(name, tiny_family_folder, photo):
    folder = tiny_family_folder(name)
    backbone = load_backbone(checkpoint=folder)
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{folder}")
    model.eval()
    with torch.no_grad():
        text = model.encode_text(open_clip.get_tokenizer(f"local-dir:{folder}")(TEXTS))
        image = model.encode_image(transform(photo)[None])
    with torch.no_grad():
        _close(backbone.encode_text(torch.tensor(backbone.tokenize_batch(TEXTS).ids)), text)
        _close(backbone.encode_image(backbone.preprocess(photo)[None]), image)
    scorer = Scorer(backbone, progress=False)
    _close(scorer.embed_texts(TEXTS, prompt=False), torch.nn.functional.normalize(text, dim=-1))
    _close(scorer.embed_images([photo]), torch.nn.functional.normalize(image, dim=-1))


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformers_embeddings_equal_the_models_forward(name, tiny_family_folder, photo):
    folder = tiny_family_folder(name)
    backbone = load_backbone(checkpoint=folder)
    model, processor = _hf(folder)
    context = model.config.text_config.max_position_embeddings
    tokens = processor.tokenizer(TEXTS, padding="max_length", max_length=context, truncation=True,
                                 return_tensors="pt")
    with torch.no_grad():
        text = model.get_text_features(input_ids=tokens.input_ids).pooler_output
        image = model.get_image_features(**processor.image_processor(images=[photo], return_tensors="pt")).pooler_output
        if name == "transformers-clip":  # causal, pooled at the EOS: the attention mask changes nothing
            masked = model.get_text_features(**tokens).pooler_output
            _close(text, masked)
        _close(backbone.encode_text(torch.tensor(backbone.tokenize_batch(TEXTS).ids)), text)
        _close(backbone.encode_image(backbone.preprocess(photo)[None]), image)
    scorer = Scorer(backbone, progress=False)
    _close(scorer.embed_texts(TEXTS, prompt=False), torch.nn.functional.normalize(text, dim=-1))
    _close(scorer.embed_images([photo]), torch.nn.functional.normalize(image, dim=-1))


def test_siglip_text_is_padded_to_the_full_context_with_the_pad_id(tiny_family_folder):
    backbone = load_backbone(checkpoint=tiny_family_folder("transformers-siglip"))
    ids = backbone.tokenize_batch([SHORT]).ids[0]
    real = ids[: ids.index(backbone.traits.pad_id) + 1]  # the pad id is the EOS id (1) for SigLIP
    full = backbone.encode_text(torch.tensor([ids]))
    assert torch.allclose(backbone.encode_text(torch.tensor([real])), full, atol=1e-6)  # re-padded with pad id
    zero_padded = torch.tensor([real + [0] * (len(ids) - len(real))])
    assert not torch.allclose(backbone.model.encode_text(zero_padded), full, atol=1e-3)  # pad id matters


def _hook_output(module: torch.nn.Module, run) -> torch.Tensor:
    captured = []
    handle = module.register_forward_hook(lambda _m, _i, output: captured.append(output))
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    output = captured[-1]
    return output.last_hidden_state if hasattr(output, "last_hidden_state") else output


@pytest.mark.parametrize("name", ALL)
def test_grid_features_are_the_last_block_tokens_before_the_final_norm(name, tiny_family_folder, photo):
    from pacs.metric.models.grid import grid_feature_dim, visual_grid_features

    backbone = load_backbone(checkpoint=tiny_family_folder(name))
    pixels = backbone.preprocess(photo)[None]
    grid = visual_grid_features(backbone, pixels)
    model = backbone.model
    if name in OPEN_CLIP:
        expected = _hook_output(model.visual.transformer, lambda: model.encode_image(pixels))
    else:
        expected = _hook_output(model.hf.vision_model.encoder, lambda: model.encode_image(pixels))
    _close(grid, expected)
    assert grid.shape[-1] == grid_feature_dim(backbone) == 32


def test_open_clip_name_with_a_local_weights_file_and_tokenizer(tiny_open_clip_siglip, monkeypatch):
    config = json.loads((Path(tiny_open_clip_siglip) / "open_clip_config.json").read_text())["model_cfg"]
    monkeypatch.setitem(open_clip.factory._MODEL_CONFIGS, "tiny-siglip-test", config)
    weights = str(Path(tiny_open_clip_siglip) / "open_clip_model.safetensors")
    by_name = load_backbone(backbone=f"tiny-siglip-test/{weights}")
    separate = load_backbone(backbone="tiny-siglip-test", checkpoint=weights)
    local = load_backbone(backbone=f"local-dir:{tiny_open_clip_siglip}")
    assert by_name.fingerprint == separate.fingerprint == local.fingerprint
    assert by_name.family_kind == "open_clip-siglip"


def test_open_clip_name_without_local_tokenizer_is_one_clear_error(tiny_open_clip_siglip, tmp_path, monkeypatch):
    config = json.loads((Path(tiny_open_clip_siglip) / "open_clip_config.json").read_text())["model_cfg"]
    monkeypatch.setitem(open_clip.factory._MODEL_CONFIGS, "tiny-siglip-test", config)
    weights = tmp_path / "weights.safetensors"
    weights.write_bytes((Path(tiny_open_clip_siglip) / "open_clip_model.safetensors").read_bytes())
    with pytest.raises(MissingResourceError, match=f"no tokenizer_config.json next to {weights}"):
        load_backbone(backbone=f"tiny-siglip-test/{weights}")


def test_local_dir_without_normalisation_is_refused(tiny_open_clip_siglip, tmp_path):
    folder = tmp_path / "copy"
    folder.mkdir()
    for path in Path(tiny_open_clip_siglip).iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    data = json.loads((folder / "open_clip_config.json").read_text())
    del data["preprocess_cfg"]
    (folder / "open_clip_config.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="preprocess_cfg lacks mean, std"):
        load_backbone(checkpoint=str(folder))


def test_unknown_folder_is_one_clear_error(tmp_path):
    with pytest.raises(InputError, match=rf"{tmp_path}.*holds no known backbone.*config.json with model_type"):
        load_backbone(checkpoint=str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(InputError, match=r"model_type 'bert' is not supported \(supported: clip, siglip, siglip2\)"):
        load_backbone(checkpoint=str(tmp_path))


def test_grid_features_of_a_timm_tower_stop_before_its_final_norm():
    """The released SigLIP towers are timm ViTs with a MAP head (open_clip's TimmModel holds one as `trunk`)."""
    from timm.models.vision_transformer import VisionTransformer

    from pacs.metric.models.grid import grid_feature_dim, visual_grid_features

    torch.manual_seed(0)
    trunk = VisionTransformer(img_size=32, patch_size=16, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0,
                              class_token=False, global_pool="map", num_classes=0).eval()
    model = torch.nn.Module()
    model.visual = torch.nn.Module()
    model.visual.trunk = trunk
    pixels = torch.randn(2, 3, 32, 32)
    expected = _hook_output(trunk.blocks, lambda: trunk.forward_features(pixels))
    grid = visual_grid_features(model, pixels)
    _close(grid, expected)
    assert grid.shape == (2, 4, 32) and grid_feature_dim(model) == 32
    with torch.no_grad():
        assert not torch.allclose(grid, trunk.forward_features(pixels), atol=1e-3)  # forward_features is normed


def test_open_clip_clip_local_dir_keeps_the_clip_fast_paths(tmp_path, photo):
    from safetensors.torch import save_file

    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config

    built = build_backbone_from_config(tiny_clip_config(), seed=3)
    save_file({k: v.contiguous() for k, v in built.model.state_dict().items()},
              str(tmp_path / "open_clip_model.safetensors"))
    preprocess = {"size": 64, "mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bicubic", "resize_mode": "shortest"}
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": tiny_clip_config(),
                                                                "preprocess_cfg": preprocess}))
    backbone = load_backbone(backbone=f"local-dir:{tmp_path}")
    assert backbone.family_kind == "open_clip-clip" and backbone.supports_trimmed_text
    batch = backbone.tokenize_batch(TEXTS)
    assert batch.truncated == [False, False, False]  # 77 BPE tokens hold the long text
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{tmp_path}")
    model.eval()
    with torch.no_grad():
        expected = model.encode_text(open_clip.get_tokenizer(f"local-dir:{tmp_path}")(TEXTS))
        image = model.encode_image(transform(photo)[None])
        width = max(len(ids) for ids in batch.ids)  # the fast path at the batch's longest length
        tokens = torch.tensor([ids + [0] * (width - len(ids)) for ids in batch.ids])
        _close(backbone.encode_text(tokens), expected)
        _close(backbone.encode_image(backbone.preprocess(photo)[None]), image)
