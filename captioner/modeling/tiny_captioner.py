"""A tiny random transformers captioner folder, built offline: what `pacs caption` and the transformers stages load.

`make_tiny_captioner(out)` writes a GIT (`GitForCausalLM` + `GitProcessor`) or BLIP
(`BlipForConditionalGeneration` + `BlipProcessor`) folder with `save_pretrained`: 2 layers, width 32, 32-pixel
images, a word-level BERT vocabulary of `words`; random weights seeded by `seed`. Nothing is downloaded. It is a
model to try the commands on (its captions are noise), not one to report.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pacs.metric.common.errors import InputError

#: the kinds of tiny captioner `make_tiny_captioner` builds
TINY_KINDS = ("git", "blip")
#: the default vocabulary (a few colours, shapes and function words)
TINY_WORDS = ("a", "the", "red", "blue", "green", "dog", "cat", "square", "circle", "on", "grass", "picture", "of")
#: BERT's special tokens, ids 0..5 ([DEC] is BLIP's decoder start)
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]")
IMAGE_SIZE = 32


def make_tiny_captioner(out: str | os.PathLike, kind: str = "git", words: Sequence[str] = TINY_WORDS,
                        seed: int = 0) -> Path:
    """Write a tiny random transformers captioner (`kind` git or blip) to the new folder `out`; its path.

    >>> import tempfile, pathlib
    >>> folder = make_tiny_captioner(pathlib.Path(tempfile.mkdtemp()) / "tiny-git")
    >>> sorted(p.name for p in folder.iterdir())[:3]
    ['config.json', 'generation_config.json', 'model.safetensors']
    """
    import torch  # deferred with transformers: importing this module stays cheap
    import transformers

    if kind not in TINY_KINDS:
        raise InputError(f"tiny captioner kind {kind!r}: choose one of {', '.join(TINY_KINDS)}")
    words = [str(word) for word in words]
    if not words or len(set(words)) != len(words) or any(not w or w.split() != [w] for w in words):
        raise InputError("words: a non-empty list of distinct single words")
    target = Path(out)
    if target.exists():
        raise InputError(f"{target}: exists; make_tiny_captioner writes a new folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    sizes = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 37}
    vision = sizes | {"image_size": IMAGE_SIZE, "patch_size": 8}
    vocab_size = len(SPECIAL_TOKENS) + len(words)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as scratch:
        vocab = Path(scratch) / "vocab.txt"
        vocab.write_text("\n".join([*SPECIAL_TOKENS, *words]) + "\n", encoding="utf-8")
        tokenizer = transformers.BertTokenizer(str(vocab), bos_token="[DEC]")
        folder = Path(scratch) / "model"
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            if kind == "git":
                config = transformers.GitConfig(vision_config=vision, vocab_size=vocab_size, max_position_embeddings=64,
                                                pad_token_id=0, bos_token_id=2, eos_token_id=3, **sizes)
                model = transformers.GitForCausalLM(config)
                images = transformers.CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                                                         crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
                processor = transformers.GitProcessor(images, tokenizer)
            else:
                text = sizes | {"vocab_size": vocab_size, "pad_token_id": 0, "bos_token_id": 5, "eos_token_id": 3,
                                "sep_token_id": 3, "max_position_embeddings": 64}
                config = transformers.BlipConfig(text_config=text, vision_config=vision, projection_dim=32)
                model = transformers.BlipForConditionalGeneration(config)
                processor = transformers.BlipProcessor(
                    transformers.BlipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}), tokenizer)
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        shutil.move(str(folder), str(target))  # whole or not at all: no half-written folder at `out`
    return target
