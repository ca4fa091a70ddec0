"""Robustness suite after UMIC's negatives and the reward-hacking patterns of PAC-S++ (Fig. 6).

For each sampled image, its first caption is the original and the remaining captions are the references; every
perturbation of the original is scored against the same references (and image), and the suite reports the
share (×100) of pairs where the metric scores the original higher (a tie counts half).

Perturbations: `substitution` (30% of the nouns/verbs/adjectives replaced by words of the same part of speech
from the data's own vocabulary), `random` (a caption of another image), `hard-random` (a caption of one of the
3 images whose references are most similar by TF-IDF cosine), `repeat-remove` (30% of the words, each
repeated or removed 50/50), `shuffle` (word order permuted), `truncation` (cut right after a function word:
"... on the side of a"), `padding` (" in the background setting" appended).

Part of speech comes from the lemminflect lexicon (PyPI `lemminflect`, offline: it ships its word lists; a
word's tag is the first part of speech it lists when that is NOUN/VERB/ADJ, VERB for -ing forms that can be
verbs; words without those tags are never substituted). `--data`: a Flickr8k folder (`Flickr8k.token.txt`) or a references json `{image_id: [captions]}`.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pacs.eval.benchmarks import Benchmark, RunContext, accuracy_table, register_benchmark, resolve_images, score_unique
from pacs.eval.benchmarks.flickr8k import TOKEN_FILE, image_references, read_token_file
from pacs.eval.fluency import INCORRECT_END_WORDS
from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.common.json_input import read_json_file

PERTURBATIONS = ("substitution", "random", "hard-random", "repeat-remove", "shuffle", "truncation", "padding")
CONTENT_TAGS = ("NOUN", "VERB", "ADJ")
GENERIC_TAIL = "in the background setting"
_WORD = re.compile(r"[\w']+")


def content_tag(word: str) -> str | None:
    """NOUN / VERB / ADJ for a content word (lemminflect lexicon), None otherwise."""
    try:
        import lemminflect
    except ImportError:
        raise MissingResourceError("the robustness suite needs the part-of-speech lexicon of lemminflect: "
                                   "pip install lemminflect") from None
    lower = word.lower()
    if lower in INCORRECT_END_WORDS:
        return None
    tags = list(lemminflect.getAllLemmas(lower))
    if not tags or tags[0] not in CONTENT_TAGS:
        return None
    if lower.endswith("ing") and "VERB" in tags:
        return "VERB"  # captions use -ing forms as verbs ("a dog running")
    return tags[0]


def words(caption: str) -> list[str]:
    """Lower-cased words of a caption."""
    return _WORD.findall(caption.lower())


class Perturber:
    """The perturbations, sharing a seeded generator, a POS dictionary and a similarity index."""

    def __init__(self, originals: list[str], pools: list[list[str]], rng: np.random.Generator) -> None:
        self.rng = rng
        self.originals = originals
        self.pools = pools
        self._tags: dict[str, str | None] = {}
        self.by_tag: dict[str, list[str]] = {tag: [] for tag in CONTENT_TAGS}
        vocabulary = sorted({w for caps in pools for c in caps for w in words(c)})
        for word in vocabulary:
            tag = self.tag(word)
            if tag:
                self.by_tag[tag].append(word)
        self.similar = self._top_similar(pools, 3)

    def tag(self, word: str) -> str | None:
        """Cached content tag."""
        if word not in self._tags:
            self._tags[word] = content_tag(word)
        return self._tags[word]

    @staticmethod
    def _top_similar(pools: list[list[str]], k: int) -> np.ndarray:
        """Indices of the k most similar images (TF-IDF cosine of their captions), self excluded."""
        from scipy import sparse

        vocab: dict[str, int] = {}
        rows, cols = [], []
        for i, caps in enumerate(pools):
            for word in {w for c in caps for w in words(c)}:
                rows.append(i)
                cols.append(vocab.setdefault(word, len(vocab)))
        matrix = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(pools), max(len(vocab), 1)))
        idf = np.log(len(pools) / np.maximum(1, np.asarray((matrix > 0).sum(axis=0)).ravel()))
        matrix = matrix.multiply(idf).tocsr()
        norms = np.sqrt(np.asarray(matrix.multiply(matrix).sum(axis=1)).ravel())
        matrix = sparse.diags(1 / np.maximum(norms, 1e-12)) @ matrix
        similarity = (matrix @ matrix.T).toarray()
        np.fill_diagonal(similarity, -np.inf)
        return np.argsort(-similarity, axis=1)[:, :k]

    def substitution(self, index: int) -> str | None:
        """Replace 30% (at least one) of the content words by same-POS words from the vocabulary."""
        tokens = words(self.originals[index])
        slots = [i for i, w in enumerate(tokens) if self.tag(w)]
        if not slots:
            return None
        count = max(1, round(0.3 * len(slots)))
        for i in self.rng.choice(slots, size=count, replace=False):
            choices = [w for w in self.by_tag[self.tag(tokens[i])] if w != tokens[i]]
            if choices:
                tokens[i] = choices[self.rng.integers(len(choices))]
        return " ".join(tokens)

    def random(self, index: int) -> str | None:
        """A caption of another image."""
        other = (index + 1 + self.rng.integers(len(self.pools) - 1)) % len(self.pools)
        return self.originals[other]

    def hard_random(self, index: int) -> str | None:
        """A caption of one of the 3 most similar images."""
        other = int(self.similar[index][self.rng.integers(self.similar.shape[1])])
        return self.originals[other]

    def repeat_remove(self, index: int) -> str | None:
        """Sample 30% of the words (at least one); repeat or remove each, 50/50."""
        tokens = words(self.originals[index])
        if len(tokens) < 2:
            return None
        picked = set(self.rng.choice(len(tokens), size=max(1, round(0.3 * len(tokens))), replace=False).tolist())
        out = []
        for i, token in enumerate(tokens):
            if i in picked:
                out.extend([token, token] if self.rng.random() < 0.5 else [])
            else:
                out.append(token)
        return " ".join(out) if out else None

    def shuffle(self, index: int) -> str | None:
        """The words in a different random order."""
        tokens = words(self.originals[index])
        if len(set(tokens)) < 2:
            return None
        for _ in range(10):
            order = self.rng.permutation(len(tokens))
            shuffled = [tokens[i] for i in order]
            if shuffled != tokens:
                return " ".join(shuffled)
        return None

    def truncation(self, index: int) -> str | None:
        """Cut right after the last function word that is not already the final word."""
        tokens = words(self.originals[index])
        cut = [i for i, w in enumerate(tokens[:-1]) if w in INCORRECT_END_WORDS and i > 0]
        return " ".join(tokens[: cut[-1] + 1]) if cut else None

    def padding(self, index: int) -> str | None:
        """Append the generic tail " in the background setting"."""
        return " ".join(words(self.originals[index]) + GENERIC_TAIL.split())

    def get(self, name: str) -> Callable[[int], str | None]:
        """The perturbation function named `name`."""
        return getattr(self, name.replace("-", "_"))


def load_pools(data: Path) -> dict[str, list[str]]:
    """Captions by image from a Flickr8k folder or a `{image_id: [captions]}` json."""
    if data.is_dir():
        token = data / TOKEN_FILE
        if not token.is_file():
            raise InputError(f"{token} not found (data= is a Flickr8k folder or a references json)",
                             parameter="data")
        return image_references(read_token_file(token))
    raw = read_json_file(data, "references")
    if not isinstance(raw, dict):
        raise InputError(f"{data}: expected {{image_id: [captions]}}")
    for key, caps in raw.items():
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
            raise InputError(f"{data}: captions of image {key!r} must be a list of strings")
    return {str(k): v for k, v in raw.items()}


@dataclass
class RobustnessOptions:
    """Robustness options: how many images are sampled and which perturbations are applied."""

    num_images: int = field(default=500, metadata={"help": "robustness: images sampled (fixed seed)"})
    perturbations: str = field(default=",".join(PERTURBATIONS), metadata={
        "help": f"robustness: comma-separated subset of {','.join(PERTURBATIONS)}"})


@register_benchmark("robustness")
class Robustness(Benchmark):
    """Share of pairs where the metric prefers the original caption over each perturbation."""

    description = "robustness suite (accuracy of preferring the original over each perturbation)"
    options_class = RobustnessOptions

    def run(self, context: RunContext) -> dict[str, Any]:
        """Accuracy per perturbation and mean."""
        options = self.options_of(context)
        num_images = options.num_images
        chosen = [p.strip() for p in (options.perturbations or ",".join(PERTURBATIONS)).split(",") if p.strip()]
        for name in chosen:
            if name not in PERTURBATIONS:
                raise InputError(f"unknown perturbation {name!r} (known: {', '.join(PERTURBATIONS)})")
        pools = {k: v for k, v in load_pools(context.data).items() if len(v) >= 2}
        if len(pools) < 5:
            raise InputError(f"{context.data}: the robustness suite needs at least 5 images with 2+ captions")
        rng = np.random.default_rng(context.seed)
        keys = sorted(pools)
        keys = [keys[i] for i in sorted(rng.choice(len(keys), size=min(num_images, len(keys)), replace=False))]
        keep, paths = resolve_images(context, keys, keys)
        keys = [k for k, kept in zip(keys, keep) if kept]
        paths = [p for p, kept in zip(paths, keep) if kept]
        originals = [pools[k][0] for k in keys]
        references = [pools[k][1:] for k in keys]
        perturber = Perturber(originals, [pools[k] for k in keys], rng)
        original_rows, perturbed_rows, refs, images, categories = [], [], [], [], []
        for name in chosen:
            function = perturber.get(name)
            for i in range(len(keys)):
                perturbed = function(i)
                if perturbed is None:
                    context.count(f"skipped_{name}")
                    continue
                original_rows.append(" ".join(words(originals[i])))
                perturbed_rows.append(perturbed)
                refs.append(references[i])
                images.append(str(paths[i]))
                categories.append(name)
        needs = context.suite.needs_images
        scores = score_unique(context, original_rows + perturbed_rows, refs + refs,
                              (images + images) if needs else None)
        n = len(original_rows)
        return accuracy_table(context, {k: v[:n] for k, v in scores.items()}, {k: v[n:] for k, v in scores.items()},
                              np.ones(n, dtype=bool), np.array(categories), chosen)
