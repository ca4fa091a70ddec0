"""Flickr8k-Expert reproduction of the published Kendall numbers (PAC-S Table 1 / official README), and CF."""
from __future__ import annotations

import pytest

from pacs.eval.benchmarks import RunContext, get_benchmark
from pacs.eval.caption_scoring import MetricSuite

# τb / τc ×100 from the issue (the official PAC-S README values, rounded to one decimal)
EXPERT = {"bleu1": (32.2, 32.3), "bleu4": (30.6, 30.8), "rouge": (32.1, 32.3), "meteor": (41.5, 41.8),
          "cider": (43.6, 43.9)}
# CF: METEOR and ROUGE-L are exercised by the Expert test; here the cheap metrics keep CI time down
CF = {"bleu1": (17.9, 9.3), "bleu4": (16.9, 8.7), "cider": (24.6, 12.7)}


@pytest.mark.slow
def test_flickr8k_expert_reproduces_published_kendall(shared_data):
    context = RunContext(shared_data / "flickr8k", MetricSuite(list(EXPERT)))
    table = get_benchmark("flickr8k-expert").run(context)
    assert context.notes["excluded_candidate_is_reference"] == 158
    for name, (tau_b, tau_c) in EXPERT.items():
        assert table[name]["n"] == 16992  # 5,664 pairs x 3 experts
        assert table[name]["tau_b"] == pytest.approx(tau_b, abs=0.1), name
        assert table[name]["tau_c"] == pytest.approx(tau_c, abs=0.1), name


@pytest.mark.slow
def test_flickr8k_cf_reproduces_published_kendall(shared_data):
    """CF: every pair kept, share of yes; judged candidates drawn from the image's captions leave its references."""
    context = RunContext(shared_data / "flickr8k", MetricSuite(list(CF)))
    table = get_benchmark("flickr8k-cf").run(context)
    assert context.notes["references_removed_as_judged_candidates"] == 723
    for name, (tau_b, tau_c) in CF.items():
        assert table[name]["n"] == 47830
        assert table[name]["tau_b"] == pytest.approx(tau_b, abs=0.1), name
        assert table[name]["tau_c"] == pytest.approx(tau_c, abs=0.1), name
