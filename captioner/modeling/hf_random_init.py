"""A tiny transformers captioner built from random weights: what a run trains when no pretrained folder exists
(the demo world, which no pretrained model knows; a recipe's `captioner.init`, stage `init`).

A GIT-shaped `GitForCausalLM` sized by a `RandomCaptionerConfig`, with its own ViT at the images' size, and a
`GitProcessor` of a `CLIPImageProcessor` and a word-level tokenizer whose vocabulary is the training captions'
words (sorted: deterministic from the captions), saved as a plain transformers folder that `pacs caption`, the
XE trainer and `HFPolicy` load like any other.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from annotated_types import Ge, Le

from pacs.metric.common.config import PositiveFloat, PositiveInt
from pacs.metric.common.errors import InputError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""The tokenizer's first ids: padding 0, start of a caption ([CLS]) 2, its end ([SEP]) 3."""
PAD_ID, BOS_ID, EOS_ID = 0, 2, 3
POSITIONS_MARGIN = 2
"""Text positions beyond the longest caption: the start token, and one to spare."""
FAMILIES = ("git",)
"""The families a random captioner can be built as."""


@dataclass
class RandomCaptionerConfig:
    """The sizes of a random-weight captioner (`family: git`: GitForCausalLM + GitProcessor)."""

    family: str = "git"
    hidden_size: Annotated[int, Ge(2), Le(1024)] = 128  # the text decoder
    layers: Annotated[PositiveInt, Le(24)] = 2
    heads: Annotated[PositiveInt, Le(64)] = 4
    intermediate_size: Annotated[PositiveInt, Le(4096)] = 256
    vision_hidden_size: Annotated[int, Ge(2), Le(1024)] = 128  # the ViT of the model (trained from scratch too)
    vision_layers: Annotated[PositiveInt, Le(24)] = 2
    vision_heads: Annotated[PositiveInt, Le(64)] = 4
    vision_intermediate_size: Annotated[PositiveInt, Le(4096)] = 256
    patch_size: Annotated[PositiveInt, Le(512)] = 16  # at most the image size
    initializer_range: PositiveFloat = 0.02

    def validate(self) -> None:
        """A known family; the heads split their widths."""
        check_random_captioner(self, "")


def check_random_captioner(sizes: Any, prefix: str) -> None:
    """A known `family` and widths their heads split (`sizes`: a `RandomCaptionerConfig` or a section with its
    keys; `prefix`: the section's name in the message, e.g. `captioner.`)."""
    if sizes.family not in FAMILIES:
        raise InputError(f"{prefix}family={sizes.family!r}: expected one of {', '.join(FAMILIES)}")
    for width, heads in (("hidden_size", "heads"), ("vision_hidden_size", "vision_heads")):
        if getattr(sizes, width) % getattr(sizes, heads):
            raise InputError(f"{prefix}{width}={getattr(sizes, width)}: expected a multiple of {prefix}{heads} "
                             f"({getattr(sizes, heads)})")


def caption_words(captions: Iterable[str]) -> list[str]:
    """The vocabulary of a random captioner: every space-separated word of `captions`, sorted."""
    return sorted({word for caption in captions for word in caption.split()})


def word_tokenizer(words: list[str]) -> Any:
    """A word-level tokenizer over `words` (ids after `SPECIAL_TOKENS`): lower-cased, split on spaces and
    punctuation, decoded by joining the words with spaces, so `,` and `:` stay tokens of their own (a
    `BertTokenizer`'s WordPiece decoder would glue `circle ,` into `circle,`, a word PTB tokenization and CIDEr-D
    do not know)."""
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                                cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                                bos_token="[CLS]", eos_token="[SEP]",
                                                clean_up_tokenization_spaces=False)


def build_random_captioner(sizes: Any, words: list[str], image_size: int, max_length: int, seed: int,
                           folder: Path) -> dict[str, Any]:
    """Save to `folder` the random-weight captioner of `sizes` (a `RandomCaptionerConfig` or a section with its
    keys) over `words` for `image_size`-pixel images and captions of up to `max_length` tokens, its weights drawn
    with `seed` (the global RNG is left as it was); its summary (family, vocabulary, parameters)."""
    import transformers

    tokenizer = word_tokenizer(words)
    vision = {"hidden_size": sizes.vision_hidden_size, "num_hidden_layers": sizes.vision_layers,
              "num_attention_heads": sizes.vision_heads, "intermediate_size": sizes.vision_intermediate_size,
              "image_size": image_size, "patch_size": sizes.patch_size, "initializer_range": sizes.initializer_range}
    model_config = transformers.GitConfig(
        vision_config=vision, vocab_size=len(tokenizer), hidden_size=sizes.hidden_size,
        num_hidden_layers=sizes.layers, num_attention_heads=sizes.heads,
        intermediate_size=sizes.intermediate_size, max_position_embeddings=max_length + POSITIONS_MARGIN,
        initializer_range=sizes.initializer_range, pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.GitForCausalLM(model_config)
    model.save_pretrained(folder)
    images = transformers.CLIPImageProcessor(size={"shortest_edge": image_size},
                                             crop_size={"height": image_size, "width": image_size})
    transformers.GitProcessor(images, tokenizer).save_pretrained(folder)
    return {"family": sizes.family, "vocabulary": len(tokenizer), "words": len(words),
            "parameters": sum(p.numel() for p in model.parameters()),
            "vision_parameters": sum(p.numel() for p in model.git.image_encoder.parameters())}
