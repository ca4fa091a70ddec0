"""The exact judge of the demo world: scores any caption against a scene's ground truth.

A caption is parsed into object mentions (a shape word with the colour/size words before it, or after
"that is"), absolute positions ("on the left"), relations between consecutive mentions ("to the left of",
"above", ...) and stated counts ("two shapes"). Mentions are matched to the scene's objects by shape
(shapes are distinct within a scene). The score is the F1 of correct mentions against the scene's objects,
halved for every further error (wrong relation, wrong count, repetition, dangling attribute).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from pacs.captioner.demo.world import COLOURS, NUMBER_WORDS, SHAPE_WORDS, SIZE_WORDS, Scene

_COLOUR_OF = {c: c for c in COLOURS}
_SIZE_OF = {word: size for size, words in SIZE_WORDS.items() for word in words}
_SHAPE_OF = {word: shape for shape, words in SHAPE_WORDS.items() for word in words}
_COUNT_OF = {word: n for n, word in NUMBER_WORDS.items()}
_POSITION_PHRASES = {("on", "the", "left"): "left", ("on", "the", "right"): "right", ("at", "the", "top"): "top",
                     ("at", "the", "bottom"): "bottom", ("in", "the", "middle"): "middle"}
VERDICTS = ("correct", "incomplete", "wrong")
# a caption that stops on one of these words was cut off ("a red circle on the")
_DANGLING_ENDS = frozenset({"a", "an", "the", "of", "on", "at", "in", "to", "and", "that", "is", "which", "next"})


@dataclass
class Mention:
    """One object mention parsed from a caption."""

    shape: str
    colours: list[str] = field(default_factory=list)
    sizes: list[str] = field(default_factory=list)
    positions: list[str] = field(default_factory=list)


@dataclass
class Judgement:
    """The judge's verdict on one caption."""

    score: float
    verdict: str
    correct: int = 0
    wrong_attributes: int = 0
    hallucinated: int = 0
    missed: int = 0
    relations_correct: int = 0
    relations_wrong: int = 0
    count_errors: int = 0
    repetitions: int = 0
    dangling: int = 0

    @property
    def is_correct(self) -> bool:
        """True when every object is mentioned correctly and nothing is wrong or repeated."""
        return self.verdict == "correct"


def tokenize(caption: str) -> list[str]:
    """Lower-cased word tokens of a caption (punctuation dropped)."""
    return re.findall(r"[a-z]+", caption.lower())


@dataclass
class _Parse:
    """The judge's parse of one caption, with the token index of every mention and dangling word."""

    tokens: list[str]
    mentions: list[Mention] = field(default_factory=list)
    mention_tokens: list[int] = field(default_factory=list)  # index of each mention's shape word
    relations: list[tuple[int, str, int]] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    repeats: int = 0
    dangling_tokens: list[int] = field(default_factory=list)  # attribute words without a shape, a cut-off end


def _parse(caption: str) -> _Parse:
    tokens = tokenize(caption)
    parse = _Parse(tokens)
    mentions, relations = parse.mentions, parse.relations
    pending_colours: list[str] = []
    pending_sizes: list[str] = []
    pending_indices: list[int] = []
    pending_relation: str | None = None
    trailing = False  # after "that is" / "which is": attributes belong to the previous mention
    parse.repeats = sum(1 for a, b in pairwise(tokens) if a == b)
    for i, token in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token in _COLOUR_OF or token in _SIZE_OF:
            if trailing and mentions:
                target = mentions[-1].colours if token in _COLOUR_OF else mentions[-1].sizes
            else:
                target = pending_colours if token in _COLOUR_OF else pending_sizes
                pending_indices.append(i)
            target.append(_COLOUR_OF.get(token) or _SIZE_OF[token])
        elif token in _SHAPE_OF:
            mentions.append(Mention(_SHAPE_OF[token], pending_colours, pending_sizes))
            parse.mention_tokens.append(i)
            pending_colours, pending_sizes, pending_indices, trailing = [], [], [], False
            if pending_relation is not None and len(mentions) >= 2:
                relations.append((len(mentions) - 2, pending_relation, len(mentions) - 1))
            pending_relation = None
        elif token in ("that", "which") and nxt == "is":
            trailing = True
        elif token in ("left", "right") and nxt == "of":
            pending_relation, trailing = f"{token} of", False
        elif token in ("above", "below", "under"):
            pending_relation, trailing = ("below" if token == "under" else token), False
        elif (token in ("left", "right", "top", "bottom", "middle")
              and tuple(tokens[max(0, i - 2):i + 1]) in _POSITION_PHRASES):
            if mentions:
                mentions[-1].positions.append(_POSITION_PHRASES[tuple(tokens[i - 2:i + 1])])
        elif token in _COUNT_OF and nxt in ("shapes", "objects", "shape", "object"):
            parse.counts.append(_COUNT_OF[token])
        elif token == "and":
            trailing = False
    parse.dangling_tokens = list(pending_indices)
    if tokens and tokens[-1] in _DANGLING_ENDS:
        parse.dangling_tokens.append(len(tokens) - 1)
    return parse


