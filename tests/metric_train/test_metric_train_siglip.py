"""PAC-S++ on a tiny SigLIP: the sigmoid loss, scale and bias handling, learning on real Flickr8k pairs, LoRA on
both towers (attention pooling included), export and reload (issue 23, item 3)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import re
from collections import Counter
from pathlib import Path

import open_clip
import pytest
import torch

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.common.seeding import seed_everything
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.models.factory import load_backbone
from pacs.metric.training.config import LossOptions
from pacs.metric.training.data import TensorPositivesDataset
from pacs.metric.training.encoding import DualEncoder, prepare_trainable, resolve_loss_kind
from pacs.metric.training.export import export_model
from pacs.metric.training.trainer import MetricTrainConfig, train_metric

from .test_metric_train_learning import TRAIN_CAPTIONS, _flickr8k_items, positives_datasets

N_IMAGES = 240
N_VAL_IMAGES = 80
CONTEXT = 16
VOCAB = 512


class WordTokenizer:
    """A SigLIP-style tokenizer for the tiny model: word ids + EOS, padded with 0 to the full context (no mask)."""

    def __init__(self, texts: list[str], size: int = VOCAB, context_length: int = CONTEXT) -> None:
        counts = Counter(word for text in texts for word in re.findall(r"[a-z]+", text.lower()))
        self.vocab = {word: index + 3 for index, (word, _) in enumerate(counts.most_common(size - 3))}  # 0 pad, 1 eos, 2 unk
        self.context_length = context_length

    def __call__(self, texts: list[str] | str) -> torch.Tensor:
        """LongTensor[N, context_length]."""
        texts = [texts] if isinstance(texts, str) else texts
        out = torch.zeros(len(texts), self.context_length, dtype=torch.long)
        for row, text in enumerate(texts):
            ids = [self.vocab.get(word, 2) for word in re.findall(r"[a-z]+", text.lower())]
            ids = ids[: self.context_length - 1] + [1]
            out[row, : len(ids)] = torch.tensor(ids)
        return out


def tiny_siglip_config() -> dict:
    """An open_clip SigLIP-layout config: custom text tower without causal mask pooling the last token, vision
    pooled by attention (one query), SigLIP's initial scale 10 and bias -10."""
    return {
        "embed_dim": 32, "init_logit_scale": math.log(10.0), "init_logit_bias": -10.0, "custom_text": True,
        "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 32, "layers": 2, "head_width": 16, "mlp_ratio": 2.0,
                       "attentional_pool": True, "attn_pooler_queries": 1, "attn_pooler_heads": 2},
        "text_cfg": {"context_length": CONTEXT, "vocab_size": VOCAB, "width": 32, "heads": 2, "layers": 2,
                     "mlp_ratio": 2.0, "no_causal_mask": True, "pool_type": "last", "proj_bias": True},
    }


def _tiny_siglip(tokenizer, seed: int = 0):
    backbone = build_backbone_from_config(tiny_siglip_config(), seed=seed, quick_gelu=False, name="tiny-siglip")
    return dataclasses.replace(backbone, tokenize=tokenizer)




# ---- the loss kind, the temperature and what is trained ------------------------------------------------------------

def test_auto_loss_kind_is_sigmoid_for_a_model_with_a_logit_bias():
    siglip = _tiny_siglip(WordTokenizer(["a dog"]))
    clip = build_backbone_from_config(tiny_clip_config(), seed=0)
    assert resolve_loss_kind("auto", siglip.model) == "sigmoid"
    assert resolve_loss_kind("auto", clip.model) == "infonce"
    assert resolve_loss_kind("infonce", siglip.model) == "infonce"
    with pytest.raises(InputError, match="logit_bias"):
        resolve_loss_kind("sigmoid", clip.model)
    with pytest.raises(InputError, match="loss.kind"):
        MetricTrainConfig(loss=LossOptions(kind="softmax")).validate()


