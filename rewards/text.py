"""Caption text normalisation for CIDEr rewards: PTB-style tokens, lower-cased, punctuation removed.

`ptb_tokenize_fast` reproduces, in pure Python, what pycocoevalcap's `PTBTokenizer` (Stanford PTBTokenizer
3.4.1 with `-preserveLines -lowerCase`, then removal of the punctuation tokens) makes of a caption, without
starting a Java process on every SCST step. Candidates and references always go through the same function.
Its agreement with the Java tokenizer is measured on the real Flickr8k captions in the tests.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence

# the tokens pycocoevalcap drops after tokenizing (its list, verbatim: the bracket escapes are upper case
# there and survive lower-casing, as they do in pycocoevalcap itself)
PTB_PUNCTUATIONS = frozenset(["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-",
                              ".", "?", "!", ",", ":", "-", "--", "...", ";"])

_OPENERS = {'"': "``", "(": "-lrb-", "[": "-lsb-", "{": "-lcb-", "`": "`", "'": "`", "-": "-"}
_CLOSERS = {'"': "''", ")": "-rrb-", "]": "-rsb-", "}": "-rcb-", "'": "'"}
_ABBREVIATIONS = frozenset(["mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "inc", "co", "corp", "ltd", "mt", "ft", "ave", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "prof", "gen", "gov", "sen", "rep", "capt", "lt", "col", "sgt", "no"])
_SPECIAL_WORDS = {"cannot": ["can", "not"], "gonna": ["gon", "na"], "gotta": ["got", "ta"],
                  "wanna": ["wan", "na"], "can't": ["ca", "n't"], "won't": ["wo", "n't"]}
_CONTRACTION = re.compile(r"^(.+?)(n't|'s|'re|'ve|'ll|'d|'m)$")
_TRAILING_PUNCT = re.compile(r"(\.\.\.+|[?!]+|[,;:%]|--)$")
_ACRONYM = re.compile(r"^(?:[a-z]\.)+[a-z]?\.?$")
_INNER_SPLIT = re.compile(r"(\*|--|=|&)")
_CURRENCY = re.compile(r"^([$#])(.+)$")


def ptb_tokenize_fast(caption: str) -> str:
    """Lower-cased PTB tokens of `caption` without punctuation, space-joined (pycocoevalcap's output)."""
    tokens: list[str] = []
    for chunk in caption.replace("\n", " ").lower().split():
        for piece in _INNER_SPLIT.split(chunk):
            if piece:
                tokens.extend(_tokenize_chunk(piece))
    return " ".join(token for token in tokens if token not in PTB_PUNCTUATIONS)


def _tokenize_chunk(chunk: str) -> list[str]:
    """Tokens of one whitespace-free chunk: leading/trailing punctuation peeled, contractions split."""
    if chunk in ("*", "--", "=", "&") or chunk in PTB_PUNCTUATIONS:
        return [chunk]
    leading: list[str] = []
    trailing: list[str] = []
    while chunk and chunk[0] in _OPENERS and not _is_contraction_start(chunk):
        leading.append(_OPENERS[chunk[0]])
        chunk = chunk[1:]
    while chunk:
        if chunk[-1] in _CLOSERS and not (chunk[-1] == "'" and chunk.endswith("n'")):
            trailing.insert(0, _CLOSERS[chunk[-1]])
            chunk = chunk[:-1]
            continue
        match = _TRAILING_PUNCT.search(chunk)
        if match and match.start() > 0:
            trailing.insert(0, match.group(1))
            chunk = chunk[:match.start()]
            continue
        if chunk.endswith(".") and len(chunk) > 1 and not _keeps_period(chunk):
            trailing.insert(0, ".")
            chunk = chunk[:-1]
            continue
        break
    middle: list[str] = []
    if chunk:
        currency = _CURRENCY.match(chunk)
        if currency:
            middle = [currency.group(1), *_split_word(currency.group(2))]
        else:
            middle = _split_word(chunk)
    return leading + middle + trailing


def _is_contraction_start(chunk: str) -> bool:
    return chunk[0] == "'" and bool(re.match(r"^'(s|re|ve|ll|d|m|n')$", chunk))


def _keeps_period(chunk: str) -> bool:
    """True for acronyms (u.s.a., e.g.) and known abbreviations (st., mr.) whose period stays attached."""
    return bool(_ACRONYM.match(chunk)) or chunk[:-1] in _ABBREVIATIONS


def _split_word(word: str) -> list[str]:
    """Split English contractions the PTB way: "dog's" -> dog 's, "can't" -> ca n't, "cannot" -> can not."""
    if word in _SPECIAL_WORDS:
        return list(_SPECIAL_WORDS[word])
    match = _CONTRACTION.match(word)
    if match and match.group(1) not in ("'",):
        return [*_split_word(match.group(1)), match.group(2)]
    return [word]


CaptionTokenizer = Callable[[Sequence[str]], list[str]]


def fast_tokenizer(captions: Sequence[str]) -> list[str]:
    """Tokenize a batch with `ptb_tokenize_fast` (pure Python, no subprocess)."""
    return [ptb_tokenize_fast(caption) for caption in captions]


def java_ptb_tokenizer(captions: Sequence[str]) -> list[str]:
    """Tokenize a batch with pycocoevalcap's Java PTB tokenizer (exact, one Java process per call)."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    if not captions:
        return []
    batch = {str(i): [{"caption": caption}] for i, caption in enumerate(captions)}
    result = PTBTokenizer().tokenize(batch)
    return [result[str(i)][0] for i in range(len(captions))]


TOKENIZERS: dict[str, CaptionTokenizer] = {"fast": fast_tokenizer, "ptb": java_ptb_tokenizer}
