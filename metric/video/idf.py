"""IDF weights of CLIP token ids from a reference corpus (PAC-S++ Eq. 10; EMScore's rules), cacheable as JSON.

Each sentence of the corpus is one document, tokenized as the scorer tokenizes captions (SOT ... EOT). With N
documents and `df(t)` the number of documents holding token `t`:
`idf(t) = log((N + 1) / (df(t) + 1))`; a token never seen gets `log(N + 1)`; the SOT token, present in every
document, gets 0; the EOT token gets the mean of the table's values (EMScore's rule, taken over every token seen,
SOT and EOT included, before the EOT entry is replaced), so the EOS embedding `t_c` keeps an average weight.
"""
from __future__ import annotations

import hashlib
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from pacs.metric.common.errors import InputError
from pacs.metric.common.io import write_json_atomic
from pacs.metric.common.json_input import read_json_file

IDF_FORMAT = "pacs-video-idf/1"


def corpus_digest(sentences: Sequence[str]) -> str:
    """sha256 of a corpus (sentences in order, NUL-separated): the IDF cache key."""
    digest = hashlib.sha256()
    for sentence in sentences:
        digest.update(sentence.encode("utf-8") + b"\0")
    return digest.hexdigest()


@dataclass
class IdfTable:
    """Token id -> IDF weight, with the weight of unseen ids; `uniform()` gives weight 1 to every token."""

    weights: dict[int, float] = field(default_factory=dict)
    default: float = 1.0
    n_documents: int = 0
    corpus_sha256: str = ""

    @classmethod
    def uniform(cls) -> IdfTable:
        """The table without IDF: every token weighs 1."""
        return cls()

    def lookup(self, token_ids: Iterable[int]) -> torch.Tensor:
        """Return the weights of `token_ids` as a float tensor."""
        return torch.tensor([self.weights.get(int(t), self.default) for t in token_ids], dtype=torch.float32)

    def to_json(self) -> dict:
        """A JSON-serialisable form (keys are token ids as strings)."""
        return {"format": IDF_FORMAT, "n_documents": self.n_documents, "corpus_sha256": self.corpus_sha256,
                "default": self.default, "weights": {str(k): v for k, v in sorted(self.weights.items())}}

    @classmethod
    def from_json(cls, data: dict, where: str = "IDF table") -> IdfTable:
        """Rebuild a table written by `to_json` (an error naming `where` if the data is not one)."""
        if not isinstance(data, dict) or data.get("format") != IDF_FORMAT:
            raise InputError(f"{where}: not a pacs IDF table (expected format {IDF_FORMAT!r})")
        try:
            weights = {int(k): float(v) for k, v in data["weights"].items()}
            return cls(weights=weights, default=float(data["default"]), n_documents=int(data["n_documents"]),
                       corpus_sha256=str(data.get("corpus_sha256", "")))
        except (KeyError, TypeError, ValueError) as error:
            raise InputError(f"{where}: malformed IDF table ({error})") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write the table as JSON atomically."""
        write_json_atomic(path, self.to_json(), indent=None)

    @classmethod
    def load(cls, path: str | os.PathLike) -> IdfTable:
        """Read a table written by `save`."""
        return cls.from_json(read_json_file(path, "IDF table"), str(path))  # one line for any bad file


def idf_from_token_ids(documents: Iterable[Sequence[int]], sot_id: int, eot_id: int) -> IdfTable:
    """Compute the IDF table of tokenized documents (each a list of ids incl. SOT and EOT)."""
    counts: Counter[int] = Counter()
    n_documents = 0
    for ids in documents:
        counts.update({int(t) for t in ids})
        n_documents += 1
    if n_documents == 0:
        raise InputError("IDF corpus is empty: give at least one sentence")
    weights = {t: math.log((n_documents + 1) / (c + 1)) for t, c in counts.items()}
    weights[sot_id] = math.log((n_documents + 1) / (n_documents + 1))
    weights.setdefault(eot_id, 0.0)
    weights[eot_id] = sum(weights.values()) / len(weights)
    return IdfTable(weights=weights, default=math.log(n_documents + 1), n_documents=n_documents)


def compute_idf(sentences: Sequence[str], tokenize_ids: Callable[[Sequence[str]], list[list[int]]],
                sot_id: int, eot_id: int, batch_size: int = 1024, progress: bool = True) -> IdfTable:
    """Tokenize `sentences` (one document each) with `tokenize_ids` and compute their IDF table."""
    def documents() -> Iterable[list[int]]:
        for start in tqdm(range(0, len(sentences), batch_size), desc="IDF corpus", unit="batch",
                          disable=not progress or len(sentences) <= batch_size):
            yield from tokenize_ids(sentences[start:start + batch_size])

    table = idf_from_token_ids(documents(), sot_id, eot_id)
    table.corpus_sha256 = corpus_digest(sentences)
    return table


def cached_idf(sentences: Sequence[str], tokenize_ids: Callable[[Sequence[str]], list[list[int]]],
               sot_id: int, eot_id: int, cache_dir: str | os.PathLike | None, tokenizer_key: str,
               progress: bool = True) -> IdfTable:
    """`compute_idf`, read from / written to `cache_dir/idf/<tokenizer>-<corpus sha256>.json` when a cache is given."""
    if cache_dir is None:
        return compute_idf(sentences, tokenize_ids, sot_id, eot_id, progress=progress)
    key = hashlib.sha256(tokenizer_key.encode("utf-8")).hexdigest()[:12]
    path = Path(cache_dir) / "idf" / f"{key}-{corpus_digest(sentences)}.json"
    if path.is_file():
        return IdfTable.load(path)
    table = compute_idf(sentences, tokenize_ids, sot_id, eot_id, progress=progress)
    table.save(path)
    return table
