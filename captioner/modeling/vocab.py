"""Caption vocabularies: word-level (PTB-style, lower-cased, rare words -> <unk>) or sentencepiece subwords.

Both kinds share one interface (`encode`, `decode`, ids of the special tokens, `save`/`load` as JSON) and one
registry (`VOCAB_KINDS`), so the model and the trainers never care which one is in use.
Token ids 0..3 are always `<pad> <bos> <eos> <unk>`.
"""
from __future__ import annotations

import base64
import json
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.common.io import write_json_atomic

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
DEFAULT_MAX_LENGTH = 20

# Punctuation tokens that pycocoevalcap's PTBTokenizer removes after tokenization.
_PTB_PUNCTUATION = {"''", "'", "``", "`", "-lrb-", "-rrb-", "-lcb-", "-rcb-", ".", "?", "!", ",", ":", "-", "--",
                    "...", ";", "(", ")", "[", "]", "{", "}", '"'}
# Clitics split off the preceding word, as the Penn Treebank does ("dog's" -> "dog 's", "don't" -> "do n't").
_CLITICS = re.compile(r"(?i)(\w)(n't|'s|'re|'ve|'ll|'d|'m)\b")
_TOKEN = re.compile(r"n't|'s|'re|'ve|'ll|'d|'m|\w+(?:[-./]\w+)*|\.\.\.|--|[^\w\s]")


def ptb_tokenize_fast(caption: str) -> list[str]:
    """Tokenize one caption the way the COCO toolkit does (lower-cased, PTB clitics, punctuation removed)."""
    text = _CLITICS.sub(r"\1 \2", caption.lower().replace("\u2019", "'"))
    return [token for token in _TOKEN.findall(text) if token not in _PTB_PUNCTUATION]


class WordVocab:
    """Word-level vocabulary over PTB-style tokens; words seen fewer than `min_count` times map to <unk>."""

    kind = "word"

    def __init__(self, words: Sequence[str], max_length: int = DEFAULT_MAX_LENGTH) -> None:
        self.itos: list[str] = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self.stoi: dict[str, int] = {word: index for index, word in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise InputError("vocabulary has duplicate words")
        self.max_length = int(max_length)

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 5, max_length: int = DEFAULT_MAX_LENGTH) -> WordVocab:
        """Build from training captions, keeping words seen at least `min_count` times (sorted by frequency)."""
        counts = Counter(token for caption in captions for token in ptb_tokenize_fast(caption))
        words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        return cls(words, max_length)

    def __len__(self) -> int:
        return len(self.itos)

    def tokenize(self, caption: str) -> list[str]:
        """Split a caption into the vocabulary's units."""
        return ptb_tokenize_fast(caption)

    def encode(self, caption: str) -> list[int]:
        """Return the token ids of `caption` (no bos/eos), truncated to `max_length`."""
        return [self.stoi.get(token, UNK_ID) for token in self.tokenize(caption)][: self.max_length]

    def decode(self, ids: Iterable[int]) -> str:
        """Return the caption for `ids`, stopping at the first <eos> and skipping <pad>/<bos>."""
        words = []
        for index in ids:
            index = int(index)
            if index == EOS_ID:
                break
            if index in (PAD_ID, BOS_ID):
                continue
            words.append(self.itos[index] if 0 <= index < len(self.itos) else UNK)
        return " ".join(words)

    def to_dict(self) -> dict:
        """Return a JSON-serialisable description."""
        return {"kind": self.kind, "max_length": self.max_length, "itos": self.itos}

    @classmethod
    def from_dict(cls, data: dict) -> WordVocab:
        """Rebuild from `to_dict` output."""
        itos = data["itos"]
        if list(itos[:4]) != list(SPECIALS):
            raise InputError(f"word vocabulary must start with {SPECIALS}, got {itos[:4]}")
        return cls(itos[4:], data.get("max_length", DEFAULT_MAX_LENGTH))

    def save(self, path: str | os.PathLike) -> None:
        """Write the vocabulary as JSON atomically."""
        write_json_atomic(path, self.to_dict(), indent=None)


