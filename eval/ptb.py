"""pycocoevalcap's PTB tokenization in pure Python: no Java for BLEU, ROUGE-L and CIDEr-D.

pycocoevalcap runs Stanford's PTBTokenizer 3.4.1 (`-preserveLines -lowerCase`) over the captions joined by
newlines and drops its punctuation tokens. `python_ptb_tokenize` gives the same strings for the same list: the
rules below were written from that tokenizer's observed behaviour, and the test suite compares both on every
caption of the shared data sets (Flickr8k, Pascal-50S, the hallucination sets) when Java is present.

One quirk is kept on purpose: a one-letter abbreviation ("the letter S.") keeps its period unless a capitalised
sentence opener ("The", "A", "It", ...) follows, and Java reads the next caption of the batch as the next line, so
the last word of a caption can depend on the caption after it, exactly as in pycocoevalcap.

Outside the shared data sets the rules may still differ from Java's on rare forms ("rock'n'roll" written without
spaces, "U.S.-based", a word glued to an ellipsis); `pacs.eval.tokenize.ptb_tokenize(..., "java")` runs the jar itself.
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from pacs.metric.common.errors import InputError

#: the tokens pycocoevalcap drops after tokenizing (its PUNCTUATIONS, verbatim: the bracket escapes are upper
#: case there and survive lower-casing, as they do in pycocoevalcap itself)
PTB_PUNCTUATIONS = frozenset(["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-",
                              ".", "?", "!", ",", ":", "-", "--", "...", ";"])

def _words(text: str) -> frozenset[str]:
    """The white-space separated words of `text`."""
    return frozenset(text.split())


# abbreviations that keep their period wherever they stand (case-insensitive)
_ABBREVIATIONS = _words("""
mr mrs ms dr drs prof profs sen sens rep reps atty attys lt col gen messrs gov govs adm rev maj sgt cpl pvt
capt st ste ave pres lieut hon brig cmdr comdr pfc spc supt supts det mt ft adj adv asst assoc ens insp mlle mme
msgr sfc sr jr bros esq vs v alex wm jos cie cf treas ph invt elec natl mfg mtg dept blvd rd
jan feb mar apr jun jul aug sep sept oct nov dec mon tue tues wed thu thurs fri
ala ariz calif colo conn ct dak fla ga ind kan kans ky md mich minn mo mont neb nev okla
penn tenn va vt wis wisc wyo inc co cos corp ltd plc bancorp bhd assn univ intl sys
tel est ext sq etc al seq bldg a.k.a
""")
# abbreviations only when capitalised (otherwise common words): "Wash." but "wash."
_CAPITALISED_ABBREVIATIONS = _words("Az Ark Del Ill La Mass Miss Ore Pa Tex Wash")
# after a one-letter abbreviation ("the letter S."), these capitalised words start a new sentence: the period is
# split off (first letter upper case, the rest in any case; the word must be followed by white space)
_SENTENCE_STARTS = re.compile(
    r"\s+(?:A|An|As|At|About|After|But|He|Her|Here|However|If|In|It|Last|Many|More|Now|Once|One|Other|Our|"
    r"She|Since|So|Some|Such|That|The|Their|Then|There|These|They|This|We|What|When|While|Yet|You)\s",
    re.IGNORECASE)
# abbreviations that keep their period only before a number ("no. 5", "fig. 2")
_NUMBER_ABBREVIATIONS = _words("ca fig figs prop no nos sec sect secs sects art arts para paras pp op")
# words split by the tokenizer (case-insensitive): cannot -> can not, gonna -> gon na, ...
_SPLIT_WORDS = {"cannot": 3, "gonna": 3, "gotta": 3, "wanna": 3, "lemme": 3, "gimme": 3}

_APOSTROPHES = "'\u2019"
_SCRIPTS = "\u00b2\u00b3\u00b9\u00bc-\u00be\u2070-\u209f\u2150-\u215f"  # super/subscripts, fractions: own tokens
_LETTER = rf"[^\W\d_{_SCRIPTS}]"
_ALNUM = rf"[^\W_{_SCRIPTS}]"
_ALNUM_CHAR = re.compile(_ALNUM)
_SEGMENT = rf"{_ALNUM}+"
_WORD = re.compile(rf"{_SEGMENT}(?:(?:[-/_]|[.!?](?={_LETTER})){_SEGMENT})*")
_URL = re.compile(r"(?:https?|ftp)://[^\s\"<>|(){}\[\]]*[^\s\"'<>|.!?(){},;:&\[\]-]")
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9][A-Za-z0-9.-]*[A-Za-z0-9]")
_AT_NAME = re.compile(r"@[A-Za-z_][A-Za-z_0-9]*|#[^\W\d_]\w*[^\W_]|_+")
_SPECIAL = re.compile(r"[Cc]\+\+|['\u2019][tT](?=(?:[iI][sS]|[wW][aA][sS])(?![^\W_]))|[yY]['\u2019](?=[^\W\d_])")
_CURRENCIES = {"\u20ac": "$", "\u00a3": "#"}  # normalised as PTB does: euro -> $, pound -> #
_FRACTIONS = {"\u00bc": "1/4", "\u00bd": "1/2", "\u00be": "3/4", "\u2153": "1/3", "\u2154": "2/3"}
_NUMBER = re.compile(r"\d*(?:[.,:]\d+)+")
_HYPHENATED = re.compile(rf"{_ALNUM}(?:{_ALNUM}|[.,](?={_ALNUM}))*(?:-{_SEGMENT})+")
_AMPERSAND = re.compile(r"[A-Z]+(?:&[A-Z]+)+")
_SMILEY = re.compile(r"[:;=]-?[()\[\]DPp](?![^\W_])")
_BRACKET_ESCAPE = re.compile(r"-(?:LRB|RRB|LCB|RCB|LSB|RSB)-", re.IGNORECASE)
_REDUCED = re.compile(r"['\u2019](?:[sSdDmM]|[rR][eE]|[vV][eE]|[lL][lL])(?![^\W_])")
_NEGATION = re.compile(r"[nN]['\u2019][tT](?![^\W_])")
_APOSTROPHE_WORDS = (*(re.compile(pattern, re.IGNORECASE) for pattern in (
    r"['\u2019](?:n['\u2019]?|em|til|till|cause|\d0s)(?![^\W_])",
    r"[ldj]['\u2019]",
    rf"[a-hj-xz]['\u2019]{_LETTER}{{2,}}",
    r"c'mon|ol'|li'l|s'mores")), re.compile(rf"{_LETTER}*[aeiouyAEIOUY]['\u2019][aeiouA-Z]{_LETTER}*"))
_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}
_DASHES = "\u2013\u2014"
_ENTITIES = (("&apos;", "'"), ("&quot;", '"'), ("&amp;", "&"))


def python_ptb_tokenize(captions: Sequence[str]) -> list[str]:
    """Tokenize a batch as pycocoevalcap's PTBTokenizer does (lower-cased, punctuation removed), without Java."""
    if isinstance(captions, str):
        raise InputError("python_ptb_tokenize expects a list of captions, not a single string")
    lines = []
    for index, caption in enumerate(captions):
        if not isinstance(caption, str):
            raise InputError(f"caption {index} is {type(caption).__name__}, expected a string")
        lines.append(caption.replace("\r", " ").replace("\n", " "))
    result = [""] * len(lines)
    following: str | None = None  # the next line that is not blank (Java reads across lines); None: end of input
    for index in range(len(lines) - 1, -1, -1):
        after = "" if following is None else "\n" + following.lstrip()[:20]
        tokens = _tokenize_line(lines[index], after)
        result[index] = " ".join(token for token in (t.lower() for t in tokens) if token not in PTB_PUNCTUATIONS)
        if lines[index].strip():
            following = lines[index]
    return result


