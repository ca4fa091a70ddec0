"""How a mixed reward's components become the reward SCST learns from: `weighted_sum` or `normalize_then_sum`.

`weighted_sum` (pacs' default, and what `WeightedReward.__call__` returns): `R = Σ_c w_c · r_c`.

`normalize_then_sum`: the group reward-decoupled normalisation of GDPO (arXiv 2601.05242), as TRL ships it in
`GRPOTrainer` with `GRPOConfig(multi_objective_aggregation="normalize_then_sum")` (trl 1.16.0,
`trl/trainer/grpo_trainer.py`, `_generate_and_score_completions`): each component is normalised within the k
samples of its image before the weighting,

    R = Σ_c w_c · (r_c − mean_k r_c) / (std_k r_c + 1e-4),

with `std_k` the standard deviation with Bessel's correction (`trl.trainer.utils.nanstd`: divisor k − 1) and
ε = 1e-4 added to it, as in TRL. So a component on a large scale (CIDEr-D, ~0-3) no longer drowns one on a small
scale (PAC-S++, ~0.6-0.9 and a spread of a few hundredths), and each weight is the share of a unit-variance signal.

Zero spread: a component whose k values are all equal (or an image with a single finite value, or k = 1)
contributes exactly 0 to every sample of that image (TRL computes (r − mean) / 1e-4, which is 0 up to the rounding
of the mean; pacs sets it to 0 exactly, so a flat component never adds noise and `zero_spread` counts stay exact).
Non-finite values (NaN, ±inf): left out of the image's mean and std (TRL's NaN, its "None: does not apply"), and
the sample whose component is non-finite gets a NaN total, which SCST replaces by the baseline and counts
(`compute_advantages`; TRL instead sums the other components with `nansum`).
TRL then also normalises the aggregated reward over the whole batch when it forms advantages; pacs SCST does not
(its advantages are `R − baseline` for either aggregation; the learning rate absorbs the scale).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pacs.metric.common.errors import InputError

MIX_NORMALISATIONS = ("weighted_sum", "normalize_then_sum")
#: TRL's epsilon, added to the group standard deviation (`(std_k + 1e-4)` in `GRPOTrainer`)
GROUP_STD_EPS = 1e-4


def check_mix_normalisation(value: Any, key: str = "mix_normalisation") -> str:
    """`value` when it names a known aggregation; an InputError naming `key` otherwise."""
    if value not in MIX_NORMALISATIONS:
        raise InputError(f"{key}={value!r}: unknown aggregation of a mixed reward "
                         f"(known: {', '.join(MIX_NORMALISATIONS)})")
    return str(value)


def normalize_within_groups(values: torch.Tensor, eps: float = GROUP_STD_EPS) -> torch.Tensor:
    """`(r − mean_k r) / (std_k r + eps)` along the last dim of `values` `[B, k]` (TRL's per-group normalisation).

    The mean and the Bessel-corrected std are over each row's finite values; non-finite entries stay NaN; a row
    with zero spread (all finite values equal, or fewer than two) is exactly 0.

    >>> normalize_within_groups(torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]]))
    tensor([[-0.9999,  0.0000,  0.9999],
            [ 0.0000,  0.0000,  0.0000]])
    """
    if values.dim() != 2:
        raise ValueError(f"expected rewards [B, k], got shape {tuple(values.shape)}")
    x = values.to(torch.float64)
    finite = torch.isfinite(x)
    count = finite.sum(1, keepdim=True)
    zeros = torch.zeros_like(x)
    mean = torch.where(finite, x, zeros).sum(1, keepdim=True) / count.clamp(min=1)
    centred = torch.where(finite, x - mean, zeros)
    variance = (centred ** 2).sum(1, keepdim=True) / (count - 1).clamp(min=1)
    std = torch.where(count > 1, variance.sqrt(), torch.zeros_like(variance))
    high = torch.where(finite, x, torch.full_like(x, -torch.inf)).amax(1, keepdim=True)
    low = torch.where(finite, x, torch.full_like(x, torch.inf)).amin(1, keepdim=True)
    flat = (count < 2) | (high == low)
    normalised = torch.where(flat, zeros, centred / (std + eps))
    return torch.where(finite, normalised, torch.full_like(x, torch.nan)).to(values.dtype)


def aggregate(components: Mapping[str, torch.Tensor], weights: Mapping[str, float],
              normalisation: str = "weighted_sum") -> torch.Tensor:
    """The reward `[B, k]` of a mix from its components' values (`{name: [B, k]}`) and weights `{name: w}`."""
    check_mix_normalisation(normalisation)
    if not components:
        raise ValueError("a mixed reward needs at least one component")
    total = None
    for name, values in components.items():
        values = torch.as_tensor(values, dtype=torch.float32)
        term = normalize_within_groups(values) if normalisation == "normalize_then_sum" else values
        total = weights[name] * term if total is None else total + weights[name] * term
    return total


def mix_components(reward: Any, values: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The components (values of `reward`'s latest call) and weights of `reward`: a `WeightedReward`'s terms, or
    `reward` itself as one term of weight 1 (a single reward, or any callable without `last_components`)."""
    parts = getattr(reward, "last_components", None)
    terms = getattr(reward, "components", None)
    if parts and terms:
        weights = {name: float(weight) for name, weight, _ in terms}
        return {name: parts[name] for name in weights}, weights
    return {"reward": values}, {"reward": 1.0}


def mixed_rewards(reward: Any, values: torch.Tensor, normalisation: str) -> torch.Tensor:
    """The rewards `[B, k]` SCST computes advantages from, given `values = reward(image_ids, captions, references)`
    of the call just made: `values` itself for `weighted_sum`, the components normalised within each image's k
    samples then weighted for `normalize_then_sum` (the one function both captioner kinds' SCST calls)."""
    if check_mix_normalisation(normalisation) == "weighted_sum":
        return values
    components, weights = mix_components(reward, values)
    shapes = {tuple(v.shape) for v in components.values()}
    if shapes != {tuple(values.shape)}:
        raise RuntimeError(f"reward components have shapes {sorted(shapes)}, the reward {tuple(values.shape)}: "
                           "the components are not those of the latest call")
    return aggregate(components, weights, normalisation)
