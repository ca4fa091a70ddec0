"""Tiny random transformers captioners built offline (BLIP, GIT) and coloured images, for the SCST / XE tests."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image

WORDS = ["a", "the", "red", "blue", "green", "dog", "cat", "square", "circle", "on", "grass", "picture", "of"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]"]  # ids 0..5: [DEC] is BLIP's decoder start
COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}


def tiny_sizes(hidden: int = 32, init: float = 1.0) -> tuple[dict, dict]:
    """(text, vision) config sizes of a tiny model (`init`: the initializer range)."""
    text = {"hidden_size": hidden, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 37,
            "initializer_range": init}
    return text, text | {"image_size": 32, "patch_size": 8}


def _tokenizer(folder: Path, words: list[str]) -> transformers.BertTokenizer:
    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + words) + "\n")
    return transformers.BertTokenizer(str(vocab), bos_token="[DEC]")


def build_blip(folder: Path, words: list[str] = WORDS, seed: int = 0, init: float = 1.0) -> Path:
    """A tiny random BlipForConditionalGeneration + BlipProcessor, saved with save_pretrained."""
    tokenizer = _tokenizer(folder.with_name(folder.name + "-vocab"), words)
    tiny, vision = tiny_sizes(init=init)
    text = tiny | {"vocab_size": len(SPECIAL) + len(words), "pad_token_id": 0, "bos_token_id": 5,
                   "eos_token_id": 3, "sep_token_id": 3, "max_position_embeddings": 64}
    config = transformers.BlipConfig(text_config=text, vision_config=vision, projection_dim=32, initializer_range=init)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.BlipForConditionalGeneration(config)
    model.save_pretrained(folder)
    transformers.BlipProcessor(transformers.BlipImageProcessor(size={"height": 32, "width": 32}),
                               tokenizer).save_pretrained(folder)
    return folder


def build_git(folder: Path, words: list[str] = WORDS, seed: int = 0, init: float = 1.0) -> Path:
    """A tiny random GitForCausalLM + GitProcessor (CLIPImageProcessor + BertTokenizer)."""
    tokenizer = _tokenizer(folder.with_name(folder.name + "-vocab"), words)
    tiny, vision = tiny_sizes(init=init)
    config = transformers.GitConfig(vision_config=vision, vocab_size=len(SPECIAL) + len(words),
                                    max_position_embeddings=64, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                                    **tiny)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.GitForCausalLM(config)
    model.save_pretrained(folder)
    image_processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    transformers.GitProcessor(image_processor, tokenizer).save_pretrained(folder)
    return folder


def coloured_images(folder: Path, n: int) -> tuple[dict[str, Path], dict[str, list[str]]]:
    """`n` PNG images (a colour, with noise) and their references ({id: path}, {id: captions})."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths, refs = {}, {}
    names = list(COLOURS)
    for i in range(n):
        colour = names[i % len(names)]
        pixels = np.clip(np.array(COLOURS[colour]) + rng.normal(0, 20, (32, 32, 3)), 0, 255).astype(np.uint8)
        path = folder / f"img{i}.png"
        Image.fromarray(pixels).save(path)
        paths[f"img{i}"] = path
        refs[f"img{i}"] = [f"a {colour} square", f"the {colour} square"]
    return paths, refs


LLAVA_TEMPLATE = ("{% for m in messages %}user : {% for c in m['content'] %}{% if c['type'] == 'image' %}<image> "
                  "{% else %}{{ c['text'] }}{% endif %}{% endfor %} assistant :{% endfor %}")
LLAVA_PROMPT = "describe the image ."


def build_llava(folder: Path, words: list[str] = WORDS, seed: int = 0) -> Path:
    """A tiny random LLaVA (CLIP vision tower + Llama), a word-level tokenizer and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    extra = ["describe", "image", "user", "assistant", ":", "."]
    vocab = {token: i for i, token in enumerate(["<pad>", "<unk>", "<s>", "</s>", "<image>", *words, *extra])}
    words_model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words_model.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=words_model, pad_token="<pad>",
                                                     unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                                     extra_special_tokens={"image_token": "<image>"})
    image_processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = transformers.LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                            chat_template=LLAVA_TEMPLATE, patch_size=8,
                                            vision_feature_select_strategy="default", num_additional_image_tokens=1)
    tiny, vision = tiny_sizes()
    text = tiny | {"model_type": "llama", "vocab_size": len(vocab), "num_key_value_heads": 2,
                   "max_position_embeddings": 128, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3}
    config = transformers.LlavaConfig(vision_config=vision | {"model_type": "clip_vision_model"}, text_config=text,
                                      image_token_index=4, vision_feature_layer=-1,
                                      vision_feature_select_strategy="default", initializer_range=1.0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.LlavaForConditionalGeneration(config)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
