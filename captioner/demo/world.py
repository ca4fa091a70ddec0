"""The procedural demo world: scenes of one to three shapes, their renderings, captions and positives.

Every scene is drawn on a 3x3 grid of cells (one object per cell), so each object has an exact position
("on the left", "at the top", ...) and every pair of objects an exact relation ("to the left of", "above").
Everything is deterministic from `(seed, split, index)`.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated

import numpy as np
from annotated_types import Interval, Le
from PIL import Image, ImageDraw

from pacs.metric.common.config import Fraction, NonNegativeFloat, PositiveInt, Probability, Seed

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 190, 60),
    "blue": (50, 80, 230),
    "yellow": (235, 220, 40),
    "purple": (150, 50, 200),
    "white": (245, 245, 245),
}
SIZES: tuple[str, ...] = ("small", "large")
SIZE_WORDS: dict[str, tuple[str, ...]] = {"small": ("small", "little", "tiny"), "large": ("large", "big")}
SHAPE_WORDS: dict[str, tuple[str, ...]] = {
    "circle": ("circle", "disc"),
    "square": ("square", "box"),
    "triangle": ("triangle",),
    "diamond": ("diamond",),
}
# relation predicate -> phrase used in captions
RELATION_PHRASES: dict[str, str] = {
    "left of": "to the left of",
    "right of": "to the right of",
    "above": "above",
    "below": "below",
}
INVERSE_RELATION: dict[str, str] = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
NUMBER_WORDS: dict[int, str] = {1: "one", 2: "two", 3: "three"}
WEB_DISTRACTORS: tuple[str, ...] = (
    "image", "stock", "photo", "clipart", "vector", "free", "hd", "wallpaper", "icon", "design",
    "background", "download", "illustration", "art", "graphic", "png", "cute", "simple",
)


@dataclass(frozen=True)
class SceneObject:
    """One shape: its kind, colour, size word, grid cell (column, row) and centre inside the image (0..1)."""

    shape: str
    colour: str
    size: str
    column: int
    row: int
    x: float
    y: float

    @property
    def position(self) -> str:
        """The absolute-position word of this object's cell: left, right, top, bottom or middle."""
        if self.column != 1:
            return "left" if self.column == 0 else "right"
        if self.row != 1:
            return "top" if self.row == 0 else "bottom"
        return "middle"


@dataclass(frozen=True)
class Style:
    """How a scene is drawn: background colour, pixel noise, small rotation of the shapes."""

    background: tuple[int, int, int] = (30, 30, 30)
    noise: float = 0.0
    rotation: float = 0.0


@dataclass(frozen=True)
class Scene:
    """A set of objects in distinct grid cells, plus the style they are drawn in."""

    objects: tuple[SceneObject, ...]
    style: Style = Style()

    def relation(self, subject: int, obj: int) -> str:
        """The exact relation of object `subject` to object `obj` (horizontal first, then vertical)."""
        a, b = self.objects[subject], self.objects[obj]
        if a.column != b.column:
            return "left of" if a.column < b.column else "right of"
        return "above" if a.row < b.row else "below"


@dataclass
class WorldConfig:
    """Knobs of the procedural world."""

    seed: Seed = 0
    image_size: Annotated[PositiveInt, Le(512)] = 32  # pixels a side (rendered 4x larger first)
    max_objects: Annotated[int, Interval(ge=1, le=3)] = 3  # counted in words: one, two, three (NUMBER_WORDS)
    n_references: PositiveInt = 5
    relation_prob: Probability = 0.5
    noise_max: NonNegativeFloat = 12.0
    web_distractor_prob: Fraction = 0.5  # another distractor while a draw falls below it: 1 would never stop
    web_noise_word_prob: Probability = 0.1


@dataclass
class WorldItem:
    """One image of the world: its id, scene, and clean reference captions."""

    image_id: str
    scene: Scene
    references: list[str] = field(default_factory=list)


def _rng(config: WorldConfig, split: str, index: int, salt: int = 0) -> np.random.Generator:
    split_code = sum(ord(c) * 131**i for i, c in enumerate(split)) % (2**31)
    return np.random.default_rng([config.seed, split_code, index, salt])


def _sample_style(rng: np.random.Generator, config: WorldConfig) -> Style:
    base = int(rng.integers(0, 70))
    tint = rng.integers(-12, 13, size=3)
    background = tuple(int(np.clip(base + t, 0, 255)) for t in tint)
    return Style(background=background, noise=float(rng.uniform(0, config.noise_max)),
                 rotation=float(rng.uniform(-15, 15)))


def _place(rng: np.random.Generator, column: int, row: int) -> tuple[float, float]:
    """Centre of an object inside its grid cell, jittered a little."""
    return ((column + 0.5 + rng.uniform(-0.12, 0.12)) / 3.0, (row + 0.5 + rng.uniform(-0.12, 0.12)) / 3.0)


