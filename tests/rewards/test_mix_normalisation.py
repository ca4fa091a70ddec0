"""Mixed rewards normalised per component within each image's k samples (issue 34 item 4, `pacs.rewards.mix`)."""
from __future__ import annotations

import math

import pytest
import torch

from pacs.metric.common.errors import InputError
from pacs.rewards.base import Reward, WeightedReward
from pacs.rewards.mix import GROUP_STD_EPS, aggregate, mixed_rewards, normalize_within_groups

# two components over B=2 images x k=3 samples; component b is flat on image 0 (zero spread)
A = [[0.0, 1.0, 2.0], [3.0, 3.0, 6.0]]
B = [[0.5, 0.5, 0.5], [0.2, 0.4, 0.9]]
WEIGHTS = {"a": 1.0, "b": 0.5}


def _by_hand(row: list[float]) -> list[float]:
    """(x − mean) / (std + 1e-4), std with Bessel's correction; 0 for a flat row (written out in plain Python)."""
    mean = sum(row) / len(row)
    if max(row) == min(row):
        return [0.0] * len(row)
    std = math.sqrt(sum((x - mean) ** 2 for x in row) / (len(row) - 1))
    return [(x - mean) / (std + 1e-4) for x in row]


def _mix(captions_a=A, captions_b=B) -> WeightedReward:
    """A WeightedReward whose terms return the tables above (whatever the captions)."""
    return WeightedReward("a:1,b:0.5", [("a", 1.0, Reward("a", lambda i, c, r: torch.tensor(captions_a))),
                                       ("b", 0.5, Reward("b", lambda i, c, r: torch.tensor(captions_b)))])


BATCH = (["img0", "img1"], [["x", "y", "z"], ["u", "v", "w"]], [["ref"], ["ref"]])


def test_normalize_then_sum_equals_a_hand_computation_on_a_two_by_three_table():
    # image 0: a = [0, 1, 2] has mean 1 and std 1; b is flat (contributes 0)
    # image 1: a = [3, 3, 6] has mean 4, std sqrt(3); b = [0.2, 0.4, 0.9] mean 0.5, std sqrt(0.13)
    expected = [[-1 / 1.0001, 0.0, 1 / 1.0001],
                [-1 / (math.sqrt(3) + 1e-4) + 0.5 * -0.3 / (math.sqrt(0.13) + 1e-4),
                 -1 / (math.sqrt(3) + 1e-4) + 0.5 * -0.1 / (math.sqrt(0.13) + 1e-4),
                 2 / (math.sqrt(3) + 1e-4) + 0.5 * 0.4 / (math.sqrt(0.13) + 1e-4)]]
    generic = [[a + 0.5 * b for a, b in zip(_by_hand(ra), _by_hand(rb))] for ra, rb in zip(A, B)]
    torch.testing.assert_close(torch.tensor(expected), torch.tensor(generic), rtol=0, atol=1e-12)
    reward = _mix()
    reward.mix_normalisation = "normalize_then_sum"
    got = reward.group_rewards(*BATCH)
    # float32 inputs and output: a relative 1e-6 is their rounding
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), rtol=1e-6, atol=1e-6)
    # the advantage SCST takes from it (mean baseline) is the same table minus each row's mean (~0 here)
    from pacs.captioner.modeling.train_scst import compute_advantages

    _, advantages, _ = compute_advantages(got, "mean")
    hand = [[x - sum(row) / 3 for x in row] for row in expected]
    torch.testing.assert_close(advantages, torch.tensor(hand, dtype=torch.float32), rtol=1e-6, atol=1e-6)
    # calling the reward still gives the weighted sum (the monitor, logs and evaluation see that)
    torch.testing.assert_close(reward(*BATCH), torch.tensor(A) + 0.5 * torch.tensor(B), rtol=0, atol=0)


def test_weighted_sum_is_the_default_and_unchanged():
    reward = _mix()
    assert reward.mix_normalisation == "weighted_sum"
    torch.testing.assert_close(reward.group_rewards(*BATCH), torch.tensor(A) + 0.5 * torch.tensor(B), rtol=0, atol=0)