def test_dual_encoder_gives_the_models_own_scale_and_bias():
    backbone = _tiny_siglip(WordTokenizer(["a dog"]))
    with torch.no_grad():
        backbone.model.logit_scale.fill_(math.log(117.3))  # above CLIP's cap of 100: SigLIP's scale is not capped
        backbone.model.logit_bias.fill_(-12.5)
        pixels, tokens = torch.randn(2, 3, 32, 32), backbone.tokenize(["a dog", "a red ball in the water"])
        image_emb, text_emb, temperature = DualEncoder(backbone.model)(pixels, tokens)
        _, _, clip_temperature = DualEncoder(backbone.model, "infonce")(pixels, tokens)
        reference_image, reference_text, scale = backbone.model(pixels, tokens)[:3]  # open_clip's own forward
    assert temperature.tolist() == pytest.approx([117.3, -12.5], rel=1e-6)
    assert float(scale) == pytest.approx(117.3, rel=1e-6)
    assert float(clip_temperature) == pytest.approx(100.0)  # InfoNCE keeps CLIP's cap
    assert torch.allclose(image_emb, reference_image, atol=1e-6) and torch.allclose(text_emb, reference_text, atol=1e-6)


@pytest.mark.parametrize(("mode", "train_logit_scale", "kind", "trained"), [
    ("lora", False, "auto", False), ("lora", True, "auto", True), ("projection", True, "sigmoid", True),
    ("lora", True, "infonce", False), ("full", False, "auto", True)])
def test_scale_and_bias_are_trained_together(mode, train_logit_scale, kind, trained):
    backbone = prepare_trainable(_tiny_siglip(WordTokenizer(["a dog"])),
                                 MetricTrainConfig(mode=mode, train_logit_scale=train_logit_scale,
                                                   loss=LossOptions(kind=kind)))
    grads = {name.split(".")[-1]: param.requires_grad for name, param in backbone.model.named_parameters()
             if name.split(".")[-1] in ("logit_scale", "logit_bias")}
    assert grads["logit_bias"] is trained  # the bias is used (and trained) by the sigmoid loss only
    assert grads["logit_scale"] is (train_logit_scale or mode == "full")
    if mode == "projection":  # the custom text tower's projection is SigLIP's final text projection
        names = {name for name, param in backbone.model.named_parameters() if param.requires_grad}
        assert {"visual.proj", "text.text_projection.weight", "text.text_projection.bias"} <= names


# ---- learning on Flickr8k, LoRA, export ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def flickr_positives(shared_data):
    torch.set_num_threads(1)
    seed_everything(0)
    random.seed(0)
    items = _flickr8k_items(shared_data / "flickr8k", N_IMAGES)
    tokenizer = WordTokenizer([caption for _, _, captions in items for caption in captions[:TRAIN_CAPTIONS]])
    backbone = _tiny_siglip(tokenizer)
    return (backbone, *positives_datasets(backbone, items))


def _print_history(title, history):
    print(f"\n{title}:")
    for record in history:
        print(f"  step {int(record['step']):3d}: val loss {record['val_total']:.4f}  "
              f"image->text R@1 {record['val_r1']:.3f}")


@pytest.fixture(scope="module")
def pretrained_siglip(flickr_positives, tmp_path_factory):
    """Stage 1: the tiny SigLIP trained from scratch (`full`) with the sigmoid loss (chosen by loss.kind=auto)."""
    backbone, train, val = flickr_positives
    config = MetricTrainConfig(mode="full", random_init=True, batch_size=32, lr=1e-3, max_steps=200, eval_every=50,
                               log_every=0, seed=0, output_dir=str(tmp_path_factory.mktemp("siglip") / "full"))
    return train_metric(config, train, val, backbone=backbone)


def test_sigmoid_training_lowers_the_validation_loss_and_raises_recall(pretrained_siglip, flickr_positives):
    log = json.loads((pretrained_siglip / "train_log.json").read_text())
    history = log["history"]
    _print_history(f"Flickr8k tiny SigLIP, sigmoid loss ({len(flickr_positives[1])} training pairs)", history)
    assert log["provenance"]["loss_kind"] == "sigmoid"
    first, best = history[0], min(history, key=lambda r: r["val_total"])
    assert best["step"] == log["best_step"] > 0
    assert best["val_total"] < first["val_total"] / 2  # the validation loss falls ...
    assert best["val_r1"] > first["val_r1"] + 0.02  # ... and held-out image->text R@1 rises above its start
    trained = load_backbone(checkpoint=str(pretrained_siglip / "checkpoint.safetensors"))
    initial = {"logit_scale": math.log(10.0), "logit_bias": -10.0}  # tiny_siglip_config's
    for name, value in initial.items():  # full mode trains the scale and the bias
        assert float(getattr(trained.model, name)) != pytest.approx(value, abs=1e-4), name