def sample_scene(rng: np.random.Generator, config: WorldConfig) -> Scene:
    """Draw a random scene: 1..max_objects objects of distinct shapes in distinct cells."""
    n_objects = int(rng.integers(1, config.max_objects + 1))
    shapes = rng.choice(len(SHAPES), size=n_objects, replace=False)
    cells = rng.choice(9, size=n_objects, replace=False)
    colour_names = list(COLOURS)
    objects = []
    for shape_index, cell in zip(shapes, cells):
        column, row = int(cell) % 3, int(cell) // 3
        x, y = _place(rng, column, row)
        objects.append(SceneObject(shape=SHAPES[int(shape_index)], colour=colour_names[int(rng.integers(len(colour_names)))],
                                   size=SIZES[int(rng.integers(len(SIZES)))], column=column, row=row, x=x, y=y))
    return Scene(objects=tuple(objects), style=_sample_style(rng, config))


def relayout(scene: Scene, rng: np.random.Generator, config: WorldConfig) -> Scene:
    """The same scene (objects, attributes, cells, hence relations) with new jitter and a new style."""
    objects = tuple(dataclasses.replace(o, x=_place(rng, o.column, o.row)[0], y=_place(rng, o.column, o.row)[1])
                    for o in scene.objects)
    return Scene(objects=objects, style=_sample_style(rng, config))


def _polygon(shape: str, cx: float, cy: float, radius: float, rotation: float) -> list[tuple[float, float]]:
    if shape == "square":
        angles = np.array([45, 135, 225, 315], dtype=float)
    elif shape == "diamond":
        angles = np.array([0, 90, 180, 270], dtype=float)
        radius *= 1.2
    else:  # triangle, pointing up
        angles = np.array([270, 30, 150], dtype=float)
        radius *= 1.15
    angles = np.deg2rad(angles + rotation)
    return [(cx + radius * np.cos(a), cy + radius * np.sin(a)) for a in angles]


