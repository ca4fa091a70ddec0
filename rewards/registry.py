"""The reward registry: `@register_reward("name")` factories and `build_reward(spec, **context)`.

A factory is one function `factory(**context) -> reward`, where `reward(image_ids, captions, references)`
returns a float tensor `[B, k]`; `context` carries whatever the factories need (a scorer or backbone, an image
loader, the training references, ...); each factory reads the keys it knows and ignores the others.
A spec is one registered name or a weighted mix `"cider:1,pac-s++:0.5"`.
The built-in rewards (`pacs.rewards.cider`, `pacs.rewards.contrastive`, `pacs.rewards.guards`) register themselves the first time the registry is
used (any function below), so importing `rewards` stays cheap.
"""
from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

from pacs.metric.common.errors import InputError
from pacs.metric.common.suggest import known_hint
from pacs.rewards.base import Reward, RewardFn, WeightedReward
from pacs.rewards.mix import check_mix_normalisation
from pacs.rewards.resources import RewardResources

RewardFactory = Callable[..., RewardFn]
REWARDS: dict[str, RewardFactory] = {}
#: modules whose import registers the built-in rewards (imported on first use of the registry)
BUILTIN_MODULES = ("pacs.rewards.cider", "pacs.rewards.contrastive", "pacs.rewards.guards")


def load_builtin_rewards() -> dict[str, RewardFactory]:
    """Import the built-in reward modules (once; they register themselves) and return `REWARDS`."""
    for module in BUILTIN_MODULES:
        importlib.import_module(module)  # a no-op once imported (or while it is being imported)
    return REWARDS