def test_matches_trl_grpo_normalize_then_sum_per_group():
    trl_utils = pytest.importorskip("trl.trainer.utils")
    values = torch.tensor([A, B], dtype=torch.float32).permute(1, 2, 0)  # [B, k, components], TRL's `grouped`
    # the expression of trl/trainer/grpo_trainer.py (multi_objective_aggregation == "normalize_then_sum")
    mean_k = torch.nanmean(values, dim=1, keepdim=True)
    std_k = trl_utils.nanstd(values, dim=1, keepdim=True)
    trl = ((values - mean_k) / (std_k + 1e-4) * torch.tensor([1.0, 0.5])).nansum(dim=2)
    ours = aggregate({"a": torch.tensor(A), "b": torch.tensor(B)}, WEIGHTS, "normalize_then_sum")
    torch.testing.assert_close(ours, trl, rtol=1e-6, atol=1e-6)  # flat b of image 0: 0 in both (up to rounding)


def test_zero_spread_single_value_and_non_finite_entries():
    # 0.1 three times: a mean that rounds in float32, still exactly 0 (TRL: ~1e-4 from the rounding)
    values = torch.tensor([[0.1, 0.1, 0.1], [2.0, float("nan"), 4.0], [float("inf"), 7.0, float("nan")]])
    out = normalize_within_groups(values)
    assert out[0].tolist() == [0.0, 0.0, 0.0]
    # the NaN is left out of the image's mean (3) and std (sqrt(2)) and stays NaN
    assert out[1, 0].item() == pytest.approx(-1 / (math.sqrt(2) + GROUP_STD_EPS), rel=1e-6)
    assert math.isnan(out[1, 1].item()) and out[1, 2].item() == pytest.approx(1 / (math.sqrt(2) + 1e-4), rel=1e-6)
    # one finite value: no spread, 0; inf and NaN: NaN (SCST replaces them by the baseline and counts them)
    assert math.isnan(out[2, 0].item()) and out[2, 1].item() == 0.0 and math.isnan(out[2, 2].item())
    assert normalize_within_groups(torch.tensor([[5.0], [-1.0]])).tolist() == [[0.0], [0.0]]  # k = 1
    total = aggregate({"a": torch.tensor([[1.0, float("nan"), 3.0]]), "b": torch.tensor([[1.0, 2.0, 3.0]])},
                      WEIGHTS, "normalize_then_sum")
    # sample 0: a is -1 / (sqrt(2) + eps) over the finite [1, 3]; b is -1 / (1 + eps), weighted 0.5
    expected = -1 / (math.sqrt(2) + 1e-4) - 0.5 / (1 + 1e-4)
    assert math.isnan(total[0, 1].item()) and total[0, 0].item() == pytest.approx(expected, rel=1e-6)


def test_a_flat_mix_gives_zero_advantages_with_normalisation():
    reward = _mix([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]], [[0.3, 0.3, 0.3], [0.0, 0.0, 0.0]])
    assert mixed_rewards(reward, reward(*BATCH), "normalize_then_sum").tolist() == [[0.0] * 3] * 2


def test_a_single_reward_is_one_component_of_weight_one():
    single = Reward("a", lambda i, c, r: torch.tensor(A))
    got = mixed_rewards(single, single(*BATCH), "normalize_then_sum")
    torch.testing.assert_close(got, torch.tensor([_by_hand(row) for row in A], dtype=torch.float32),
                               rtol=1e-6, atol=1e-6)


def test_build_reward_takes_the_option_and_refuses_an_unknown_one():
    from pacs.rewards import build_reward

    refs = [["a dog runs on the grass"], ["a man rides a horse"]]
    reward = build_reward("cider:1,rep-penalty:0.5", mix_normalisation="normalize_then_sum", train_references=refs)
    assert reward.mix_normalisation == "normalize_then_sum"
    captions = [["a dog runs", "a dog dog dog", "grass"], ["a man rides", "a horse", "a man a man"]]
    got = reward.group_rewards(["i0", "i1"], captions, refs)
    parts = reward.last_components
    expected = [[c + 0.5 * r for c, r in zip(_by_hand(rc), _by_hand(rr))]
                for rc, rr in zip(parts["cider"].tolist(), parts["rep-penalty"].tolist())]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="mix_normalisation='zscore': unknown aggregation of a mixed reward "
                                         r"\(known: weighted_sum, normalize_then_sum\)"):
        build_reward("cider:1,rep-penalty:0.5", mix_normalisation="zscore", train_references=refs)
