"""Backbones: tiny configs, save/load, official checkpoint import rules, bad checkpoints, offline pretrained tags."""
from __future__ import annotations

import json

import pytest
import torch

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.models.backbones import build_backbone_from_config, save_backbone, tiny_clip_config
from pacs.metric.models.factory import load_backbone
from pacs.metric.models.official import infer_openai_config, merge_lora, read_torch_checkpoint, split_lora


def test_tiny_config_builds_seeded_random_models():
    first = build_backbone_from_config(tiny_clip_config(), seed=1)
    again = build_backbone_from_config(tiny_clip_config(), seed=1)
    other = build_backbone_from_config(tiny_clip_config(), seed=2)
    assert first.fingerprint == again.fingerprint != other.fingerprint
    assert not first.model.training and all(p.dtype == torch.float32 for p in first.model.parameters())
    custom = tiny_clip_config(embed_dim=16, text_cfg={"width": 64})
    assert custom["text_cfg"]["heads"] == 2 and custom["text_cfg"]["width"] == 64
    model = build_backbone_from_config(custom).model
    assert model.encode_text(torch.zeros(1, 77, dtype=torch.long)).shape == (1, 16)


def test_save_and_load_round_trip_is_bit_identical(tiny_backbone, tmp_path):
    path = save_backbone(tiny_backbone, tmp_path / "tiny.safetensors")
    loaded = load_backbone(checkpoint=str(path))
    assert loaded.fingerprint == tiny_backbone.fingerprint
    assert loaded.family == tiny_backbone.family and loaded.name == tiny_backbone.name
    for key, tensor in tiny_backbone.model.state_dict().items():
        assert torch.equal(tensor, loaded.model.state_dict()[key]), key


def test_official_architecture_inference_matches_arch_json(pacscore_fixtures):
    for fixture, name in (("A", "PAC++_tiny_A.pth"), ("C", "clip_tiny_C.pth")):
        arch = json.loads((pacscore_fixtures / fixture / "arch.json").read_text())
        state = read_torch_checkpoint(pacscore_fixtures / fixture / name)
        base, lora = split_lora(state)
        inferred = infer_openai_config(base, name)
        assert len(lora) == (16 + 1 if fixture == "A" else 0)  # 2 towers x 2 blocks x 4 + conv1
        vision, text = inferred["vision_cfg"], inferred["text_cfg"]
        assert (vision["width"], vision["layers"], vision["patch_size"], vision["image_size"]) == (
            arch["vision_width"], arch["vision_layers"], arch["vision_patch_size"], arch["image_resolution"])
        assert (text["width"], text["layers"], inferred["embed_dim"]) == (
            arch["transformer_width"], arch["transformer_layers"], arch["embed_dim"])
        # heads = width // 64: right for C, wrong for A's text tower (which is why --arch exists).
        assert (text["heads"] == arch["transformer_heads"]) == arch["heads_follow_official_width_div_64_rule"]["text"]


def test_lora_merge_follows_official_rules():
    torch.manual_seed(0)
    dim, patch, rank = 8, 2, 4
    base = {"visual.conv1.weight": torch.randn(dim, 3, patch, patch),
            "visual.transformer.resblocks.0.attn.in_proj_weight": torch.randn(3 * dim, dim),
            "visual.transformer.resblocks.0.attn.out_proj.weight": torch.randn(dim, dim),
            "visual.transformer.resblocks.0.mlp.c_fc.weight": torch.randn(4 * dim, dim)}
    lora = {"visual.conv1.weight": {"A": torch.randn(rank * patch, 3 * patch), "B": torch.randn(dim * patch, rank * patch)},
            "visual.transformer.resblocks.0.attn.in_proj_weight": {"A": torch.randn(rank, dim), "B": torch.randn(3 * dim, rank)},
            "visual.transformer.resblocks.0.attn.out_proj.weight": {"A": torch.randn(rank, dim), "B": torch.randn(dim, rank)},
            "visual.transformer.resblocks.0.mlp.c_fc.weight": {"A": torch.randn(rank, dim), "B": torch.randn(4 * dim, rank)}}
    merged = merge_lora(base, lora, mode="official")
    conv = lora["visual.conv1.weight"]
    delta = conv["B"] @ conv["A"]  # [dim*P, 3*P]; output channel o gets rows o*P .. o*P+P-1
    expected_conv = base["visual.conv1.weight"] + 0.25 * delta.reshape(dim, 3, patch, patch)
    assert torch.allclose(merged["visual.conv1.weight"], expected_conv)
    assert torch.allclose(merged["visual.conv1.weight"][1, 0, 0],
                          base["visual.conv1.weight"][1, 0, 0] + 0.25 * delta[patch, :patch])
    qkv = "visual.transformer.resblocks.0.attn.in_proj_weight"
    assert torch.allclose(merged[qkv][dim:2 * dim],  # the k rows get B[D:2D] A
                          base[qkv][dim:2 * dim] + 0.25 * lora[qkv]["B"][dim:2 * dim] @ lora[qkv]["A"])
    mlp = "visual.transformer.resblocks.0.mlp.c_fc.weight"
    assert torch.equal(merged[mlp], base[mlp])  # ignored by the official inference path
    assert not torch.equal(merge_lora(base, lora, mode="all")[mlp], base[mlp])
    assert torch.equal(merge_lora(base, lora, mode="none")[qkv], base[qkv])