def register_reward(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator registering `factory(**context) -> reward` under `name` (case-insensitive).

    A name already taken (a built-in one included) is a ValueError. Example (the factory receives the whole
    `build_reward` context as keyword arguments):

    >>> import torch
    >>> from pacs.rewards import build_reward, register_reward
    >>> @register_reward("doc-word-count")
    ... def word_count(**context):
    ...     def reward(image_ids, captions, references):
    ...         return torch.tensor([[float(len(c.split())) for c in row] for row in captions])
    ...     return reward
    >>> build_reward("doc-word-count")(["img1"], [["a dog", "a dog runs"]], [["a dog runs on grass"]])
    tensor([[2., 3.]])
    >>> register_reward("cider")(word_count)
    Traceback (most recent call last):
    ...
    ValueError: reward 'cider' is already registered (by cider_reward)
    """
    key = name.strip().lower()
    if not key or any(ch in key for ch in ",:"):
        raise ValueError(f"reward name {name!r} must be non-empty and contain no ',' or ':'")

    def decorate(factory: RewardFactory) -> RewardFactory:
        load_builtin_rewards()  # a user reward must not take a built-in's name
        if key in REWARDS:
            raise ValueError(f"reward {name!r} is already registered (by {REWARDS[key].__qualname__})")
        REWARDS[key] = factory
        return factory

    return decorate


def reward_names() -> list[str]:
    """The registered reward names, sorted.

    >>> from pacs.rewards import reward_names
    >>> reward_names()  # doctest: +ELLIPSIS
    ['cider', 'clip-s', ..., 'ref-pac-s++', 'rep-penalty']
    """
    return sorted(load_builtin_rewards())


def check_reward_list(specs: Sequence[str], key: str, flag: str | None = None) -> None:
    """InputError in one line when an item of the reward list `key` is a single weighted term (`pac-s++:0.5`).

    Such an item is a fragment of a mix that a list parser split at its commas (`rewards=[cider:1,pac-s++:0.5]`
    on the command line is two items), or a weight on a reward alone, which SCST's normalised advantages ignore:
    either way not the experiment asked for. The message shows the spelling that gives the mix (`flag`: a
    command-line option that takes one reward per use, e.g. `--reward`, instead of a `key=[...]` override).

    >>> from pacs.rewards.registry import check_reward_list
    >>> check_reward_list(["cider", "cider:1,pac-s++:0.5"], "rewards")  # names and mixes are fine
    >>> check_reward_list(["cider:1", "pac-s++:0.5"], "rewards")
    Traceback (most recent call last):
    ...
    pacs.metric.common.errors.InputError: rewards: 'cider:1', 'pac-s++:0.5' are single weighted terms, not rewards: \
a mix is one item, its terms joined by commas inside quotes: on the command line "rewards=['cider:1,pac-s++:0.5']", \
in YAML rewards: ["cider:1,pac-s++:0.5"]
    """
    fragments = [spec for spec in specs if isinstance(spec, str) and ":" in spec and "," not in spec]
    if len(fragments) > 1:
        mix = ",".join(part.strip() for part in fragments)
        spelling = f"{flag} '{mix}'" if flag else f"\"{key}=['{mix}']\", in YAML {key}: [\"{mix}\"]"
        raise InputError(f"{key}: {', '.join(repr(part) for part in fragments)} are single weighted terms, not "
                         f"rewards: a mix is one item, its terms joined by commas inside quotes: on the command "
                         f"line {spelling}")
    if fragments:
        name = fragments[0].partition(":")[0].strip()
        example = f"cider:1,{fragments[0].strip()}"
        spelling = f"{flag} '{example}'" if flag else f"\"{key}=['{example}']\""
        raise InputError(f"{key}: {fragments[0]!r} is a single weighted term, not a reward: a reward alone is its "
                         f"name ({name!r}); a mix is one item, its terms joined by commas inside quotes "
                         f"(on the command line {spelling})")


def parse_reward_spec(spec: str) -> list[tuple[str, float]]:
    """Split `"name"` or `"a:1,b:0.5"` into (lower-cased name, weight) pairs; bad syntax is an InputError.

    >>> from pacs.rewards import parse_reward_spec
    >>> parse_reward_spec("CIDEr:1, pac-s++:0.5")
    [('cider', 1.0), ('pac-s++', 0.5)]
    """
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
    if key not in load_builtin_rewards():
        raise InputError(f"unknown reward {name.strip()!r} in spec {spec!r} {known_hint(name, reward_names())}")
    return key


def build_reward(spec: str, **context: Any) -> Reward:
    """Build the reward named by `spec` ("cider", "pac-s++", "cider:1,pac-s++:0.5", ...) from `context`.

    The rewards of one mix share a `RewardResources` (scorers and image-embedding caches); pass
    `resources=` to share them with other rewards too. Example on a tiny random CLIP (use
    `checkpoint="PAC++_clip_ViT-B-32.pth"` or `backbone="ViT-B-32/openai"` for real rewards):

    >>> import torch
    >>> from PIL import Image
    >>> from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    >>> from pacs.rewards import build_reward
    >>> reward = build_reward("cider:1,clip-s:0.5",
    ...                       backbone=build_backbone_from_config(tiny_clip_config(), seed=0),
    ...                       image_paths={"img1": Image.new("RGB", (64, 64), "red")},  # or file paths
    ...                       train_references=[["a dog runs on the grass"], ["a man rides a horse"]])
    >>> values = reward(["img1"], [["a dog runs", "a red square"]], [["a dog runs on the grass"]])
    >>> values.shape  # [B images, k captions each]
    torch.Size([1, 2])
    >>> parts = reward.last_components
    >>> sorted(parts), torch.allclose(values, parts["cider"] + 0.5 * parts["clip-s"])
    (['cider', 'clip-s'], True)

    `mix_normalisation="normalize_then_sum"` makes `reward.group_rewards(...)` (the rewards a policy gradient
    uses; SCST's `scst.mix_normalisation`) normalise each component within the image's k captions before the
    weighting (GDPO / TRL's `multi_objective_aggregation="normalize_then_sum"`, `pacs.rewards.mix`); calling the
    reward still gives the weighted sum.
    """
    terms = parse_reward_spec(spec)
    normalisation = check_mix_normalisation(context.pop("mix_normalisation", "weighted_sum"))
    context.setdefault("resources", RewardResources())
    if len(terms) == 1 and ":" not in spec:
        name = terms[0][0]
        reward = Reward(name, REWARDS[name](**context))
    else:
        components = [(name, weight, Reward(name, REWARDS[name](**context))) for name, weight in terms]
        reward = WeightedReward(spec.strip(), components)
    reward.mix_normalisation = normalisation
    return reward
