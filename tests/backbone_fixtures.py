"""Tiny backbones of every family built offline in seconds, for any test: `from tests.backbone_fixtures import ...`.

Each builder writes a folder under the given directory and returns its path as a string, loadable with
``load_backbone(checkpoint=FOLDER)``; the open_clip ones also with ``load_backbone(backbone="local-dir:" + FOLDER)``.

- `tiny_open_clip_siglip`: open_clip SigLIP-style model (custom text tower without causal mask pooled at the last
  token, `init_logit_bias` -10, vision attention pooling), a 64-piece sentencepiece tokenizer trained on Flickr8k
  captions (`spiece.model`, loaded by open_clip through `T5Tokenizer`), preprocessing mean = std = 0.5, bicubic,
  squash; as open_clip's `local-dir` layout.
- `tiny_open_clip_siglip2`: the SigLIP2 variant (tanh-approximated GELU in the text tower, a 96-piece
  sentencepiece tokenizer: a Gemma tokenizer is not needed to exercise the code, any sentencepiece HF
  tokenizer with another vocabulary size does).
- `tiny_transformers_clip` / `tiny_transformers_siglip` / `tiny_transformers_siglip2`: `CLIPModel` (with a
  CLIP BPE tokenizer made of the byte alphabet and the first 300 merges of open_clip's vocabulary),
  `SiglipModel` (`SiglipTokenizer` on the 64-piece model), `Siglip2Model` (NaFlex image processor, a
  right-padding `T5Tokenizer` with 96 pieces), saved with their processors.

The pytest fixtures of the same names (session-scoped, in tests/metric/conftest.py) call these once.
"""
from __future__ import annotations

import gzip
import io
import json
import math
import os
from pathlib import Path

import torch

LOGIT_BIAS = -10.0
LOGIT_SCALE = 10.0
_FALLBACK_CAPTIONS = [
    "a dog runs across the green grass", "two children play on the beach near the water",
    "a man in a red shirt rides a bicycle down the street", "a black and white dog jumps over a log",
    "a woman is sitting on a bench in the park", "a group of people stand in front of a building",
]


def caption_corpus(limit: int = 400) -> list[str]:
    """Up to `limit` Flickr8k captions from $PACS_SHARED (a few built-in sentences when it is not set)."""
    root = os.environ.get("PACS_SHARED")
    path = Path(root) / "data" / "flickr8k" / "Flickr8k.token.txt" if root else None
    if path is None or not path.is_file():
        return _FALLBACK_CAPTIONS * 20
    lines = path.read_text(encoding="utf-8").splitlines()[:limit]
    return [line.split("\t", 1)[1].strip() for line in lines if "\t" in line]


def train_sentencepiece(folder: Path, vocab_size: int = 64) -> Path:
    """Train a unigram sentencepiece model (pad 0, eos 1, unk 2, no bos) on captions; write `folder/spiece.model`."""
    import sentencepiece

    buffer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(caption_corpus()), model_writer=buffer, vocab_size=vocab_size, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2, hard_vocab_limit=False, num_threads=1)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spiece.model"
    path.write_bytes(buffer.getvalue())
    return path


def _t5_tokenizer(folder: Path, vocab_size: int):
    from transformers import T5Tokenizer

    train_sentencepiece(folder, vocab_size)
    return T5Tokenizer.from_pretrained(str(folder), extra_ids=0, padding_side="right")


def siglip_open_clip_config(vocab_size: int, context_length: int = 16, siglip2: bool = False) -> dict:
    """A tiny open_clip SigLIP-style model config (the shape of open_clip's ViT-*-SigLIP configs, scaled down)."""
    text_cfg = {"context_length": context_length, "vocab_size": vocab_size, "hf_tokenizer_name": "local",
                "tokenizer_kwargs": {"clean": "canonicalize"}, "width": 32, "heads": 2, "layers": 2,
                "mlp_ratio": 2.0, "no_causal_mask": True, "proj_bias": True, "pool_type": "last",
                "norm_kwargs": {"eps": 1e-6}}
    if siglip2:
        text_cfg["act_kwargs"] = {"approximate": "tanh"}
    return {"embed_dim": 32, "init_logit_bias": LOGIT_BIAS, "custom_text": True,
            "vision_cfg": {"image_size": 32, "patch_size": 16, "width": 32, "layers": 2, "head_width": 16,
                           "mlp_ratio": 2.0, "attentional_pool": True, "attn_pooler_queries": 1,
                           "attn_pooler_heads": 2},
            "text_cfg": text_cfg}


SIGLIP_PREPROCESS = {"size": 32, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "interpolation": "bicubic",
                     "resize_mode": "squash"}


def _open_clip_siglip(folder: Path, vocab_size: int, siglip2: bool, seed: int) -> str:
    from open_clip.model import CustomTextCLIP
    from safetensors.torch import save_file

    tokenizer = _t5_tokenizer(folder, vocab_size)
    tokenizer.save_pretrained(str(folder))
    config = siglip_open_clip_config(len(tokenizer), siglip2=siglip2)
    kwargs = {key: value for key, value in config.items() if key != "custom_text"}
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = CustomTextCLIP(**kwargs)
    finally:
        torch.random.set_rng_state(state)
    with torch.no_grad():
        model.logit_scale.fill_(math.log(LOGIT_SCALE))
    save_file({key: value.detach().contiguous() for key, value in model.state_dict().items()},
              str(folder / "open_clip_model.safetensors"))
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": config,
                                                              "preprocess_cfg": SIGLIP_PREPROCESS}))
    return str(folder)