def test_unknown_layout_names_the_keys(tmp_path):
    path = tmp_path / "resnet.pth"
    torch.save({"state_dict": {"visual.layer1.0.conv1.weight": torch.zeros(2, 2), "logit_scale": torch.zeros(())}},
               path)
    with pytest.raises(InputError, match=r"no known layout.*visual\.conv1\.weight.*visual\.layer1\.0\.conv1\.weight"):
        load_backbone(checkpoint=str(path))


def test_unexpected_and_orphan_keys_are_named(tiny_backbone, tmp_path):
    state = {key: value.clone() for key, value in tiny_backbone.model.state_dict().items()}
    state["visual.extra_head.weight"] = torch.zeros(3)
    path = tmp_path / "extra.pth"
    torch.save({"state_dict": state}, path)
    arch = tmp_path / "arch.json"
    arch.write_text(json.dumps(tiny_backbone.open_clip_config))
    with pytest.raises(InputError, match=r"unexpected keys \['visual\.extra_head\.weight'\]"):
        load_backbone(checkpoint=str(path), arch=str(arch))
    del state["visual.extra_head.weight"]
    state["visual.proj_lora_A"] = torch.zeros(2, 2)
    torch.save({"state_dict": state}, path)
    with pytest.raises(InputError, match="visual.proj.*no lora_B partner"):
        load_backbone(checkpoint=str(path), arch=str(arch))


def test_open_clip_layout_file_with_arch_round_trips(tiny_backbone, tmp_path):
    path = tmp_path / "plain.pt"
    torch.save({"module." + k: v for k, v in tiny_backbone.model.state_dict().items()}, path)
    arch = tmp_path / "arch.json"
    arch.write_text(json.dumps(tiny_backbone.open_clip_config))
    loaded = load_backbone(checkpoint=str(path), arch=str(arch))
    assert loaded.fingerprint == tiny_backbone.fingerprint
    # no LoRA, no official name, no --family: the family is not guessed
    assert loaded.family is None and loaded.family_source == "not established"
    declared = load_backbone(checkpoint=str(path), arch=str(arch), family="pac-s")
    assert declared.family == "pac-s" and declared.family_source == "user --family"


def test_corrupt_checkpoint_is_an_input_error(tmp_path):
    path = tmp_path / "broken.pth"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(InputError, match="broken.pth"):
        load_backbone(checkpoint=str(path))