def render_scene(scene: Scene, image_size: int = 32, supersample: int = 4) -> Image.Image:
    """Draw `scene` as an RGB image of `image_size` pixels (anti-aliased by supersampling)."""
    big = image_size * supersample
    image = Image.new("RGB", (big, big), scene.style.background)
    draw = ImageDraw.Draw(image)
    for obj in scene.objects:
        radius = big * (0.10 if obj.size == "small" else 0.155)
        cx, cy = obj.x * big, obj.y * big
        colour = COLOURS[obj.colour]
        if obj.shape == "circle":
            draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
        else:
            draw.polygon(_polygon(obj.shape, cx, cy, radius, scene.style.rotation), fill=colour)
    image = image.resize((image_size, image_size), Image.Resampling.LANCZOS)
    if scene.style.noise > 0:
        seed = int.from_bytes(hashlib.sha256(repr(scene).encode()).digest()[:8], "little")
        noise = np.random.default_rng(seed).normal(0, scene.style.noise, size=(image_size, image_size, 3))
        pixels = np.clip(np.asarray(image, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels, "RGB")
    return image


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _noun(obj: SceneObject, rng: np.random.Generator, size: bool = True) -> str:
    words = []
    if size:
        words.append(_pick(rng, SIZE_WORDS[obj.size]))
    words += [obj.colour, _pick(rng, SHAPE_WORDS[obj.shape])]
    return " ".join(words)


def _position_phrase(obj: SceneObject) -> str:
    return {"left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom",
            "middle": "in the middle"}[obj.position]


def _templates(scene: Scene) -> list:
    """Caption templates for the scene; each is a function of a random generator."""
    objs = scene.objects
    n = len(objs)
    if n == 1:
        o = objs[0]
        return [
            lambda r: f"a {_noun(o, r)}",
            lambda r: f"a {_noun(o, r, size=bool(r.integers(2)))} {_position_phrase(o)}",
            lambda r: f"there is a {_noun(o, r)} {_position_phrase(o)}",
            lambda r: f"a picture of a {_noun(o, r)}",
            lambda r: f"a {_pick(r, SIZE_WORDS[o.size])} {_pick(r, SHAPE_WORDS[o.shape])} that is {o.colour}",
            lambda r: f"one shape : a {_noun(o, r)}",
        ]
    if n == 2:
        a, b = objs
        rel = scene.relation(0, 1)
        return [
            lambda r: f"a {_noun(a, r)} and a {_noun(b, r)}",
            lambda r: f"a {_noun(a, r)} {RELATION_PHRASES[rel]} a {_noun(b, r)}",
            lambda r: f"a {_noun(b, r)} {RELATION_PHRASES[INVERSE_RELATION[rel]]} a {_noun(a, r)}",
            lambda r: f"two shapes : a {_noun(a, r, False)} and a {_noun(b, r, False)}",
            lambda r: f"a {_noun(b, r)} next to a {_noun(a, r)}",
            lambda r: f"there is a {_noun(a, r)} and a {_noun(b, r)}",
        ]
    a, b, c = objs[:3]
    rel = scene.relation(0, 1)
    return [
        lambda r: f"a {_noun(a, r)} , a {_noun(b, r)} and a {_noun(c, r)}",
        lambda r: f"three shapes : a {_noun(c, r, False)} , a {_noun(a, r, False)} and a {_noun(b, r, False)}",
        lambda r: f"a {_noun(a, r)} {RELATION_PHRASES[rel]} a {_noun(b, r)} and a {_noun(c, r)}",
        lambda r: f"a {_noun(b, r)} , a {_noun(c, r)} and a {_noun(a, r)}",
        lambda r: f"there is a {_noun(c, r)} , a {_noun(b, r)} and a {_noun(a, r)}",
    ]


def reference_captions(scene: Scene, rng: np.random.Generator, n: int) -> list[str]:
    """`n` clean captions of `scene` from varied templates (distinct templates first, then repeats)."""
    templates = _templates(scene)
    order = list(rng.permutation(len(templates)))
    while len(order) < n:
        order += list(rng.permutation(len(templates)))
    return [templates[i](rng) for i in order[:n]]


def web_caption(scene: Scene, rng: np.random.Generator, config: WorldConfig) -> str:
    """A noisy web-style alt-text: partial, sometimes bag-of-words, with distractor words."""
    objs = list(scene.objects)
    keep = max(1, int(rng.integers(1, len(objs) + 1)))
    chosen = [objs[i] for i in sorted(rng.choice(len(objs), size=keep, replace=False))]
    words: list[str] = []
    for obj in chosen:
        parts = [obj.colour, _pick(rng, SHAPE_WORDS[obj.shape])]
        if rng.random() < 0.4:
            parts.insert(0, _pick(rng, SIZE_WORDS[obj.size]))
        if rng.random() < 0.2:
            parts = parts[-1:]  # shape only
        words += parts
    if rng.random() < config.web_noise_word_prob:  # a wrong attribute word: label noise of the web
        words.append(_pick(rng, list(COLOURS) + list(SHAPES)))
    if rng.random() < 0.5:
        words = [words[i] for i in rng.permutation(len(words))]  # bag of words
    while rng.random() < config.web_distractor_prob:
        position = int(rng.integers(0, len(words) + 1))
        words.insert(position, _pick(rng, WEB_DISTRACTORS))
    return " ".join(words)


class DemoWorld:
    """Deterministic access to the world's items, renderings, web captions and positives by (split, index)."""

    def __init__(self, config: WorldConfig | None = None) -> None:
        self.config = config or WorldConfig()

    def item(self, split: str, index: int) -> WorldItem:
        """The `index`-th image of `split`: id `<split>-<index>`, its scene and reference captions."""
        rng = _rng(self.config, split, index)
        scene = sample_scene(rng, self.config)
        references = reference_captions(scene, rng, self.config.n_references)
        return WorldItem(image_id=f"{split}-{index:06d}", scene=scene, references=references)

    def items(self, split: str, count: int) -> list[WorldItem]:
        """The first `count` items of `split`."""
        return [self.item(split, i) for i in range(count)]

    def render(self, item: WorldItem) -> Image.Image:
        """The image of `item`."""
        return render_scene(item.scene, self.config.image_size)

    def web_captions(self, item: WorldItem, count: int = 1) -> list[str]:
        """`count` noisy alt-text captions of `item` (deterministic)."""
        index = int(item.image_id.rsplit("-", 1)[1])
        rng = _rng(self.config, item.image_id.rsplit("-", 1)[0], index, salt=1)
        return [web_caption(item.scene, rng, self.config) for _ in range(count)]

    def positive(self, item: WorldItem, caption_index: int = 0) -> tuple[Image.Image, str]:
        """Synthetic positives for (image, reference `caption_index`): v' a re-rendering, t' another template."""
        index = int(item.image_id.rsplit("-", 1)[1])
        rng = _rng(self.config, item.image_id.rsplit("-", 1)[0], index, salt=2 + caption_index)
        image = render_scene(relayout(item.scene, rng, self.config), self.config.image_size)
        text = item.references[caption_index]
        for _ in range(10):  # another template's caption of the same scene
            candidate = reference_captions(item.scene, rng, 1)[0]
            if candidate != text:
                text = candidate
                break
        return image, text


_PTB_PUNCTUATION = frozenset(["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-",
                              "--", "...", ";"])
"""pycocoevalcap's PTBTokenizer drops these tokens (its `PUNCTUATIONS`)."""


def ptb_tokenize_world(captions: list[str]) -> list[str]:
    """pycocoevalcap's PTB tokenization for the demo world's captions, without Java: lower case, split on spaces,
    punctuation tokens dropped. The world's words are plain lower-case letters and its punctuation stands alone,
    so this equals Stanford's PTBTokenizer on every caption the world or a captioner trained on it writes
    (tests/demo/test_demo_world.py checks it against the Java tokenizer); it is not a general tokenizer."""
    return [" ".join(t for t in caption.lower().split() if t not in _PTB_PUNCTUATION) for caption in captions]