def test_pac_spp_lora_on_both_siglip_towers_exports_and_reloads(pretrained_siglip, flickr_positives, tmp_path):
    tokenizer, (_, train, val) = flickr_positives[0].tokenize, flickr_positives
    base = load_backbone(checkpoint=str(pretrained_siglip / "checkpoint.safetensors"))
    base = dataclasses.replace(base, tokenize=tokenizer)  # the tiny model's own tokenizer
    pixels = torch.stack([val[i][0] for i in range(8)])
    tokens = tokenizer([val[i][1] for i in range(8)])
    with torch.no_grad():  # before training (the trainer merges LoRA into this very model at the end)
        before = base.model.encode_image(pixels), base.model.encode_text(tokens)
        temperature = base.model.logit_scale.clone(), base.model.logit_bias.clone()
    config = MetricTrainConfig(mode="lora", random_init=True, batch_size=32, lr=1e-3, max_steps=60, eval_every=20,
                               log_every=0, seed=0, output_dir=str(tmp_path / "lora"))
    run = train_metric(config, train, val, backbone=base)
    log = json.loads((run / "train_log.json").read_text())
    _print_history("PAC-S++ LoRA on it", log["history"])
    assert log["provenance"]["loss_kind"] == "sigmoid" and log["best_step"] > 0
    assert log["best_val_total"] < log["history"][0]["val_total"]

    from safetensors.torch import load_file

    adapter = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    trained_b = {key for key, value in adapter.items() if "lora_B" in key and value.abs().max() > 0}
    for part in ("visual.conv1", "visual.transformer.resblocks.0.attn", "visual.transformer.resblocks.1.mlp.c_fc",
                 "visual.attn_pool.attn", "text.transformer.resblocks.0.attn", "text.transformer.resblocks.1.mlp.c_proj"):
        assert any(part in key for key in trained_b), part  # LoRA trained on both towers and the attention pooling

    merged = load_backbone(checkpoint=str(run / "checkpoint.safetensors"))
    # frozen in lora mode (train_logit_scale: false)
    assert torch.equal(merged.model.logit_scale, temperature[0]) and torch.equal(merged.model.logit_bias, temperature[1])
    result = export_model(run / "checkpoint.safetensors", tmp_path / "export")
    assert result.family == "pac-s++"
    exported_cfg = json.loads((tmp_path / "export" / "open_clip_config.json").read_text())["model_cfg"]
    assert exported_cfg["custom_text"] and exported_cfg["init_logit_bias"] == -10.0
    assert exported_cfg["text_cfg"]["no_causal_mask"] and exported_cfg["vision_cfg"]["attentional_pool"]
    reloaded = load_backbone(checkpoint=str(tmp_path / "export"))
    from_adapter = load_backbone(checkpoint=str(run / "adapter"))
    via_open_clip = open_clip.create_model("local-dir:" + str(tmp_path / "export"), precision="fp32").eval()
    assert reloaded.family == "pac-s++"

    with torch.no_grad():
        want = merged.model.encode_image(pixels), merged.model.encode_text(tokens)
        for model in (reloaded.model, from_adapter.model, via_open_clip):
            got = model.encode_image(pixels), model.encode_text(tokens)
            assert (got[0] - want[0]).abs().max() <= 1e-5 and (got[1] - want[1]).abs().max() <= 1e-5
        for name in ("logit_scale", "logit_bias"):
            assert torch.equal(getattr(via_open_clip, name), getattr(merged.model, name))
    assert not torch.allclose(before[0], want[0], atol=1e-4)  # LoRA changed both towers
    assert not torch.allclose(before[1], want[1], atol=1e-4)

    with pytest.raises(InputError, match="init_logit_bias"):  # the official PAC-S layout has no SigLIP
        export_model(run / "checkpoint.safetensors", tmp_path / "official.pth", fmt="official")


