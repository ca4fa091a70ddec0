"""pycocoevalcap's PTB tokenization (Stanford PTBTokenizer 3.4.1 + punctuation removal).

`ptb_tokenize` uses the pure-Python tokenizer (`pacs.eval.ptb`, equal to Java's on the shared data sets) by default, or
pycocoevalcap's jar (`tokenizer="java"`, one Java call per batch).
"""
from __future__ import annotations

import logging
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pycocoevalcap.tokenizer.ptbtokenizer as ptb

from pacs.eval.java_runtime import require_java
from pacs.eval.ptb import python_ptb_tokenize
from pacs.metric.common.errors import InputError, PacsError

log = logging.getLogger(__name__)

PTB_JAR = Path(ptb.__file__).resolve().parent / ptb.STANFORD_CORENLP_3_4_1_JAR
_PUNCTUATION = frozenset(ptb.PUNCTUATIONS)
#: the PTB tokenizers: "python" (default, no Java) and "java" (pycocoevalcap's jar)
PTB_TOKENIZERS = ("python", "java")


def check_ptb_tokenizer(name: str) -> str:
    """`name` when it is a PTB tokenizer, else InputError naming the choices."""
    if name not in PTB_TOKENIZERS:
        raise InputError(f"PTB tokenizer {name!r}: choose one of {', '.join(PTB_TOKENIZERS)}")
    return name


def ptb_tokenize(captions: Sequence[str], tokenizer: str = "python") -> list[str]:
    """Tokenize captions as pycocoevalcap's PTBTokenizer (lower-cased, punctuation removed), output in input order.

    `tokenizer="python"` (default) needs no Java; `"java"` runs pycocoevalcap's jar once for the whole list.
    """
    if check_ptb_tokenizer(tokenizer) == "python":
        return python_ptb_tokenize(captions)
    return java_ptb_tokenize(captions)


def ptb_tokenize_pairs(candidates: Sequence[str], references: Sequence[Sequence[str]],
                       tokenizer: str = "python") -> tuple[list[str], list[list[str]]]:
    """PTB-tokenize candidates and their reference lists with one tokenizer call over the distinct strings."""
    flat = [*candidates, *(ref for refs in references for ref in refs)]
    distinct = list(dict.fromkeys(flat))
    tokens = dict(zip(distinct, ptb_tokenize(distinct, tokenizer)))
    return [tokens[c] for c in candidates], [[tokens[r] for r in refs] for refs in references]


def java_ptb_tokenize(captions: Sequence[str]) -> list[str]:
    """Tokenize captions with pycocoevalcap's Java PTBTokenizer (lower-cased, punctuation removed).

    All captions go through a single Java process; the order of the output follows the input.
    """
    if isinstance(captions, str):
        raise InputError("ptb_tokenize expects a list of captions, not a single string")
    for index, caption in enumerate(captions):
        if not isinstance(caption, str):
            raise InputError(f"caption {index} is {type(caption).__name__}, expected a string")
    if not captions:
        return []
    java = require_java(["the Java PTB tokenizer (ptb tokenizer `java`; the default `python` one needs no Java)"])
    text = "\n".join(caption.replace("\r", " ").replace("\n", " ") for caption in captions)
    with tempfile.TemporaryDirectory() as folder:
        captions_file = Path(folder) / "captions.txt"
        captions_file.write_text(text, encoding="utf-8")
        result = subprocess.run([java, "-cp", str(PTB_JAR), "edu.stanford.nlp.process.PTBTokenizer",
                                 "-preserveLines", "-lowerCase", str(captions_file)],
                                capture_output=True, check=False)
    if result.returncode != 0:
        raise PacsError(f"the PTB tokenizer failed: {result.stderr.decode(errors='replace').strip()[-500:]}")
    lines = result.stdout.decode("utf-8").split("\n")
    if len(lines) > len(captions) and all(not line.strip() for line in lines[len(captions):]):
        lines = lines[: len(captions)]
    if len(lines) != len(captions):
        raise PacsError(f"the PTB tokenizer returned {len(lines)} lines for {len(captions)} captions")
    return [" ".join(word for word in line.rstrip().split(" ") if word and word not in _PUNCTUATION)
            for line in lines]
