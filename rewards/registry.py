"""The reward registry: `@register_reward("name")` factories and `build_reward(spec, **context)`.

A factory is one function `factory(**context) -> reward`, where `reward(image_ids, captions, references)`
returns a float tensor `[B, k]`; `context` carries whatever the factories need (a scorer or backbone, an image
loader, the training references, ...); each factory reads the keys it knows and ignores the others.
A spec is one registered name or a weighted mix `"cider:1,pac-s++:0.5"`.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from metric.common.errors import InputError
from rewards.base import Reward, RewardFn, WeightedReward
from rewards.resources import RewardResources

RewardFactory = Callable[..., RewardFn]
REWARDS: dict[str, RewardFactory] = {}


def register_reward(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator registering `factory(**context) -> reward` under `name` (case-insensitive)."""
    key = name.strip().lower()
    if not key or any(ch in key for ch in ",:"):
        raise ValueError(f"reward name {name!r} must be non-empty and contain no ',' or ':'")

    def decorate(factory: RewardFactory) -> RewardFactory:
        if key in REWARDS:
            raise ValueError(f"reward {name!r} is already registered (by {REWARDS[key].__qualname__})")
        REWARDS[key] = factory
        return factory

    return decorate


def reward_names() -> list[str]:
    """The registered reward names, sorted."""
    return sorted(REWARDS)


def parse_reward_spec(spec: str) -> list[tuple[str, float]]:
    """Split `"name"` or `"a:1,b:0.5"` into (lower-cased name, weight) pairs; bad syntax is an InputError."""
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"empty reward spec {spec!r} (known rewards: {', '.join(reward_names())})")
    parts = [part.strip() for part in spec.split(",")]
    if len(parts) == 1 and ":" not in parts[0]:
        return [(_known_name(parts[0], spec), 1.0)]
    terms: list[tuple[str, float]] = []
    for part in parts:
        name, colon, weight_text = part.partition(":")
        if not part or not colon or not name.strip() or ":" in weight_text:
            raise InputError(f"reward spec {spec!r}: term {part!r} is not of the form name:weight "
                             f"(e.g. 'cider:1,pac-s++:0.5')")
        try:
            weight = float(weight_text)
        except ValueError:
            raise InputError(f"reward spec {spec!r}: weight {weight_text.strip()!r} of {name.strip()!r} "
                             f"is not a number") from None
        if not math.isfinite(weight):
            raise InputError(f"reward spec {spec!r}: weight of {name.strip()!r} must be finite")
        key = _known_name(name, spec)
        if key in (existing for existing, _ in terms):
            raise InputError(f"reward spec {spec!r}: {key!r} appears twice")
        terms.append((key, weight))
    return terms


def _known_name(name: str, spec: str) -> str:
    key = name.strip().lower()
    if key not in REWARDS:
        raise InputError(f"unknown reward {name.strip()!r} in spec {spec!r} (known: {', '.join(reward_names())})")
    return key


def build_reward(spec: str, **context: Any) -> Reward:
    """Build the reward named by `spec` ("cider", "pac-s++", "cider:1,pac-s++:0.5", ...) from `context`.

    The rewards of one mix share a `RewardResources` (scorers and image-embedding caches); pass
    `resources=` to share them with other rewards too.
    """
    terms = parse_reward_spec(spec)
    context.setdefault("resources", RewardResources())
    if len(terms) == 1 and ":" not in spec:
        name = terms[0][0]
        return Reward(name, REWARDS[name](**context))
    components = [(name, weight, Reward(name, REWARDS[name](**context))) for name, weight in terms]
    return WeightedReward(spec.strip(), components)
