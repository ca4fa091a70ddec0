"""The reference side of CIDEr-D, prepared once (`prepare_references`), and the scoring of candidates.

`RefState` holds, per chunk of reference sets, compact arrays: the sorted keys of the chunk's n-grams with
their idf, the reference vectors as (n-gram row, reference) groups with tf·idf weights, the reference norms
and lengths. Candidates are scored chunk by chunk against it (`score_candidates`): every lookup goes into the
arrays of one chunk (a `KeyTable` directory, then a search with sorted queries), so the time per candidate does
not grow with their number.
Candidate n-grams absent from their chunk take their document frequency from `RefState.lookup` (the fixed
table, or the n-grams held by two or more reference sets of the call).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pacs.eval.cider_tables import DocumentFrequency, chunk_bounds, document_counts
from pacs.eval.ngram_index import KeyTable, TokenArrays, Vocabulary, aggregate, ngram_levels, sort_with_index


@dataclass
class RefChunk:
    """Reference statistics of consecutive reference sets (chunk-local indices)."""

    first_set: int
    set_start: np.ndarray  # first reference of each set of the chunk, plus the end
    keys: np.ndarray  # sorted mixed keys of the chunk's distinct reference n-grams
    idf: np.ndarray  # ref_len - log(max(1, df)) of each key
    groups: np.ndarray  # sorted (key row << ref_bits) | reference: the entries of the reference vectors
    weights: np.ndarray  # tf * idf of each group entry
    norms: np.ndarray  # [references, n] vector norms per order
    lengths: np.ndarray  # pycocoevalcap's length (bigram count) of each reference
    ref_bits: int
    table: KeyTable  # lookups into `keys`

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays."""
        names = ("set_start", "keys", "idf", "groups", "weights", "norms", "lengths")
        return int(sum(getattr(self, name).nbytes for name in names) + self.table.directory.nbytes)


