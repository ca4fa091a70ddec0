"""The demo's oracle reward `judge`: the exact judge's score of every sampled caption against its image's scene.

SCST with it (`scst.rewards: [..., judge]`, the row `scst judge`) shows what the SCST machinery reaches when the
reward is right; every learned reward's change of judge accuracy is also given as a share of its gain. It is
registered in the reward registry when `pacs.captioner.demo` is imported; `build_reward("judge", scenes=...)` needs
the world's scenes (`DemoData.scenes()`): the demo's, or a recipe's on data set `demo-world`
(`pacs.captioner.demo.world_source`).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pacs.captioner.demo.judge import judge_caption
from pacs.captioner.demo.world import Scene
from pacs.metric.common.errors import InputError
from pacs.rewards.registry import load_builtin_rewards, register_reward

NAME = "judge"


def judge_reward(scenes: Mapping[str, Scene] | None = None, **_: Any) -> Any:
    """The reward factory: `reward(image_ids, captions, references) -> [B, k]` judge scores in [0, 1]."""
    if not scenes:
        raise InputError("reward 'judge' is the demo world's exact judge: it needs the world's scenes (the embedded "
                         "demo, `pacs train` with a `demo:` config, or a recipe whose data set is demo-world)")

    def reward(image_ids: list[str], captions: list[list[str]], references: list[list[str]]) -> torch.Tensor:
        missing = [image_id for image_id in image_ids if image_id not in scenes]
        if missing:
            raise InputError(f"reward 'judge': image {missing[0]!r} has no scene in the demo world")
        return torch.tensor([[judge_caption(caption, scenes[image_id]).score for caption in row]
                             for image_id, row in zip(image_ids, captions)], dtype=torch.float32)

    return reward


def register() -> None:
    """Register `judge` in the reward registry (once; a no-op when it is there)."""
    if NAME not in load_builtin_rewards():
        register_reward(NAME)(judge_reward)


register()