def _tokenize_line(line: str, after: str) -> list[str]:
    """PTB tokens (original case, before punctuation removal) of one line."""
    for entity, char in _ENTITIES:
        line = line.replace(entity, char)
    tokens: list[str] = []
    position, end = 0, len(line)
    while position < end:
        char = line[position]
        if char.isspace():
            position += 1
            continue
        length, produced = _next_token(line, position, after)
        tokens.extend(produced)
        position += max(length, 1)
    return tokens


def _longest(patterns: Sequence[re.Pattern[str]], line: str, position: int) -> int:
    """Length of the longest match of `patterns` at `position` (0 when none)."""
    best = 0
    for pattern in patterns:
        match = pattern.match(line, position)
        if match and match.end() - position > best:
            best = match.end() - position
    return best


def _next_token(line: str, position: int, after: str) -> tuple[int, list[str]]:
    """(characters consumed, tokens) at `position` (a non-space character)."""
    char = line[position]
    rest = line[position:]
    escape = _BRACKET_ESCAPE.match(line, position)
    if escape:
        return escape.end() - position, [escape.group(0).upper()]
    special = _longest((_URL, _EMAIL, _AT_NAME, _SPECIAL), line, position)
    if special and special >= _longest((_WORD, _NUMBER, _HYPHENATED, _AMPERSAND), line, position):
        return special, [line[position:position + special].replace("\u2019", "'")]
    if char in _FRACTIONS:
        return 1, [_FRACTIONS[char]]
    if char in _CURRENCIES:
        return 1, [_CURRENCIES[char]]
    if char in "\u2026\u0085":
        return 1, ["..."]
    smiley = _SMILEY.match(line, position)
    if smiley:
        text = smiley.group(0)
        return len(text), ["".join(_BRACKETS.get(c, c) for c in text)]
    if char in _APOSTROPHES:
        for pattern in (_REDUCED, _NEGATION):
            match = pattern.match(line, position)
            if match:
                return match.end() - position, [match.group(0).replace("\u2019", "'")]
    negation = _NEGATION.match(line, position)
    if negation:
        return 3, [negation.group(0).replace("\u2019", "'")]
    apostrophe_word = _longest(_APOSTROPHE_WORDS, line, position)
    if apostrophe_word and apostrophe_word >= _longest((_WORD, _NUMBER, _HYPHENATED, _AMPERSAND), line, position):
        return apostrophe_word, [line[position:position + apostrophe_word].replace("\u2019", "'")]
    if _ALNUM_CHAR.match(char):
        return _word_token(line, position, after)
    number = _NUMBER.match(line, position)
    if number:
        return number.end() - position, [number.group(0)]
    if rest.startswith("..."):
        length = len(rest) - len(rest.lstrip("."))
        return length, ["..."]
    if rest.startswith("--") or char in _DASHES:
        length = len(rest) - len(rest.lstrip("-")) if char == "-" else 1
        return length, ["--"]
    if char in "?!" and rest[1:2] in ("?", "!"):
        length = len(rest) - len(rest.lstrip("?!"))
        return length, [rest[:length]]
    if rest.startswith(("``", "''")):
        return 2, ["``" if char == "`" else "''"]
    if char in _BRACKETS:
        return 1, [_BRACKETS[char]]
    if char in '"\u201c\u201d':
        return 1, ["''"]
    if char in "'`\u2018\u2019":
        return 1, ["'"]
    if char.isascii() or unicodedata.category(char) in ("Sm", "Sk", "Sc", "No", "Pd", "Po", "Ps", "Pe", "Pi", "Pf"):
        return 1, [char]
    return 1, []  # a character the tokenizer cannot tokenize is deleted


