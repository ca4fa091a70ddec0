"""The reward protocol: `reward(image_ids, captions[B][k], references[B][*]) -> FloatTensor[B, k]`."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from pacs.metric.common.errors import InputError
from pacs.rewards.mix import mixed_rewards

RewardFn = Callable[[list[str], list[list[str]], list[list[str]]], torch.Tensor]


def check_batch(image_ids: Sequence[str], captions: Sequence[Sequence[str]],
                references: Sequence[Sequence[str]]) -> int:
    """Validate one reward batch and return k (captions per image); InputError names the bad row."""
    if isinstance(image_ids, str) or isinstance(captions, str):
        raise InputError("image_ids and captions must be lists, not strings")
    if not (len(image_ids) == len(captions) == len(references)):
        raise InputError(f"reward batch: {len(image_ids)} image ids, {len(captions)} caption rows and "
                         f"{len(references)} reference rows; they must match")
    if not captions:
        return 0
    k = len(captions[0])
    for row, (image_id, samples) in enumerate(zip(image_ids, captions)):
        if isinstance(samples, str):
            raise InputError(f"reward batch: captions[{row}] (image {image_id!r}) is a string; expected a list of k")
        if len(samples) != k:
            raise InputError(f"reward batch: image {image_id!r} has {len(samples)} captions, the first row {k}")
        for caption in samples:
            if not isinstance(caption, str):
                raise InputError(f"reward batch: image {image_id!r} has a caption of type {type(caption).__name__}")
    return k


class Reward:
    """A named reward function with the batch contract enforced on its inputs and output.

    `mix_normalisation` (`pacs.rewards.mix`; set by `build_reward(..., mix_normalisation=...)`): how `group_rewards`
    aggregates the reward's components for a policy gradient; calling the reward always gives the weighted sum.
    """

    mix_normalisation = "weighted_sum"

    def __init__(self, name: str, fn: RewardFn) -> None:
        self.name = name
        self.fn = fn

    def __repr__(self) -> str:
        return f"Reward({self.name!r})"

    def state_dict(self) -> dict[str, Any]:
        """The reward's caches (tensors, strings and lists only), which a resumed SCST run restores: a learned
        reward's floats depend on which texts and images are encoded together, i.e. on what is cached."""
        get = getattr(self.fn, "state_dict", None)
        return {"fn": get()} if callable(get) else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s caches."""
        load = getattr(self.fn, "load_state_dict", None)
        if callable(load) and "fn" in state:
            load(state["fn"])

    @torch.no_grad()
    def __call__(self, image_ids: list[str], captions: list[list[str]], references: list[list[str]]) -> torch.Tensor:
        """Score `captions[b][j]` of image `image_ids[b]`; returns a float32 CPU tensor `[B, k]`."""
        k = check_batch(image_ids, captions, references)
        if not image_ids:
            return torch.zeros(0, 0, dtype=torch.float32)
        values = torch.as_tensor(self.fn(list(image_ids), [list(row) for row in captions],
                                         [list(row) for row in references]))
        if tuple(values.shape) != (len(image_ids), k):
            raise RuntimeError(f"reward {self.name!r} returned shape {tuple(values.shape)}, "
                               f"expected [{len(image_ids)}, {k}]")
        return values.detach().to(device="cpu", dtype=torch.float32)

    def group_rewards(self, image_ids: list[str], captions: list[list[str]],
                      references: list[list[str]]) -> torch.Tensor:
        """The rewards `[B, k]` to compute advantages from: the weighted sum, or with `mix_normalisation`
        `normalize_then_sum` each component normalised within the image's k captions first (`pacs.rewards.mix`)."""

        return mixed_rewards(self, self(image_ids, captions, references), self.mix_normalisation)


class WeightedReward(Reward):
    """A weighted sum of rewards; `last_components` keeps each term's latest values for logging."""

    def __init__(self, name: str, components: list[tuple[str, float, Reward]]) -> None:
        self.components = components
        self.last_components: dict[str, torch.Tensor] = {}
        super().__init__(name, self._weighted_sum)

    def __repr__(self) -> str:
        return "WeightedReward(" + ", ".join(f"{name}:{weight:g}" for name, weight, _ in self.components) + ")"

    def state_dict(self) -> dict[str, Any]:
        """Each term's caches, by term name."""
        return {name: reward.state_dict() for name, _, reward in self.components}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore each term's caches."""
        for name, _, reward in self.components:
            reward.load_state_dict(state.get(name, {}))

    def _weighted_sum(self, image_ids: list[str], captions: list[list[str]],
                      references: list[list[str]]) -> torch.Tensor:
        total = torch.zeros(len(image_ids), len(captions[0]) if captions else 0, dtype=torch.float32)
        self.last_components = {}
        for name, weight, reward in self.components:
            values = reward(image_ids, captions, references)
            self.last_components[name] = values
            total = total + weight * values
        return total