def parse_caption(caption: str) -> tuple[list[Mention], list[tuple[int, str, int]], list[int], int, int]:
    """(mentions, relations (i, predicate, j), stated counts, immediate word repeats, dangling attributes)."""
    parse = _parse(caption)
    return parse.mentions, parse.relations, parse.counts, parse.repeats, len(parse.dangling_tokens)


def highlight_spans(caption: str, scene: Scene) -> list[tuple[int, int, str]]:
    """Character spans `(start, end, kind)` of the words the judge faults: `absent` (a shape not in `scene`) and
    `dangling` (attribute words left without a shape, a cut-off last word), from the judge's own parse."""
    parse = _parse(caption)
    present = {o.shape for o in scene.objects}
    kinds = {index: "absent" for index, mention in zip(parse.mention_tokens, parse.mentions)
             if mention.shape not in present}
    kinds.update({index: "dangling" for index in parse.dangling_tokens})
    words = list(re.finditer(r"[a-z]+", caption.lower()))
    return [(words[i].start(), words[i].end(), kind) for i, kind in sorted(kinds.items())]


def _holds(scene: Scene, subject: int, predicate: str, obj: int) -> bool:
    a, b = scene.objects[subject], scene.objects[obj]
    return {"left of": a.column < b.column, "right of": a.column > b.column,
            "above": a.row < b.row, "below": a.row > b.row}[predicate]


def judge_caption(caption: str, scene: Scene) -> Judgement:
    """Score `caption` against `scene`: F1 of correct mentions, halved per relation/count/repetition error."""
    mentions, relations, counts, repeats, dangling = parse_caption(caption)
    shape_index = {o.shape: k for k, o in enumerate(scene.objects)}
    result = Judgement(score=0.0, verdict="wrong", dangling=dangling)
    result.repetitions = repeats
    matched: dict[int, int] = {}  # mention index -> object index (first mention of each object only)
    seen_objects: set[int] = set()
    for m_index, mention in enumerate(mentions):
        obj_index = shape_index.get(mention.shape)
        if obj_index is None:
            result.hallucinated += 1
            continue
        if obj_index in seen_objects:
            result.repetitions += 1
            continue
        seen_objects.add(obj_index)
        matched[m_index] = obj_index
        obj = scene.objects[obj_index]
        result.repetitions += ((len(mention.colours) - len(set(mention.colours))) + (len(mention.sizes) - len(set(mention.sizes)))
                               + (len(mention.positions) - len(set(mention.positions))))
        wrong = (any(c != obj.colour for c in mention.colours) or any(s != obj.size for s in mention.sizes)
                 or any(p != obj.position for p in mention.positions))
        if wrong:
            result.wrong_attributes += 1
        else:
            result.correct += 1
    for subject, predicate, obj in relations:
        if subject in matched and obj in matched:
            if _holds(scene, matched[subject], predicate, matched[obj]):
                result.relations_correct += 1
            else:
                result.relations_wrong += 1
    result.count_errors = sum(1 for c in counts if c != len(scene.objects))
    n_mentions = result.correct + result.wrong_attributes + result.hallucinated
    result.missed = len(scene.objects) - result.correct
    if n_mentions and result.correct:
        precision = result.correct / n_mentions
        recall = result.correct / len(scene.objects)
        errors = result.relations_wrong + result.count_errors + result.repetitions + result.dangling
        result.score = 2 * precision * recall / (precision + recall) * 0.5**errors
        clean = precision == 1.0 and errors == 0
        result.verdict = ("correct" if recall == 1.0 else "incomplete") if clean else "wrong"
    return result


def judge_accuracy(captions: list[str], scenes: list[Scene]) -> float:
    """Percentage of captions the judge finds fully correct."""
    if not captions:
        return 0.0
    return 100.0 * sum(judge_caption(c, s).is_correct for c, s in zip(captions, scenes)) / len(captions)


def judge_values(captions: Sequence[str], scenes: Sequence[Scene]) -> tuple[dict[str, np.ndarray], list[Judgement]]:
    """Per-caption Judge-acc (100: correct), Judge (100 x score) and Halluc. (100: an absent shape named), and the
    judgements (`judge_caption`); the columns of `pacs.eval.columns.JUDGE_COLUMNS`."""
    judgements = [judge_caption(caption, scene) for caption, scene in zip(captions, scenes)]
    values = {"Judge-acc": 100.0 * np.asarray([j.is_correct for j in judgements], dtype=float),
              "Judge": 100.0 * np.asarray([j.score for j in judgements], dtype=float),
              "Halluc.": 100.0 * np.asarray([j.hallucinated > 0 for j in judgements], dtype=float)}
    return values, judgements
