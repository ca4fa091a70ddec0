"""pacs.rewards: a registry of SCST reward functions built on metric/ and eval/.

`build_reward("cider:1,pac-s++:0.5", **context)` returns a callable
`reward(image_ids, captions[B][k], references[B][*]) -> torch.FloatTensor[B, k]`; new rewards are one
function decorated with `@register_reward("name")`.

Every name is imported on first access (PEP 562), so `import pacs.rewards` loads neither torch nor a model; the
built-in rewards register themselves on first use of the registry (`pacs.rewards.registry.load_builtin_rewards`).
"""
from __future__ import annotations

import importlib
from typing import Any

#: the public API: name -> module defining it (each has a docstring example, run by tests/test_public_api.py)
_PUBLIC = {
    "build_reward": "pacs.rewards.registry",
    "register_reward": "pacs.rewards.registry",
    "reward_names": "pacs.rewards.registry",
    "parse_reward_spec": "pacs.rewards.registry",
}
#: also importable from the package root (kept for existing code)
_OTHERS = {
    "REWARDS": "pacs.rewards.registry",
    "Reward": "pacs.rewards.base",
    "WeightedReward": "pacs.rewards.base",
    "check_batch": "pacs.rewards.base",
    "ImageEmbeddingCache": "pacs.rewards.resources",
    "RewardResources": "pacs.rewards.resources",
}

__all__ = ["build_reward", "parse_reward_spec", "register_reward", "reward_names"]


def __getattr__(name: str) -> Any:
    """Import a root-level name on first access."""
    module = _PUBLIC.get(name) or _OTHERS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name == "REWARDS":
        value = importlib.import_module(module).load_builtin_rewards()  # the table with the built-ins in it
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Module attributes plus the lazily imported names."""
    return sorted(set(globals()) | set(_PUBLIC) | set(_OTHERS))
