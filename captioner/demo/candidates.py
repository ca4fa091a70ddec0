"""Candidate captions of varied quality for the metric-vs-judge correlation: a held-out reference and
corruptions of it (wrong colour, shape, size, relation; a dropped or an extra object; repetition; truncation)
plus a caption of another image."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from pacs.captioner.demo.world import COLOURS, SHAPE_WORDS, SIZE_WORDS, WorldItem

_SHAPE_OF = {word: shape for shape, words in SHAPE_WORDS.items() for word in words}
_SIZE_OF = {word: size for size, words in SIZE_WORDS.items() for word in words}
KINDS = ("reference", "colour-swap", "shape-swap", "size-swap", "drop-object", "extra-object", "relation-flip",
         "repetition", "truncated", "other-image")


def _replace_one(words: list[str], rng: np.random.Generator, options: Mapping[str, str],
                 pick: Callable[[str], str]) -> list[str] | None:
    positions = [i for i, w in enumerate(words) if w in options]
    if not positions:
        return None
    index = positions[int(rng.integers(len(positions)))]
    new = list(words)
    new[index] = pick(words[index])
    return new


def corrupt(kind: str, item: WorldItem, others: list[WorldItem], rng: np.random.Generator) -> str | None:
    """One candidate of `kind` for `item` (None when the kind does not apply to this caption)."""
    reference = item.references[0]
    words = reference.split()
    scene_shapes = {o.shape for o in item.scene.objects}
    absent_shapes = [s for s in SHAPE_WORDS if s not in scene_shapes]
    colours = list(COLOURS)
    if kind == "reference":
        return reference
    if kind == "colour-swap":
        new = _replace_one(words, rng, {c: c for c in colours},
                             lambda w: [c for c in colours if c != w][int(rng.integers(len(colours) - 1))])
    elif kind == "shape-swap":
        if not absent_shapes:
            return None
        new = _replace_one(words, rng, _SHAPE_OF, lambda w: absent_shapes[int(rng.integers(len(absent_shapes)))])
    elif kind == "size-swap":
        new = _replace_one(words, rng, _SIZE_OF, lambda w: "large" if _SIZE_OF[w] == "small" else "small")
    elif kind == "drop-object":
        if len(item.scene.objects) < 2:
            return None
        first = next(i for i, w in enumerate(words) if w in _SHAPE_OF)
        new = words[:first + 1]
    elif kind == "extra-object":
        if not absent_shapes:
            return None
        new = words + ["and", "a", colours[int(rng.integers(len(colours)))],
                       absent_shapes[int(rng.integers(len(absent_shapes)))]]
    elif kind == "relation-flip":
        flips = {"left": "right", "right": "left", "above": "below", "below": "above", "top": "bottom",
                 "bottom": "top"}
        new = _replace_one(words, rng, flips, lambda w: flips[w])
    elif kind == "repetition":
        new = words + words[-3:]
    elif kind == "truncated":
        new = words[:-1] if len(words) > 2 else None
    elif kind == "other-image":
        other = others[int(rng.integers(len(others)))]
        return other.references[int(rng.integers(len(other.references)))]
    else:
        raise ValueError(f"unknown candidate kind {kind!r}")
    return " ".join(new) if new else None


def candidates_for(item: WorldItem, others: list[WorldItem], rng: np.random.Generator,
                   count: int) -> list[tuple[str, str]]:
    """`count` (kind, caption) candidates: the held-out reference and random applicable corruptions."""
    chosen = [("reference", item.references[0])]
    for kind in rng.permutation(KINDS[1:]):
        if len(chosen) >= count:
            break
        caption = corrupt(str(kind), item, others, rng)
        if caption is not None and caption != item.references[0]:
            chosen.append((str(kind), caption))
    return chosen


LONG_KINDS = ("paragraph", "paragraph-late-error")
"""Multi-sentence candidates longer than the demo CLIP's text context: a correct paragraph, and the same
paragraph whose last sentence names a shape that is not in the image (an error only its end shows)."""
_POSITION_WORDS = {"left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom",
                   "middle": "in the middle"}


def paragraph(item: WorldItem, rng: np.random.Generator) -> str:
    """A correct multi-sentence description: the count, one sentence per object (attributes and position)."""
    from pacs.captioner.demo.world import NUMBER_WORDS

    objects = list(item.scene.objects)
    count = len(objects)
    opening = f"there {'is' if count == 1 else 'are'} {NUMBER_WORDS[count]} {'shape' if count == 1 else 'shapes'}"
    sentences = [opening]
    for index in rng.permutation(count):
        obj = objects[int(index)]
        size = SIZE_WORDS[obj.size][int(rng.integers(len(SIZE_WORDS[obj.size])))]
        shape = SHAPE_WORDS[obj.shape][int(rng.integers(len(SHAPE_WORDS[obj.shape])))]
        sentences.append(f"a {size} {obj.colour} {shape} is {_POSITION_WORDS[obj.position]}")
    sentences.append("the background is plain and dark")
    return " . ".join(sentences) + " ."


def late_error_paragraph(item: WorldItem, rng: np.random.Generator) -> str | None:
    """`paragraph` plus a last sentence naming a shape absent from the image (None if every shape is present)."""
    present = {o.shape for o in item.scene.objects}
    absent = [shape for shape in SHAPE_WORDS if shape not in present]
    if not absent:
        return None
    shape = absent[int(rng.integers(len(absent)))]
    colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
    return paragraph(item, rng) + f" there is also a {colour} {shape} next to them ."


def long_candidates_for(item: WorldItem, rng: np.random.Generator) -> list[tuple[str, str]]:
    """The long (kind, caption) candidates of `item`: a correct paragraph and, when possible, a late-error one."""
    chosen = [("paragraph", paragraph(item, rng))]
    late = late_error_paragraph(item, rng)
    if late is not None:
        chosen.append(("paragraph-late-error", late))
    return chosen
