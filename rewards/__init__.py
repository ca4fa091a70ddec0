"""pacs.rewards: a registry of SCST reward functions built on metric/ and eval/.

`build_reward("cider:1,pac-s++:0.5", **context)` returns a callable
`reward(image_ids, captions[B][k], references[B][*]) -> torch.FloatTensor[B, k]`; new rewards are one
function decorated with `@register_reward("name")`.
"""
from rewards.base import Reward, WeightedReward, check_batch
from rewards.registry import REWARDS, build_reward, parse_reward_spec, register_reward, reward_names
from rewards.resources import ImageEmbeddingCache, RewardResources
from rewards import cider, contrastive  # noqa: F401,E402  (register the built-in rewards)

__all__ = ["REWARDS", "ImageEmbeddingCache", "Reward", "RewardResources", "WeightedReward", "build_reward",
           "check_batch", "parse_reward_spec", "register_reward", "reward_names"]
