"""Pascal-50S (Vedantam et al. 2015): which of two captions is closer to the consensus of 48-50 references.

Input (`--data`): a folder with `pair_pascal.mat` (`new_input` name/sent1/sent2, `result` the human
judgments of each pair as +1 = sent1 / -1 = sent2, `category` 1-4 = HC HI HM MM; `new_data` only codes the
source of each sentence) and `pascal50S.mat` (`refs` image/sent), read with
scipy.io.loadmat. Protocol (PAC-S §4.3): the caption most humans preferred is correct, a human tie is labelled
at random (fixed seed); reference-based metrics get 5 references sampled from the available ones, accuracy
averaged over 5 draws (fixed seed); a metric tie counts half; `mean` is the mean of the four categories.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import numpy as np
from scipy import io as sio

from eval.benchmarks import Benchmark, RunContext, accuracy_table, register_benchmark, resolve_images
from eval.registry import get_metric
from metric.common.errors import InputError

log = logging.getLogger(__name__)

CATEGORIES = ("HC", "HI", "HM", "MM")


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
        raise InputError(f"{path} not found (--data must hold pair_pascal.mat and pascal50S.mat)")
    try:
        return sio.loadmat(str(path))
    except Exception as error:  # scipy raises several types for corrupt files
        raise InputError(f"{path}: not a readable MATLAB file ({error})") from None


def load_pascal50s(folder: Path) -> dict[str, Any]:
    """Pairs (image, sent1, sent2, votes, category) and references by image."""
    pairs = _load_mat(folder / "pair_pascal.mat")
    refs_mat = _load_mat(folder / "pascal50S.mat")
    for key in ("new_input", "result", "category"):
        if key not in pairs:
            raise InputError(f"{folder / 'pair_pascal.mat'}: variable {key!r} missing")
    if "refs" not in refs_mat:
        raise InputError(f"{folder / 'pascal50S.mat'}: variable 'refs' missing")
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
    references: dict[str, list[str]] = {}
    for entry in refs_mat["refs"].ravel():
        references[_text(entry["image"])] = [s for s in (_text(x) for x in np.asarray(entry["sent"]).ravel()) if s]
    images = [_text(e["name"]) for e in entries]
    for index, image in enumerate(images):
        if image not in references or not references[image]:
            raise InputError(f"{folder / 'pair_pascal.mat'}: pair {index} image {image!r} has no references in "
                             "pascal50S.mat")
    return {"images": images, "sent1": [_text(e["sent1"]) for e in entries],
            "sent2": [_text(e["sent2"]) for e in entries], "votes": votes,
            "categories": np.array([CATEGORIES[c - 1] for c in categories]), "references": references}


@register_benchmark("pascal50s")
class Pascal50S(Benchmark):
    """Pascal-50S pairwise accuracy per HC/HI/HM/MM and mean."""

    description = "Pascal-50S (accuracy per HC/HI/HM/MM; 5 refs sampled, 5 draws)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """`--num-refs` and `--draws` (defaults 5 and 5, as in PAC-S)."""
        parser.add_argument("--num-refs", type=int, default=5, help="Pascal-50S: references sampled per pair")
        parser.add_argument("--draws", type=int, default=5, help="Pascal-50S: reference draws averaged")

    def run(self, context: RunContext) -> dict[str, Any]:
        """Accuracy of every metric, averaged over reference draws."""
        data = load_pascal50s(context.data)
        num_refs = getattr(context.args, "num_refs", 5) if context.args else 5
        draws = getattr(context.args, "draws", 5) if context.args else 5
        if num_refs < 1 or draws < 1:
            raise InputError("--num-refs and --draws must be >= 1")
        rng = np.random.default_rng(context.seed)
        votes = data["votes"]
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
                pool = data["references"][data["images"][i]]
                chosen = rng.choice(len(pool), size=min(num_refs, len(pool)), replace=False)
                refs.append([pool[j] for j in sorted(chosen)])
            if draw > 0 and not ref_based:
                break  # reference-free metrics do not depend on the draw
            scores = context.suite.score(sent1 + sent2, refs + refs, (images + images) if images else None)
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