def test_export_of_a_siglip_with_a_hugging_face_tokenizer_is_a_complete_local_dir(tmp_path):
    """The shared tiny open_clip SigLIP (local-dir, sentencepiece tokenizer): LoRA steps, export, reload offline."""
    import shutil

    from backbone_fixtures import tiny_open_clip_siglip

    base = load_backbone(backbone="local-dir:" + tiny_open_clip_siglip(tmp_path / "fixture"))
    assert base.family_kind == "open_clip-siglip" and base.logit_bias is not None
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(16, 3, 32, 32, generator=generator)
    words = ["dog", "cat", "red", "ball", "grass", "water", "man", "runs"]
    captions = [" ".join(words[i] for i in torch.randint(0, 8, (3,), generator=generator).tolist()) for _ in range(16)]
    data = TensorPositivesDataset(images, captions, images + 0.1 * torch.randn(images.shape, generator=generator),
                                  [caption.upper() for caption in captions])
    texts = ["a dog runs across the green grass", "two children play on the beach near the water"]
    tokens = base.tokenize(texts)
    config = MetricTrainConfig(mode="lora", random_init=True, batch_size=8, lr=1e-2, max_steps=2, eval_every=0,
                               log_every=0, seed=0, output_dir=str(tmp_path / "run"))
    run = train_metric(config, data, data, backbone=base)
    export_model(run / "checkpoint.safetensors", tmp_path / "export")
    merged = load_backbone(checkpoint=str(run / "checkpoint.safetensors"))
    with torch.no_grad():
        want = merged.model.encode_image(images[:4]), merged.model.encode_text(tokens)
    shutil.rmtree(tmp_path / "fixture")  # the base (and its tokenizer) is gone: the export needs nothing else
    assert (tmp_path / "export" / "tokenizer_config.json").is_file()
    assert open_clip.get_tokenizer("local-dir:" + str(tmp_path / "export"))(texts).tolist() == tokens.tolist()
    exported = [load_backbone(checkpoint=str(tmp_path / "export")),  # pacs' reader: tokenizer next to the weights
                load_backbone(backbone="local-dir:" + str(tmp_path / "export"))]
    for reloaded in exported:
        assert reloaded.tokenize(texts).tolist() == tokens.tolist()  # padded to the full context, same ids
        with torch.no_grad():
            got = reloaded.model.encode_image(images[:4]), reloaded.model.encode_text(tokens)
        assert (got[0] - want[0]).abs().max() <= 1e-5 and (got[1] - want[1]).abs().max() <= 1e-5
        assert reloaded.logit_bias == pytest.approx(merged.logit_bias, abs=0)
    # the run's checkpoint has no tokenizer beside it and its recorded base folder is gone: one error saying where
    with pytest.raises(MissingResourceError, match=rf"put the tokenizer files .* in {re.escape(str(run.resolve()))}"):
        load_backbone(checkpoint=str(run / "checkpoint.safetensors"))
    for path in (tmp_path / "export").iterdir():  # ... and following it works (the tokenizer files export wrote)
        if "token" in path.name or path.suffix == ".model":
            shutil.copy(path, run / path.name)
    assert load_backbone(checkpoint=str(run / "checkpoint.safetensors")).tokenize(texts).tolist() == tokens.tolist()


