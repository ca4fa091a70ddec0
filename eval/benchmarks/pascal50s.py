"""Pascal-50S (Vedantam et al. 2015): which of two captions is closer to the consensus of 48-50 references.

Input (`--data`): a folder with `pair_pascal.mat` (`new_input` name/sent1/sent2, `result` the human
judgments of each pair as +1 = sent1 / -1 = sent2, `category` 1-4 = HC HI HM MM; `new_data` only codes the
source of each sentence) and `pascal50S.mat` (`refs` image/sent), read with
scipy.io.loadmat. Protocol (PAC-S §4.3): the caption most humans preferred is correct, a human tie is labelled
at random (fixed seed); reference-based metrics get 5 references sampled from the available ones, accuracy
averaged over 5 draws (fixed seed); a metric tie counts half; `mean` is the mean of the four categories.

When the folder also holds `consensus_pascal.mat` (the published 48-judgment consensus), it supplies both the
labels and the references: its variable `triplets` has 48 rows per pair, in `pair_pascal.mat` order, each row
(reference sentence A, candidate B, candidate C, winner 1 = B / 2 = C). A pair's references are its 48 rows' A
sentences and its label is the candidate the majority of its rows chose (B and C are matched to `sent1` / `sent2`
by text, in either order); `pascal50S.mat` is then not needed.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pacs.eval.benchmarks import (
    Benchmark,
    RunContext,
    accuracy_table,
    note_truncation,
    register_benchmark,
    resolve_images,
)
from pacs.eval.registry import get_metric
from pacs.metric.common.errors import InputError

log = logging.getLogger(__name__)

CATEGORIES = ("HC", "HI", "HM", "MM")
CONSENSUS_FILE = "consensus_pascal.mat"
CONSENSUS_JUDGMENTS = 48


def _text(value: Any) -> str:
    """A MATLAB string cell (nested object arrays) as a Python string."""
    while isinstance(value, np.ndarray):
        if value.size == 0:
            return ""
        value = value.flat[0]
    return " ".join(str(value).split())


def _load_mat(path: Path) -> dict[str, Any]:
    """loadmat with a clear error naming the file."""
    if not path.is_file():
        raise InputError(f"{path} not found (data= must hold pair_pascal.mat and pascal50S.mat)", parameter="data")
    from scipy import io as sio

    try:
        return sio.loadmat(str(path))
    except Exception as error:  # noqa: BLE001 - scipy.io.loadmat raises many unrelated types for corrupt files
        raise InputError(f"{path}: not a readable MATLAB file ({error})") from None


def _match_key(text: str) -> str:
    """How candidates are matched between the two files: case and spacing ignored."""
    return " ".join(text.lower().split())


def _triplet_rows(value: np.ndarray, path: Path) -> list[list[Any]]:
    """The rows of `triplets`: a struct array of 4 fields, an N x 4 cell array, or N cells of 4 cells each."""
    if value.dtype.names:
        if len(value.dtype.names) != 4:
            raise InputError(f"{path}: 'triplets' has fields {list(value.dtype.names)} (4 expected: reference, "
                             "candidate B, candidate C, winner)")
        return [[entry[name] for name in value.dtype.names] for entry in value.ravel()]
    if value.ndim == 2 and value.shape[1] == 4 and value.dtype == object and value.shape[0] != 1:
        return [list(row) for row in value]
    rows = [np.asarray(entry, dtype=object).ravel() for entry in value.ravel()]
    for index, row in enumerate(rows):
        if row.size != 4:
            raise InputError(f"{path}: triplets row {index} has {row.size} cells (4 expected: reference, "
                             "candidate B, candidate C, winner)")
    return [list(row) for row in rows]


def _winner(value: Any, path: Path, row: int) -> int:
    """The winner cell of a triplet row: 1 (candidate B) or 2 (candidate C)."""
    flat = np.asarray(value).ravel()
    try:
        winner = float(flat[0]) if flat.size == 1 else float("nan")
    except (TypeError, ValueError):
        winner = float("nan")
    if winner not in (1.0, 2.0):
        raise InputError(f"{path}: triplets row {row} has winner {flat.tolist()} (1 or 2 expected)")
    return int(winner)


def load_consensus(path: Path, sent1: list[str], sent2: list[str]) -> tuple[list[list[str]], np.ndarray]:
    """The 48 references of each pair and its consensus votes `[n_pairs, 2]` (for sent1, sent2).

    Rows `48 i .. 48 i + 47` of `triplets` belong to pair `i` of `pair_pascal.mat`; the winner of each row is
    counted for the pair sentence it names. A row whose winner is neither pair sentence is an error naming it.
    """
    mat = _load_mat(path)
    if "triplets" not in mat:
        raise InputError(f"{path}: variable 'triplets' missing")
    rows = _triplet_rows(np.asarray(mat["triplets"]), path)
    if len(rows) != CONSENSUS_JUDGMENTS * len(sent1):
        raise InputError(f"{path}: {len(rows)} triplets for {len(sent1)} pairs of pair_pascal.mat "
                         f"({CONSENSUS_JUDGMENTS} per pair expected)")
    references: list[list[str]] = []
    votes = np.zeros((len(sent1), 2))
    for pair in range(len(sent1)):
        first, second = _match_key(sent1[pair]), _match_key(sent2[pair])
        refs = []
        for row in range(pair * CONSENSUS_JUDGMENTS, (pair + 1) * CONSENSUS_JUDGMENTS):
            reference, cand_b, cand_c, winner = rows[row]
            refs.append(_text(reference))
            chosen = _match_key(_text(cand_b if _winner(winner, path, row) == 1 else cand_c))
            if chosen == first:
                votes[pair, 0] += 1
            elif chosen == second:
                votes[pair, 1] += 1
            else:
                raise InputError(f"{path}: triplets row {row} (pair {pair}) chose {chosen!r}, which is neither "
                                 f"sentence of the pair ({sent1[pair]!r} / {sent2[pair]!r})")
        if not all(refs):
            raise InputError(f"{path}: pair {pair} has an empty reference sentence")
        references.append(refs)
    return references, votes


def load_pascal50s(folder: Path) -> dict[str, Any]:
    """Pairs (image, sent1, sent2, votes, category) and their references: from `consensus_pascal.mat` when present
    (`pair_references`, 48 per pair, and consensus votes), else `pascal50S.mat` by image and the `result` votes."""
    pairs = _load_mat(folder / "pair_pascal.mat")
    consensus = folder / CONSENSUS_FILE
    for key in ("new_input", "result", "category"):
        if key not in pairs:
            raise InputError(f"{folder / 'pair_pascal.mat'}: variable {key!r} missing")
    entries = pairs["new_input"].ravel()
    categories = np.asarray(pairs["category"]).ravel().astype(int)
    judgments = pairs["result"].ravel()
    if not (len(entries) == len(judgments) == len(categories)):
        raise InputError(f"{folder / 'pair_pascal.mat'}: new_input, result and category differ in length")
    votes = np.zeros((len(judgments), 2))
    for index, entry in enumerate(judgments):
        values = np.asarray(entry["result"] if entry.dtype.names else entry).ravel().astype(float)
        if values.size == 0 or not np.isin(values, (1.0, -1.0)).all():
            raise InputError(f"{folder / 'pair_pascal.mat'}: pair {index} has judgments {values.tolist()} "
                             "(+1 / -1 expected)")
        votes[index] = (values == 1).sum(), (values == -1).sum()
    bad = np.flatnonzero((categories < 1) | (categories > 4))
    if len(bad):
        raise InputError(f"{folder / 'pair_pascal.mat'}: pair {bad[0]} has category {categories[bad[0]]} (1-4 expected)")
    images = [_text(e["name"]) for e in entries]
    sent1, sent2 = [_text(e["sent1"]) for e in entries], [_text(e["sent2"]) for e in entries]
    data = {"images": images, "sent1": sent1, "sent2": sent2, "votes": votes,
            "categories": np.array([CATEGORIES[c - 1] for c in categories]), "references": {},
            "pair_references": None, "labels": "pair_pascal.mat"}
    if consensus.is_file():
        data["pair_references"], data["votes"] = load_consensus(consensus, sent1, sent2)
        data["labels"] = CONSENSUS_FILE
        log.info("Pascal-50S: labels and references from %s (%d judgments per pair)", consensus, CONSENSUS_JUDGMENTS)
        return data
    refs_mat = _load_mat(folder / "pascal50S.mat")
    if "refs" not in refs_mat:
        raise InputError(f"{folder / 'pascal50S.mat'}: variable 'refs' missing")
    references: dict[str, list[str]] = {}
    for entry in refs_mat["refs"].ravel():
        references[_text(entry["image"])] = [s for s in (_text(x) for x in np.asarray(entry["sent"]).ravel()) if s]
    for index, image in enumerate(images):
        if image not in references or not references[image]:
            raise InputError(f"{folder / 'pair_pascal.mat'}: pair {index} image {image!r} has no references in "
                             "pascal50S.mat")
    data["references"] = references
    return data


@dataclass
class Pascal50SOptions:
    """Pascal-50S options (defaults 5 and 5, as in PAC-S)."""

    num_refs: int = field(default=5, metadata={"help": "Pascal-50S: references sampled per pair"})
    draws: int = field(default=5, metadata={"help": "Pascal-50S: reference draws averaged"})


@register_benchmark("pascal50s")
class Pascal50S(Benchmark):
    """Pascal-50S pairwise accuracy per HC/HI/HM/MM and mean."""

    description = "Pascal-50S (accuracy per HC/HI/HM/MM; 5 refs sampled, 5 draws)"
    options_class = Pascal50SOptions

    def run(self, context: RunContext) -> dict[str, Any]:
        """Accuracy of every metric, averaged over reference draws."""
        data = load_pascal50s(context.data)
        options = self.options_of(context)
        num_refs, draws = options.num_refs, options.draws
        if num_refs < 1 or draws < 1:
            raise InputError("num_refs= and draws= must be >= 1", parameter=("num_refs", "draws"))
        rng = np.random.default_rng(context.seed)
        votes = data["votes"]
        context.notes["labels"] = data["labels"]
        ties = votes[:, 0] == votes[:, 1]
        context.count("human_ties_broken_at_random", int(ties.sum()))
        first_preferred = np.where(ties, rng.random(len(votes)) < 0.5, votes[:, 0] > votes[:, 1])
        keep, paths = resolve_images(context, data["images"])
        index = np.flatnonzero(keep)
        images = [str(paths[i]) for i in index] if context.suite.needs_images else None
        sent1 = [data["sent1"][i] for i in index]
        sent2 = [data["sent2"][i] for i in index]
        ref_based = [m for m in context.metrics if get_metric(m).reference_based]
        sums: dict[str, list[dict[str, Any]]] = {name: [] for name in context.metrics}
        for draw in range(draws):
            refs = []
            for i in index:
                pool = (data["pair_references"][i] if data["pair_references"] is not None
                        else data["references"][data["images"][i]])
                chosen = rng.choice(len(pool), size=min(num_refs, len(pool)), replace=False)
                refs.append([pool[j] for j in sorted(chosen)])
            if draw > 0 and not ref_based:
                break  # reference-free metrics do not depend on the draw
            scores = context.suite.score(sent1 + sent2, refs + refs, (images + images) if images else None)
            note_truncation(context)
            score_a = {name: values[: len(index)] for name, values in scores.items()}
            score_b = {name: values[len(index):] for name, values in scores.items()}
            table = accuracy_table(context, score_a, score_b, first_preferred[index], data["categories"][index],
                                   CATEGORIES)
            for name in context.metrics:
                if draw == 0 or name in ref_based:
                    sums[name].append(table[name])
        result: dict[str, Any] = {}
        for name, tables in sums.items():
            if "unavailable" in tables[0]:
                result[name] = tables[0]
                continue
            row = {key: float(np.mean([t[key] for t in tables])) for key in (*CATEGORIES, "mean") if key in tables[0]}
            row["n"] = tables[0]["n"]
            row["draws"] = len(tables)
            for extra in ("mean_ci", "p_value_vs_best"):
                if extra in tables[0]:
                    row[extra] = tables[0][extra]
            result[name] = row
        return result