def tiny_open_clip_siglip(tmp_path: Path, seed: int = 0) -> str:
    """An open_clip SigLIP-style `local-dir` folder (64-piece sentencepiece tokenizer); returns the folder."""
    return _open_clip_siglip(Path(tmp_path) / "open_clip_siglip", 64, siglip2=False, seed=seed)


def tiny_open_clip_siglip2(tmp_path: Path, seed: int = 0) -> str:
    """An open_clip SigLIP2-style `local-dir` folder (96-piece sentencepiece tokenizer); returns the folder."""
    return _open_clip_siglip(Path(tmp_path) / "open_clip_siglip2", 96, siglip2=True, seed=seed)


def _seeded(build, seed: int):
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        return build().eval()
    finally:
        torch.random.set_rng_state(state)


_TOWER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}


def clip_bpe_tokenizer(n_merges: int = 300):
    """A transformers `CLIPTokenizer`: the byte alphabet, the first `n_merges` merges of open_clip's CLIP BPE."""
    from open_clip.tokenizer import bytes_to_unicode, default_bpe
    from transformers import CLIPTokenizer

    with gzip.open(default_bpe(), "rt", encoding="utf-8") as handle:
        merges = handle.read().split("\n")[1:1 + n_merges]
    alphabet = list(bytes_to_unicode().values())
    vocab = alphabet + [char + "</w>" for char in alphabet] + ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    return CLIPTokenizer(vocab={token: index for index, token in enumerate(vocab)},
                         merges=[tuple(merge.split()) for merge in merges])


def tiny_transformers_clip(tmp_path: Path, seed: int = 0) -> str:
    """A transformers `CLIPModel` folder with its `CLIPProcessor` (context 24, 32 px); returns the folder."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    folder = Path(tmp_path) / "transformers_clip"
    tokenizer = clip_bpe_tokenizer()
    eos, bos = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|startoftext|>"])
    config = CLIPConfig(
        text_config={**_TOWER, "vocab_size": len(tokenizer), "max_position_embeddings": 24, "eos_token_id": eos,
                     "bos_token_id": bos, "pad_token_id": eos},
        vision_config={**_TOWER, "image_size": 32, "patch_size": 16}, projection_dim=32)
    model = _seeded(lambda: CLIPModel(config), seed)
    processor = CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32},
                                                                 crop_size={"height": 32, "width": 32}),
                              tokenizer=tokenizer)
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    return str(folder)


def _siglip_text(vocab_size: int, pad: int, eos: int) -> dict:
    return {**_TOWER, "vocab_size": vocab_size, "max_position_embeddings": 16, "pad_token_id": pad,
            "eos_token_id": eos, "bos_token_id": None}


def _calibrate(model) -> None:
    with torch.no_grad():
        model.logit_scale.fill_(math.log(LOGIT_SCALE))
        model.logit_bias.fill_(LOGIT_BIAS)


def tiny_transformers_siglip(tmp_path: Path, seed: int = 0) -> str:
    """A transformers `SiglipModel` folder with its `SiglipProcessor` (64-piece tokenizer); returns the folder."""
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipProcessor, SiglipTokenizer

    folder = Path(tmp_path) / "transformers_siglip"
    spiece = train_sentencepiece(Path(tmp_path) / "siglip_spiece", 64)
    tokenizer = SiglipTokenizer(vocab_file=str(spiece), model_max_length=16)
    config = SiglipConfig(text_config=_siglip_text(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id),
                          vision_config={**_TOWER, "image_size": 32, "patch_size": 16})
    model = _seeded(lambda: SiglipModel(config), seed)
    _calibrate(model)
    processor = SiglipProcessor(image_processor=SiglipImageProcessor(size={"height": 32, "width": 32}),
                                tokenizer=tokenizer)
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    return str(folder)


def tiny_transformers_siglip2(tmp_path: Path, seed: int = 0) -> str:
    """A transformers `Siglip2Model` folder (NaFlex, 16 patches of 8 px) with its processor; returns the folder."""
    from transformers import Siglip2Config, Siglip2ImageProcessor, Siglip2Model, Siglip2Processor

    folder = Path(tmp_path) / "transformers_siglip2"
    tokenizer = _t5_tokenizer(Path(tmp_path) / "siglip2_spiece", 96)
    config = Siglip2Config(text_config=_siglip_text(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id),
                           vision_config={**_TOWER, "num_patches": 16, "patch_size": 8})
    model = _seeded(lambda: Siglip2Model(config), seed)
    _calibrate(model)
    processor = Siglip2Processor(image_processor=Siglip2ImageProcessor(max_num_patches=16, patch_size=8),
                                 tokenizer=tokenizer)
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    return str(folder)


BUILDERS = {
    "open_clip-siglip": tiny_open_clip_siglip,
    "open_clip-siglip2": tiny_open_clip_siglip2,
    "transformers-clip": tiny_transformers_clip,
    "transformers-siglip": tiny_transformers_siglip,
    "transformers-siglip2": tiny_transformers_siglip2,
}
"""Builder of each tiny family (the key names the family; open_clip SigLIP2 loads as kind ``open_clip-siglip``)."""