def test_uncached_pretrained_tag_is_a_clear_missing_resource(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(MissingResourceError) as error:
        load_backbone("ViT-B-32/openai")
    message = str(error.value)
    assert "ViT-B-32/openai" in message and "backbone=ViT-B-32/PATH_TO_FILE" in message  # what Python users pass
    from pacs.metric.commands.flags import cli_message

    assert "--backbone ViT-B-32/PATH_TO_FILE (or --backbone ViT-B-32 and --checkpoint PATH_TO_FILE)" in \
        cli_message(error.value)  # what `pacs` prints
    assert "missing file open_clip_pytorch_model.bin" in message


def test_unknown_open_clip_name_and_tag():
    with pytest.raises(InputError, match="unknown open_clip model 'ViT-Q-99'"):
        load_backbone("ViT-Q-99")
    with pytest.raises(InputError, match="nor an existing file"):
        load_backbone("ViT-B-32/not-a-tag")


def test_open_clip_name_with_local_weights_file(tiny_backbone, tmp_path):
    import open_clip

    config_file = tmp_path / "pacs-tiny-registered.json"
    config_file.write_text(json.dumps(tiny_backbone.open_clip_config))
    open_clip.add_model_config(config_file)
    weights = tmp_path / "weights.bin"
    torch.save(tiny_backbone.model.state_dict(), weights)
    loaded = load_backbone(f"pacs-tiny-registered/{weights}")
    # a local weights file may hold any family: not established (a pretrained tag or no weights is CLIP)
    assert loaded.family is None and loaded.source["pretrained"] == str(weights)
    for key, tensor in tiny_backbone.model.state_dict().items():
        assert torch.equal(tensor, loaded.model.state_dict()[key]), key
    random = load_backbone("pacs-tiny-registered")  # no tag: random weights, nothing downloaded
    assert random.fingerprint != loaded.fingerprint and random.family == "clip"


def test_tiny_random_backbone_name():
    first, second = load_backbone("tiny-random"), load_backbone("tiny-random/7")
    assert first.open_clip_config == tiny_clip_config() and first.fingerprint != second.fingerprint


def test_checkpoint_with_backbone_tag_takes_the_tags_preprocessing(tiny_backbone, tmp_path, monkeypatch):
    """`--checkpoint FILE --backbone NAME/TAG`: the tag's mean/std and activation, the file's weights, no download."""
    import open_clip

    config_file = tmp_path / "pacs-tiny-tagged.json"
    config_file.write_text(json.dumps(tiny_backbone.open_clip_config))
    open_clip.add_model_config(config_file)
    real = open_clip.get_pretrained_cfg
    tag_cfg = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "hf_hub": "nowhere/", "quick_gelu": False}
    monkeypatch.setattr(open_clip, "get_pretrained_cfg",
                        lambda name, tag: tag_cfg if (name, tag) == ("pacs-tiny-tagged", "laion") else real(name, tag))
    weights = tmp_path / "openClip_tiny.pth"
    torch.save({"state_dict": tiny_backbone.model.state_dict()}, weights)
    loaded = load_backbone(backbone="pacs-tiny-tagged/laion", checkpoint=str(weights))
    assert loaded.preprocess.mean == (0.5, 0.5, 0.5) and loaded.preprocess.std == (0.5, 0.5, 0.5)
    assert loaded.open_clip_config["quick_gelu"] is False and loaded.family is None
    assert "laion" in loaded.source["config_from"]


def test_arch_presets_set_activation_and_normalisation_a_name_prefix_does_not(tmp_path):
    config = tiny_clip_config(vision_cfg={"head_width": 64}, text_cfg={"width": 64, "heads": 1})
    source = build_backbone_from_config(config, seed=4)
    for name, preset, gelu_quick, mean in (("openClip_ViT-tiny.pth", "openclip-laion", False, (0.5, 0.5, 0.5)),
                                           ("clip_ViT-tiny.pth", "openai", True,
                                            (0.48145466, 0.4578275, 0.40821073))):
        path = tmp_path / name
        torch.save({"state_dict": source.model.state_dict()}, path)
        with pytest.raises(InputError, match="not established.*arch=openai.*arch=openclip-laion"):
            load_backbone(checkpoint=str(path))  # the old `openClip_` prefix rule is gone
        loaded = load_backbone(checkpoint=str(path), arch=preset)
        assert loaded.open_clip_config["quick_gelu"] is gelu_quick and loaded.preprocess.mean == mean
        assert loaded.preprocess.std == ((0.5,) * 3 if preset == "openclip-laion" else
                                         (0.26862954, 0.26130258, 0.27577711))
        assert loaded.open_clip_config["text_cfg"]["heads"] == 1 and loaded.family is None
    narrow = tmp_path / "narrow.pth"
    torch.save({"state_dict": build_backbone_from_config(tiny_clip_config()).model.state_dict()}, narrow)
    with pytest.raises(InputError, match="width 32 < 64.*arch=FILE"):
        load_backbone(checkpoint=str(narrow))
