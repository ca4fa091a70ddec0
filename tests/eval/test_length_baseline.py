"""`--metrics length` (caption length in words, the baseline of every benchmark) on HAT, composite, robustness.

Expected values by hand: AUROC by counting pairs, Kendall tau-b by counting pairs, and the robustness
perturbations whose effect on the word count is known (padding adds 4 words, shuffle keeps the count).
"""
from __future__ import annotations

import json

import pytest

from pacs.eval import correlate


def tau_b(x: list[float], y: list[float]) -> float:
    """Kendall tau-b by counting every pair."""
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            ties_x += dx == 0
            ties_y += dy == 0
            concordant += dx * dy > 0
            discordant += dx * dy < 0
    n0 = len(x) * (len(x) - 1) / 2
    return (concordant - discordant) / ((n0 - ties_x) * (n0 - ties_y)) ** 0.5


def test_hat_length_auroc_by_counting_pairs(shared_data):
    table = correlate("hat", shared_data / "hallucination", "length")
    items = json.loads((shared_data / "hallucination" / "hat-trainval.json").read_text())
    good = [len(item["caption"].split()) for item in items if not item["contains_hallucination"]]
    bad = [len(item["caption"].split()) for item in items if item["contains_hallucination"]]
    wins = sum(1.0 if g > b else 0.5 if g == b else 0.0 for g in good for b in bad)
    assert table["length"]["auroc"] == pytest.approx(wins / (len(good) * len(bad)), abs=1e-12)


def test_composite_length_tau_b(tmp_path):
    judged = [("a dog runs on the grass today", 5), ("a cat", 1), ("a brown dog runs", 4), ("two men", 2),
              ("one dog on a lawn", 3)]
    data = {"img0": {"image_path": "img0.jpg", "ground_truth": ["a dog runs on grass"],
                     "human_judgement": [{"caption": c, "rating": r} for c, r in judged]}}
    (tmp_path / "composite.json").write_text(json.dumps(data))
    table = correlate("composite", tmp_path / "composite.json", "length")
    expected = 100 * tau_b([len(c.split()) for c, _ in judged], [r for _, r in judged])
    assert table["length"]["tau_b"] == pytest.approx(expected, abs=1e-9) and table["length"]["n"] == 5


def test_robustness_length_follows_the_word_counts(tmp_path):
    pytest.importorskip("lemminflect")
    references = {f"img{i}": [f"a brown dog number {i} runs on the green grass near a tree",
                              f"a dog {i} on grass", f"the dog {i} runs"] for i in range(6)}
    (tmp_path / "refs.json").write_text(json.dumps(references))
    table = correlate("robustness", tmp_path / "refs.json", "length")
    assert table["length"]["padding"] == 0.0  # the padded caption is 4 words longer: the original always loses
    assert table["length"]["shuffle"] == 50.0  # same words, same count: every pair is a tie (half)