def test_lora_on_a_timm_vision_trunk_as_open_clips_siglip_configs_have(tmp_path):
    """open_clip's SigLIP / SigLIP2 configs build the vision tower with timm (MAP head): the default targets become
    the timm blocks' linear layers, the MAP head and the patch embedding; training, merge and export work."""
    config = {**tiny_siglip_config(), "embed_dim": 96,
              "vision_cfg": {"image_size": 160, "timm_model_name": "test_vit3", "timm_model_pretrained": False,
                             "timm_pool": "map", "timm_proj": "none"}}
    backbone = build_backbone_from_config(config, seed=0, quick_gelu=False, name="tiny-timm-siglip")
    backbone = dataclasses.replace(backbone, tokenize=WordTokenizer(["a dog runs on the grass", "a red ball"]))
    projection = prepare_trainable(build_backbone_from_config(config, seed=0, quick_gelu=False),
                                   MetricTrainConfig(mode="projection"))  # PAC-S: no visual.proj in timm towers
    trained = {name for name, param in projection.model.named_parameters() if param.requires_grad}
    assert {"visual.trunk.attn_pool.q.weight", "visual.trunk.attn_pool.mlp.fc2.weight", "text.text_projection.weight"} \
        <= trained and all(name.startswith(("visual.trunk.attn_pool.", "text.text_projection.")) for name in trained)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(8, 3, 160, 160, generator=generator)
    captions = ["a dog", "a red ball", "the grass", "a dog runs", "on the grass", "a ball", "red", "runs"]
    data = TensorPositivesDataset(images, captions, images.flip(-1), captions[::-1])
    tokens = backbone.tokenize(captions[:3])
    run = train_metric(MetricTrainConfig(mode="lora", random_init=True, batch_size=8, lr=1e-2, max_steps=2,
                                         eval_every=0, log_every=0, seed=0, output_dir=str(tmp_path / "run")),
                       data, data, backbone=backbone)
    from safetensors.torch import load_file

    adapted = {key.split(".lora_")[0] for key in load_file(str(run / "adapter" / "adapter_model.safetensors"))}
    for part in ("visual.trunk.patch_embed.proj", "visual.trunk.blocks.8.attn.qkv", "visual.trunk.blocks.0.attn.proj",
                 "visual.trunk.blocks.3.mlp.fc1", "visual.trunk.attn_pool.q", "visual.trunk.attn_pool.kv",
                 "visual.trunk.attn_pool.proj", "visual.trunk.attn_pool.mlp.fc2", "text.transformer.resblocks.1.attn",
                 "text.transformer.resblocks.0.mlp.c_fc"):
        assert any(key.endswith(part) for key in adapted), part
    assert not any(key.endswith("trunk.blocks.0.attn") for key in adapted)  # timm's Attention module is not wrapped
    merged = load_backbone(checkpoint=str(run / "checkpoint.safetensors"))
    export_model(run / "checkpoint.safetensors", tmp_path / "export")
    with torch.no_grad():
        for reloaded in (load_backbone(checkpoint=str(tmp_path / "export")), load_backbone(checkpoint=str(run / "adapter"))):
            assert (reloaded.model.encode_image(images[:2]) - merged.model.encode_image(images[:2])).abs().max() <= 1e-5
            assert (reloaded.model.encode_text(tokens) - merged.model.encode_text(tokens)).abs().max() <= 1e-5


@pytest.mark.parametrize("train_logit_scale", [False, True])
def test_adapter_of_a_file_base_keeps_a_trained_scale_and_bias(tmp_path, train_logit_scale):
    """peft saves LoRA matrices only: a trained temperature is recorded in pacs_base.json, the base stays outside."""
    from pacs.metric.models.backbones import save_backbone

    tokenizer = WordTokenizer(["a dog runs", "a red ball"])
    save_backbone(_tiny_siglip(tokenizer), tmp_path / "base.safetensors")
    base = dataclasses.replace(load_backbone(checkpoint=str(tmp_path / "base.safetensors")), tokenize=tokenizer)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(8, 3, 32, 32, generator=generator)
    captions = ["a dog", "red ball", "dog runs", "a ball", "runs", "red", "a red dog", "ball"]
    data = TensorPositivesDataset(images, captions, images.flip(-1), captions[::-1])
    config = MetricTrainConfig(mode="lora", random_init=True, batch_size=8, lr=1e-1, max_steps=3, eval_every=0,
                               log_every=0, seed=0, train_logit_scale=train_logit_scale, output_dir=str(tmp_path / "run"))
    run = train_metric(config, data, data, backbone=base)
    merged = load_backbone(checkpoint=str(run / "checkpoint.safetensors"))
    adapter = load_backbone(checkpoint=str(run / "adapter"))
    record = json.loads((run / "adapter" / "pacs_base.json").read_text())
    assert record["base"]["checkpoint"] == str((tmp_path / "base.safetensors").resolve())  # the base is not embedded
    assert sorted(path.name for path in (run / "adapter").glob("*.safetensors")) == ["adapter_model.safetensors"]
    trained = (merged.logit_scale, merged.logit_bias)
    assert (trained != pytest.approx((10.0, -10.0), abs=1e-4)) is train_logit_scale
    assert record["logit_scale"] == [float(merged.model.logit_scale)]  # the raw parameter (log of the scale)
    assert record["logit_bias"] == [float(merged.model.logit_bias)]
    for name in ("logit_scale", "logit_bias"):  # exactly the trained values, put on the untouched base file
        assert torch.equal(getattr(adapter.model, name), getattr(merged.model, name)), name
    untouched = load_backbone(checkpoint=str(tmp_path / "base.safetensors"))
    assert (untouched.logit_scale, untouched.logit_bias) == pytest.approx((10.0, -10.0), rel=1e-6)