@dataclass
class RefState:
    """Prepared reference sets: chunks, the chunk of each set, ref_len and the document frequencies of others."""

    chunks: list[RefChunk]
    chunk_of_set: np.ndarray
    ref_len: float
    n: int
    lookup: Callable[[np.ndarray], np.ndarray]  # mixed keys -> document frequency (0 when unknown)
    extra_bytes: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays."""
        return int(sum(chunk.nbytes for chunk in self.chunks) + self.chunk_of_set.nbytes + self.extra_bytes)


def _table_lookup(keys: np.ndarray, values: np.ndarray) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    """A key -> value function over sorted keys (0 for absent keys) and the bytes it holds."""
    table = KeyTable(keys)

    def lookup(queries: np.ndarray) -> np.ndarray:
        rows = table.find(queries)
        out = np.zeros(len(queries))
        out[rows >= 0] = values[rows[rows >= 0]]
        return out

    return lookup, int(keys.nbytes + values.nbytes + table.directory.nbytes)


def prepare_references(sets: Sequence[Sequence[str]], multiplicity: np.ndarray | None, vocabulary: Vocabulary,
                       n: int, document_frequency: DocumentFrequency | None) -> RefState:
    """Statistics of unique reference sets; document frequencies from `document_frequency` or, when None, from
    the sets themselves, set s counting as `multiplicity[s]` documents (pycocoevalcap counts repeated entries)."""
    sizes = np.fromiter(map(len, sets), dtype=np.int64, count=len(sets))
    tokens = vocabulary.encode([ref for refs in sets for ref in refs], grow=True)
    offsets = tokens.offsets
    set_start = np.concatenate([[0], np.cumsum(sizes)])
    bounds = chunk_bounds(offsets[set_start[1:]] - offsets[set_start[:-1]])
    if document_frequency is None:
        ref_len = float(np.log(float(multiplicity.sum())))
    else:
        ref_len = document_frequency.log_num_documents
    partial, counted = [], []
    for first, last in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        chunk_tokens = tokens.span(set_start[first], set_start[last], offsets)
        levels = ngram_levels(chunk_tokens, n, len(vocabulary))
        bases = np.cumsum([0] + [len(level.keys) for level in levels])
        keys = np.concatenate([level.keys for level in levels])
        order = np.argsort(keys)
        row = np.empty(len(keys), dtype=np.int64)
        row[order] = np.arange(len(keys), dtype=np.int64)
        orders = np.repeat(np.arange(n, dtype=np.int8), np.diff(bases))[order]
        keys = keys[order]
        entry_row = np.concatenate([row[level.ids + base] for level, base in zip(levels, bases)])
        entry_ref = np.concatenate([level.sentences for level in levels])
        entry_tf = np.concatenate([level.counts for level in levels])
        references = int(set_start[last] - set_start[first])
        ref_bits = max(1, (references - 1).bit_length())
        groups, perm = sort_with_index((entry_row << ref_bits) | entry_ref)
        local_start = set_start[first:last + 1] - set_start[first]
        lengths = np.maximum(chunk_tokens.lengths - 1, 0).astype(np.int32)
        partial.append([first, local_start, keys, orders, groups, entry_tf[perm], lengths, ref_bits])
        if document_frequency is None:
            document = np.repeat(np.arange(last - first), sizes[first:last])
            _, counts = document_counts(levels, document, multiplicity[first:last].astype(np.float64))
            counted.append((keys, counts[order]))
        del levels, entry_row, entry_ref, entry_tf, groups, perm
    del tokens
    if document_frequency is None:
        per_chunk_df, extra_keys, extra_df = aggregate(counted, minimum=2.0)
        lookup, extra_bytes = _table_lookup(extra_keys, extra_df)
    else:
        per_chunk_df = [document_frequency.frequent_df(item[2]) for item in partial]
        lookup, extra_bytes = document_frequency.frequent_df, 0
    chunks = []
    for index, df in enumerate(per_chunk_df):
        first, local_start, keys, orders, groups, tf, lengths, ref_bits = partial[index]
        partial[index] = None  # freed as the chunk is finished
        idf = ref_len - np.log(np.maximum(1.0, df))
        rows = groups >> ref_bits
        weights = tf * idf[rows]
        refs = groups & ((1 << ref_bits) - 1)
        norms = np.sqrt(np.bincount(refs * n + orders[rows].astype(np.int64), weights=weights * weights,
                                    minlength=len(lengths) * n)).reshape(len(lengths), n)
        chunks.append(RefChunk(first, local_start, keys, idf, groups, weights, norms, lengths, ref_bits,
                               KeyTable(keys)))
    chunk_of_set = np.repeat(np.arange(len(bounds) - 1, dtype=np.int32), np.diff(bounds))
    return RefState(chunks, chunk_of_set, ref_len, n, lookup, extra_bytes)


def _score_chunk(chunk: RefChunk, state: RefState, tokens: TokenArrays, local_set: np.ndarray, known_words: int,
                 sigma: float) -> np.ndarray:
    """CIDEr-D of candidates (one sentence each) against their chunk-local sets."""
    n, ref_len = state.n, state.ref_len
    count = len(tokens.lengths)
    first_ref, end_ref = chunk.set_start[local_set], chunk.set_start[local_set + 1]
    sizes = end_ref - first_ref
    pair_start = np.cumsum(sizes) - sizes
    pairs = int(sizes.sum())
    norm2 = np.zeros(count * n)
    value = np.zeros(pairs * n)
    mask = (1 << chunk.ref_bits) - 1
    for order, level in enumerate(ngram_levels(tokens, n, known_words)):
        if len(level.ids) == 0:
            continue
        # row of each candidate n-gram among the chunk's reference n-grams (-1: in none of them)
        row = np.full(len(level.keys), -1, dtype=np.int64)
        known = np.flatnonzero(level.known)
        row[known] = chunk.table.find(level.keys[known])
        idf = np.full(len(level.keys), ref_len)  # df 0 or 1: log(max(1, df)) = 0
        inside = row >= 0
        idf[inside] = chunk.idf[row[inside]]
        outside = np.flatnonzero(level.known & ~inside)
        if len(outside):
            idf[outside] = ref_len - np.log(np.maximum(1.0, state.lookup(level.keys[outside])))
        weight = level.counts * idf[level.ids]
        norm2 += np.bincount(level.sentences * n + order, weights=weight * weight, minlength=count * n)
        # join each candidate entry with the entries of the same n-gram in the references of its set
        matched = np.flatnonzero(row[level.ids] >= 0)
        if len(matched) == 0:
            continue
        owner = level.sentences[matched]
        base = row[level.ids[matched]] << chunk.ref_bits
        query, perm = sort_with_index(base + first_ref[owner])  # sorted queries: cache-friendly searches
        matched, owner, base = matched[perm], owner[perm], base[perm]
        low = np.searchsorted(chunk.groups, query)
        high = np.searchsorted(chunk.groups, base + end_ref[owner])  # end_ref may be 1 << ref_bits
        hits = high - low
        repeat = np.repeat(np.arange(len(matched)), hits)
        position = low[repeat] + np.arange(len(repeat)) - np.repeat(np.cumsum(hits) - hits, hits)
        ref_weight = chunk.weights[position]
        reference = chunk.groups[position] & mask
        cand = owner[repeat]
        pair = pair_start[cand] + reference - first_ref[cand]
        contribution = np.minimum(weight[matched[repeat]], ref_weight) * ref_weight
        value += np.bincount(pair * n + order, weights=contribution, minlength=pairs * n)
    cand_of_pair = np.repeat(np.arange(count), sizes)
    ref_of_pair = np.arange(pairs) - np.repeat(pair_start, sizes) + np.repeat(first_ref, sizes)
    value = value.reshape(pairs, n)
    denominator = np.sqrt(norm2).reshape(count, n)[cand_of_pair] * chunk.norms[ref_of_pair]
    nonzero = denominator != 0
    value = np.where(nonzero, value / np.where(nonzero, denominator, 1.0), value)
    delta = (np.maximum(tokens.lengths - 1, 0)[cand_of_pair] - chunk.lengths[ref_of_pair]).astype(np.float64)
    value = value * np.exp(-(delta ** 2) / (2 * sigma ** 2))[:, None]
    return np.bincount(cand_of_pair, weights=value.mean(axis=1), minlength=count) / sizes * 10.0


def score_candidates(state: RefState, candidates: Sequence[str], set_index: np.ndarray, vocabulary: Vocabulary,
                     sigma: float) -> np.ndarray:
    """Per-candidate CIDEr-D of `candidates[i]` against prepared set `set_index[i]` (pycocoevalcap scale)."""
    tokens = vocabulary.encode(candidates, grow=False)
    offsets = tokens.offsets
    chunk_of_candidate = state.chunk_of_set[set_index]
    order = np.argsort(chunk_of_candidate, kind="stable")
    bounds = np.searchsorted(chunk_of_candidate[order], np.arange(len(state.chunks) + 1))
    scores = np.zeros(len(candidates))
    for index, chunk in enumerate(state.chunks):
        members = order[bounds[index]:bounds[index + 1]]
        if len(members) == 0:
            continue
        # many candidates may share the chunk's sets: split them into groups of bounded size as well
        for group in np.split(members, chunk_bounds(tokens.lengths[members])[1:-1]):
            scores[group] = _score_chunk(chunk, state, tokens.take(group, offsets),
                                         set_index[group] - chunk.first_set, len(vocabulary), sigma)
    return scores