def _word_token(line: str, position: int, after: str) -> tuple[int, list[str]]:
    """A word, number or hyphenated compound at `position`, with its contractions and final period."""
    length = _longest((_WORD, _NUMBER, _HYPHENATED, _AMPERSAND), line, position)
    word = line[position:position + length]
    lower = word.lower()
    if lower in _SPLIT_WORDS:
        cut = _SPLIT_WORDS[lower]
        return length, [word[:cut], word[cut:]]
    end = position + length
    # "don't" -> do n't: the word gives its final n to the negation
    if word[-1:] in "nN" and _NEGATION.match(line, end - 1) and len(word) > 1:
        return length - 1, [word[:-1]]
    if end < len(line) and line[end] == "." and _keeps_period(word, line, end, after):
        return length + 1, [word + "."]
    return length, [word]


def _keeps_period(word: str, line: str, period: int, after: str) -> bool:
    """True when the period after `word` belongs to it (abbreviation, acronym, or before , ; :)."""
    lower = word.lower()
    following = line[period + 1:period + 2]
    if following in (",", ";", ":"):
        return True
    if following and not following.isspace():
        return False
    if lower in _ABBREVIATIONS or word in _CAPITALISED_ABBREVIATIONS:
        return True
    if re.fullmatch(r"[a-z](?:\.[a-z])+", lower):
        return True
    if lower in _NUMBER_ABBREVIATIONS:
        rest = line[period + 1:].lstrip()
        return rest[:1].isdigit()
    if re.fullmatch(r"[a-z]", lower):
        starts = _SENTENCE_STARTS.match(line[period + 1:] + after)
        return not (starts and starts.group(0).strip()[0].isupper())
    return False