class SentencePieceVocab:
    """Subword vocabulary: a sentencepiece unigram/BPE model trained on the (lower-cased) training captions."""

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes, max_length: int = DEFAULT_MAX_LENGTH) -> None:
        spm = _import_sentencepiece()
        self.model_proto = model_proto
        self.processor = spm.SentencePieceProcessor(model_proto=model_proto)
        self.max_length = int(max_length)
        self.itos = [self.processor.id_to_piece(i) for i in range(self.processor.get_piece_size())]
        self.itos[:4] = list(SPECIALS)

    @classmethod
    def build(cls, captions: Iterable[str], vocab_size: int = 8000, max_length: int = DEFAULT_MAX_LENGTH,
              model_type: str = "unigram") -> SentencePieceVocab:
        """Train a sentencepiece model on the captions (lower-cased) with ids 0..3 = pad/bos/eos/unk."""
        spm = _import_sentencepiece()
        lines = [" ".join(ptb_tokenize_fast(c)) for c in captions]
        with tempfile.TemporaryDirectory() as tmp:
            corpus = Path(tmp) / "corpus.txt"
            corpus.write_text("\n".join(line for line in lines if line) + "\n", encoding="utf-8")
            prefix = Path(tmp) / "sp"
            spm.SentencePieceTrainer.train(
                input=str(corpus), model_prefix=str(prefix), vocab_size=vocab_size, model_type=model_type,
                pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID, hard_vocab_limit=False,
                character_coverage=1.0, minloglevel=2, num_threads=1)
            proto = (prefix.with_suffix(".model")).read_bytes()
        return cls(proto, max_length)

    def __len__(self) -> int:
        return len(self.itos)

    def tokenize(self, caption: str) -> list[str]:
        """Split a caption into subword pieces."""
        return self.processor.encode(" ".join(ptb_tokenize_fast(caption)), out_type=str)

    def encode(self, caption: str) -> list[int]:
        """Return the subword ids of `caption` (no bos/eos), truncated to `max_length`."""
        return list(self.processor.encode(" ".join(ptb_tokenize_fast(caption))))[: self.max_length]

    def decode(self, ids: Iterable[int]) -> str:
        """Return the caption for `ids`, stopping at the first <eos>."""
        kept = []
        for index in ids:
            index = int(index)
            if index == EOS_ID:
                break
            if index not in (PAD_ID, BOS_ID):
                kept.append(index)
        return self.processor.decode(kept)

    def to_dict(self) -> dict:
        """Return a JSON-serialisable description (the model bytes base64-encoded)."""
        return {"kind": self.kind, "max_length": self.max_length,
                "model": base64.b64encode(self.model_proto).decode("ascii")}

    @classmethod
    def from_dict(cls, data: dict) -> SentencePieceVocab:
        """Rebuild from `to_dict` output."""
        return cls(base64.b64decode(data["model"]), data.get("max_length", DEFAULT_MAX_LENGTH))

    def save(self, path: str | os.PathLike) -> None:
        """Write the vocabulary as JSON atomically."""
        write_json_atomic(path, self.to_dict(), indent=None)


def _import_sentencepiece():
    try:
        import sentencepiece
    except ImportError:
        raise MissingResourceError("the sentencepiece vocabulary needs the `sentencepiece` package: "
                                   "pip install 'pacs-captioning[sentencepiece]'") from None
    return sentencepiece


Vocab = WordVocab | SentencePieceVocab
VOCAB_KINDS: dict[str, Callable[..., Vocab]] = {"word": WordVocab.build, "sentencepiece": SentencePieceVocab.build}
_LOADERS = {"word": WordVocab.from_dict, "sentencepiece": SentencePieceVocab.from_dict}


def build_vocab(kind: str, captions: Sequence[str], min_count: int = 5, vocab_size: int = 8000,
                max_length: int = DEFAULT_MAX_LENGTH) -> Vocab:
    """Build a vocabulary of `kind` ('word' or 'sentencepiece') from training captions."""
    if kind == "word":
        return WordVocab.build(captions, min_count=min_count, max_length=max_length)
    if kind == "sentencepiece":
        return SentencePieceVocab.build(captions, vocab_size=vocab_size, max_length=max_length)
    raise InputError(f"unknown vocabulary kind {kind!r} (known: {', '.join(VOCAB_KINDS)})")


def vocab_from_dict(data: dict, where: str = "vocabulary") -> Vocab:
    """Rebuild a vocabulary of any kind from its `to_dict` output."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in _LOADERS:
        raise InputError(f"{where}: unknown vocabulary kind {kind!r} (known: {', '.join(_LOADERS)})")
    return _LOADERS[kind](data)


def load_vocab(path: str | os.PathLike) -> Vocab:
    """Load a vocabulary JSON written by `save`."""
    path = Path(path)
    if not path.is_file():
        raise MissingResourceError(f"vocabulary file not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:  # ValueError: bad JSON or bytes that are not UTF-8
        raise InputError(f"{path}: invalid JSON ({error})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a vocabulary (expected a JSON object)")
    return vocab_from_dict(data, str(path))
