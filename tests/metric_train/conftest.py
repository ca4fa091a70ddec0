"""Tiny randomly initialised BLIP and Stable Diffusion built in code (tokenizers and vocabularies too)."""
from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import torch

WORDS = ["a", "dog", "cat", "man", "woman", "on", "the", "grass", "runs", "red", "ball", "in", "water", "with"]


def save_tiny_blip(folder: Path) -> Path:
    """Build a tiny random BLIP captioner with a WordPiece vocabulary written here; save_pretrained into folder."""
    from transformers import BertTokenizer, BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]"] + WORDS + list(string.ascii_lowercase)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(str(folder / "vocab.txt"), bos_token="[DEC]")
    image_processor = BlipImageProcessor(size={"height": 32, "width": 32})
    processor = BlipProcessor(image_processor=image_processor, tokenizer=tokenizer)
    config = BlipConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 16},
        text_config={"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 64, "encoder_hidden_size": 32,
                     "bos_token_id": vocab.index("[DEC]"), "pad_token_id": 0, "sep_token_id": vocab.index("[SEP]"),
                     "eos_token_id": vocab.index("[SEP]")},
        projection_dim=32)
    torch.manual_seed(0)
    model = BlipForConditionalGeneration(config)
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    return folder


def _clip_bpe_files(folder: Path) -> tuple[Path, Path]:
    chars = list(string.ascii_lowercase + string.digits + ".,'-!?")
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, "!": 2}
    for char in chars:
        for token in (char, char + "</w>"):
            vocab.setdefault(token, len(vocab))
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    return folder / "vocab.json", folder / "merges.txt"


def save_tiny_stable_diffusion(folder: Path) -> Path:
    """Build a tiny random Stable Diffusion pipeline (UNet, VAE, CLIP text encoder, BPE tokenizer) into folder."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    work = folder.parent / (folder.name + "_tokenizer_src")
    work.mkdir(parents=True, exist_ok=True)
    vocab_file, merges_file = _clip_bpe_files(work)
    tokenizer = CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=32)
    torch.manual_seed(0)
    unet = UNet2DConditionModel(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                attention_head_dim=8, norm_num_groups=32)
    vae = AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
                        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"], norm_num_groups=32)
    text_encoder = CLIPTextModel(CLIPTextConfig(bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=32,
                                                intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
                                                vocab_size=len(tokenizer), max_position_embeddings=32))
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    pipeline = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                       scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                       requires_safety_checker=False)
    pipeline.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def tiny_blip_dir(tmp_path_factory) -> Path:
    """A tiny random BLIP saved with save_pretrained (a 'local copy' of a captioning model)."""
    return save_tiny_blip(tmp_path_factory.mktemp("models") / "blip")


@pytest.fixture(scope="session")
def tiny_sd_dir(tmp_path_factory) -> Path:
    """A tiny random Stable Diffusion pipeline saved with save_pretrained."""
    return save_tiny_stable_diffusion(tmp_path_factory.mktemp("models") / "sd")