def test_adapter_on_a_local_dir_base_records_the_folder_and_the_trained_temperature(tmp_path):
    """A local-dir base is recorded by path + weights sha256 (not copied): the adapter stays small, reloads equal to
    the merged model with the trained scale and bias, and refuses a changed or missing base folder."""
    import shutil

    from backbone_fixtures import tiny_open_clip_siglip
    from safetensors.torch import load_file, save_file

    folder = Path(tiny_open_clip_siglip(tmp_path / "base"))
    base = load_backbone(backbone=f"local-dir:{folder}")
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(8, 3, 32, 32, generator=generator)
    captions = ["a dog runs", "a red ball", "the grass", "a man", "two children", "the water", "a bench", "a log"]
    data = TensorPositivesDataset(images, captions, images.flip(-1), captions[::-1])
    config = MetricTrainConfig(mode="lora", random_init=True, batch_size=8, lr=1e-1, max_steps=3, eval_every=0,
                               log_every=0, seed=0, train_logit_scale=True, output_dir=str(tmp_path / "run"))
    run = train_metric(config, data, data, backbone=base)
    adapter_dir = run / "adapter"
    record = json.loads((adapter_dir / "pacs_base.json").read_text())
    weights = folder / "open_clip_model.safetensors"
    assert record["base"] == {"backbone": f"local-dir:{folder.resolve()}",
                              "sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}
    assert sorted(path.name for path in adapter_dir.glob("*.safetensors")) == ["adapter_model.safetensors"]
    assert all("lora_" in key for key in load_file(str(adapter_dir / "adapter_model.safetensors")))
    adapter_bytes = sum(path.stat().st_size for path in adapter_dir.iterdir())
    assert adapter_bytes < weights.stat().st_size  # no copy of the base: LoRA matrices and a few JSON files

    merged = load_backbone(checkpoint=str(run / "checkpoint.safetensors"))
    reloaded = load_backbone(checkpoint=str(adapter_dir))
    assert (merged.logit_scale, merged.logit_bias) != pytest.approx((10.0, -10.0), abs=1e-4)  # trained
    for name in ("logit_scale", "logit_bias"):
        assert torch.equal(getattr(reloaded.model, name), getattr(merged.model, name)), name
    tokens = base.tokenize(captions)
    with torch.no_grad():
        for got, want in ((reloaded.model.encode_image(images), merged.model.encode_image(images)),
                          (reloaded.model.encode_text(tokens), merged.model.encode_text(tokens))):
            assert (got - want).abs().max() <= 1e-5

    state = load_file(str(weights))  # other weights under the recorded path: refused by the weights' sha256
    state["logit_scale"] = state["logit_scale"] + 1.0
    save_file(state, str(weights))
    with pytest.raises(InputError, match="sha256"):
        load_backbone(checkpoint=str(adapter_dir))
    shutil.rmtree(folder)
    with pytest.raises(MissingResourceError, match="base folder .* not found"):
        load_backbone(checkpoint=str(adapter_dir))


def test_a_transformers_backbone_is_refused_before_training(tmp_path):
    from backbone_fixtures import tiny_transformers_siglip

    backbone = load_backbone(checkpoint=tiny_transformers_siglip(tmp_path))
    data = TensorPositivesDataset(torch.zeros(2, 3, 32, 32), ["a", "b"], torch.zeros(2, 3, 32, 32), ["a", "b"])
    config = MetricTrainConfig(mode="lora", random_init=True, batch_size=2, max_steps=1, eval_every=0, log_every=0,
                               output_dir=str(tmp_path / "run"))
    with pytest.raises(InputError, match=r"transformers_siglip \(transformers-siglip\): metric training needs an "
                                         r"open_clip model"):
        train_metric(config, data, data, backbone=backbone)
    assert not (tmp_path / "run").exists()
