"""peft LoRA on both towers: trainable set, merge, adapter save/load, identical scores adapter vs merged."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import build_backbone_from_config, save_backbone, tiny_clip_config
from pacs.metric.models.factory import load_adapter_backbone, load_backbone
from pacs.metric.models.lora import attach_lora, merge_lora, save_adapter
from pacs.metric.scoring.scorer import Scorer

torch.set_num_threads(1)


def _tiny(seed=0, **overrides):
    return build_backbone_from_config(tiny_clip_config(**overrides), seed=seed, name=f"tiny-{seed}")


def _perturb_lora(backbone, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in backbone.model.named_parameters():
            if "lora_B" in name:  # B starts at zero (identity adapter); make the adapter do something
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
            elif "lora_A" in name:  # peft draws A from the global generator: fix it, whatever ran before
                param.copy_(torch.randn(param.shape, generator=generator) * param.shape[-1] ** -0.5)


def _inputs():
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)) for _ in range(4)]
    return images, ["a dog on the grass", "two people riding bikes", "a red car", ""]


def test_lora_targets_both_towers_and_freezes_the_base():
    backbone = attach_lora(_tiny())
    trainable = [n for n, p in backbone.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    joined = "\n".join(trainable)
    for part in ("visual.transformer.resblocks.0.attn.lora_A",
                 "visual.transformer.resblocks.0.attn.base_layer.out_proj.lora_A",
                 "visual.transformer.resblocks.1.mlp.c_fc.lora_A", "visual.transformer.resblocks.1.mlp.c_proj.lora_B",
                 "model.transformer.resblocks.0.attn.lora_A", "model.transformer.resblocks.1.mlp.c_fc.lora_A",
                 "visual.conv1.lora_A"):
        assert part in joined, part
    ranks = {p.shape[0] for n, p in backbone.model.named_parameters() if "lora_A" in n}
    assert ranks == {4}
    assert backbone.family == "pac-s++"
    without_patch = attach_lora(_tiny(), patch_embedding=False)
    assert not any("conv1.lora" in n for n, _ in without_patch.model.named_parameters())


def test_fresh_adapter_is_identity_and_merge_matches_unmerged():
    base = _tiny()
    pixels, tokens = torch.randn(3, 3, 64, 64), base.tokenize(["a cat", "a dog on a mat", "x"])
    with torch.no_grad():
        reference = base.model.encode_image(pixels).clone(), base.model.encode_text(tokens).clone()
    lora = attach_lora(base)
    with torch.no_grad():
        assert torch.allclose(lora.model.encode_image(pixels), reference[0], atol=1e-6)
        _perturb_lora(lora)
        adapted = lora.model.encode_image(pixels), lora.model.encode_text(tokens)
    assert not torch.allclose(adapted[0], reference[0], atol=1e-3)  # the adapter changes the image tower
    assert not torch.allclose(adapted[1], reference[1], atol=1e-3)  # and the text tower (attention + MLP)
    merged = merge_lora(lora)
    assert not any("lora" in n for n in merged.model.state_dict())
    with torch.no_grad():
        assert torch.allclose(merged.model.encode_image(pixels), adapted[0], atol=1e-5)
        assert torch.allclose(merged.model.encode_text(tokens), adapted[1], atol=1e-5)


def test_adapter_and_merged_checkpoint_score_identically(tmp_path):
    lora = attach_lora(_tiny(seed=8))
    _perturb_lora(lora, seed=2)
    save_adapter(lora, tmp_path / "adapter")
    record = json.loads((tmp_path / "adapter" / "pacs_base.json").read_text())
    assert record["base"]["checkpoint"] == "base.safetensors"  # random base: its weights travel with the adapter
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    save_backbone(merge_lora(lora), tmp_path / "merged.safetensors")

    from_adapter = load_backbone(checkpoint=str(tmp_path / "adapter"))
    from_merged = load_backbone(checkpoint=str(tmp_path / "merged.safetensors"))
    assert from_adapter.family == from_merged.family == "pac-s++"
    images, captions = _inputs()
    a = Scorer(from_adapter, w=2.5).score(images, captions, references=[["a dog"], ["bikes"], ["car"], ["a"]])
    b = Scorer(from_merged, w=2.5).score(images, captions, references=[["a dog"], ["bikes"], ["car"], ["a"]])
    # bit-equal on any machine: the adapter is merged at load by the same peft merge_and_unload, on the same saved
    # tensors, as the merged checkpoint was (same weights), and both score the same inputs in the same batches
    np.testing.assert_array_equal(a.clip_scores, b.clip_scores)
    # scores of a random model are often clipped at 0: compare the embeddings under them as well
    scorers = Scorer(from_adapter), Scorer(from_merged)
    assert torch.equal(scorers[0].embed_images(images), scorers[1].embed_images(images))
    assert torch.equal(scorers[0].embed_texts(captions), scorers[1].embed_texts(captions))
    np.testing.assert_array_equal(a.scores, b.scores)
    unmerged = load_adapter_backbone(tmp_path / "adapter", merge=False)
    c = Scorer(unmerged, w=2.5).score(images, captions)
    np.testing.assert_allclose(c.clip_scores, a.clip_scores, atol=1e-5)
    base = _tiny(seed=8)
    assert not torch.allclose(Scorer(base).embed_images(images), scorers[0].embed_images(images), atol=1e-4)
    assert not torch.allclose(Scorer(base).embed_texts(captions), scorers[0].embed_texts(captions), atol=1e-4)


def test_adapter_on_another_backbone_is_rejected(tmp_path):
    lora = attach_lora(_tiny(seed=1))
    save_adapter(lora, tmp_path / "adapter")
    other_arch = _tiny(seed=1, vision_cfg={"width": 96, "head_width": 32})
    with pytest.raises(InputError, match="different backbone"):
        load_adapter_backbone(tmp_path / "adapter", base_backbone=other_arch)
    other_weights = _tiny(seed=2)
    with pytest.raises(InputError, match="fingerprint"):
        load_adapter_backbone(tmp_path / "adapter", base_backbone=other_weights)
    # a tampered embedded base is caught by its recorded sha256
    save_backbone(_tiny(seed=5), tmp_path / "adapter" / "base.safetensors")
    with pytest.raises(InputError, match="sha256"):
        load_backbone(checkpoint=str(tmp_path / "adapter"))


def test_adapter_folder_without_base_record_is_an_error(tmp_path):
    lora = attach_lora(_tiny())
    save_adapter(lora, tmp_path / "adapter")
    (tmp_path / "adapter" / "pacs_base.json").unlink()
    with pytest.raises(InputError, match="pacs_base.json"):
        load_adapter_backbone(tmp_path / "adapter")


def test_adapter_and_merged_give_identical_rewards(tmp_path):
    from pacs.rewards import build_reward

    lora = attach_lora(_tiny(seed=8))
    _perturb_lora(lora, seed=2)  # a seed whose scores are all above the clip at 0
    save_adapter(lora, tmp_path / "adapter")
    save_backbone(merge_lora(lora), tmp_path / "merged.safetensors")
    images, _ = _inputs()
    paths = {}
    for index, image in enumerate(images):
        paths[str(index)] = tmp_path / f"{index}.png"
        image.save(paths[str(index)])
    captions = [["a dog", "a cat on a mat"], ["two bikes", ""], ["a red car", "car"], ["a", "b c"]]
    references = [["a dog on grass"], ["people riding"], ["a car"], ["letters"]]
    values = []
    for checkpoint in (tmp_path / "adapter", tmp_path / "merged.safetensors"):
        for spec in ("pac-s++", "ref-pac-s++"):
            reward = build_reward(spec, checkpoint=str(checkpoint), image_paths=paths)
            values.append(reward(list(paths), captions, references))
    assert values[0].shape == (4, 2) and (values[0] > 0).any()
    assert torch.equal(values[0], values[2]) and torch.equal(values[1], values[3])  # same weights and batches


# ---- which layers LoRA adapts, per layout (pacs.metric.models.lora owns the choice) ----------------------------------------

def _adapted(backbone) -> set[str]:
    """Names (in the base model) of the modules peft wrapped with LoRA (not the out_proj inside its attention)."""
    from peft.tuners.lora import LoraLayer

    return {name.removeprefix("base_model.model.") for name, module in backbone.model.named_modules()
            if isinstance(module, LoraLayer) and ".base_layer." not in name}


def test_default_targets_on_open_clip_clip_are_the_block_attention_mlp_and_patch_embedding():
    import re

    model = _tiny().model
    # the choice as a plain name pattern (the one pacs used before it picked modules by type)
    expected = {name for name, _ in model.named_modules()
                if re.fullmatch(r"(.*\.)?(attn|mlp\.c_fc|mlp\.c_proj)|visual\.conv1", name)}
    assert len(expected) == 2 * (2 * 3) + 1  # 2 towers x 2 blocks x (attn, c_fc, c_proj) + conv1
    assert _adapted(attach_lora(_tiny())) == expected
    assert _adapted(attach_lora(_tiny(), patch_embedding=False)) == expected - {"visual.conv1"}
    custom = attach_lora(_tiny(), targets=["mlp.c_fc"], patch_embedding=False)  # explicit targets: used as given
    assert _adapted(custom) == {f"{tower}transformer.resblocks.{i}.mlp.c_fc" for tower in ("", "visual.")
                                for i in range(2)}
    with pytest.raises(InputError, match="no module matches"):
        attach_lora(_tiny(), targets=["no_such_layer"], patch_embedding=False)


def test_default_targets_on_a_timm_vision_trunk_are_its_linear_layers():
    """open_clip's SigLIP configs build the vision tower with timm: its blocks' and MAP head's linear layers."""
    config = {"embed_dim": 96, "init_logit_bias": -10.0, "custom_text": True,
              "vision_cfg": {"image_size": 160, "timm_model_name": "test_vit3", "timm_model_pretrained": False,
                             "timm_pool": "map", "timm_proj": "none"},
              "text_cfg": {"context_length": 16, "vocab_size": 64, "width": 32, "heads": 2, "layers": 2,
                           "no_causal_mask": True, "pool_type": "last", "proj_bias": True}}
    backbone = build_backbone_from_config(config, seed=0, quick_gelu=False)
    depth = len(backbone.model.visual.trunk.blocks)
    expected = {f"visual.trunk.blocks.{i}.{layer}" for i in range(depth)
                for layer in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")}
    expected |= {f"visual.trunk.attn_pool.{layer}" for layer in ("q", "kv", "proj", "mlp.fc1", "mlp.fc2")}
    expected |= {f"text.transformer.resblocks.{i}.{layer}" for i in range(2) for layer in ("attn", "mlp.c_fc",
                                                                                          "mlp.c_proj")}
    assert _adapted(attach_lora(backbone)) == expected | {"visual.trunk.patch_embed.proj"}
    assert _adapted(attach_lora(build_backbone_from_config(config, seed=0, quick_gelu=False),
                                patch_embedding=False)) == expected


@pytest.mark.parametrize("embed_dim", [64, 32])
def test_attention_pooling_is_adapted_when_peft_can_wrap_it(embed_dim):
    """open_clip's attention pooler maps the vision width (64) to embed_dim: with other widths peft refuses its
    MultiheadAttention, so it is left out and every other layer is still adapted."""
    import peft

    config = tiny_clip_config(embed_dim=embed_dim, vision_cfg={"attentional_pool": True, "attn_pooler_queries": 1,
                                                               "attn_pooler_heads": 2})
    pooler = build_backbone_from_config(config, seed=0).model.visual.attn_pool.attn
    assert (pooler.embed_dim, pooler.kdim) == (embed_dim, 64)
    lone = peft.LoraConfig(r=2, target_modules=r"visual\.attn_pool\.attn")
    if embed_dim != 64:
        with pytest.raises(ValueError):  # what peft says about it on its own
            peft.get_peft_model(build_backbone_from_config(config, seed=0).model, lone)
    adapted = _adapted(attach_lora(build_backbone_from_config(config, seed=0)))
    blocks = _adapted(attach_lora(_tiny()))  # the same towers without the pooler
    assert adapted == blocks | ({"visual.attn_pool.attn"} if embed_dim == 64 else set())
