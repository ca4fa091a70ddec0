"""Every SCST stage states its exact reward (issue 42 items 1 and 7): one log line and its record's `summary.reward`."""
from __future__ import annotations

import logging

from pacs.captioner.orchestration.reward_record import announce_reward, reward_line, reward_record


def test_a_mix_is_recorded_term_by_term():
    """The parsed, weighted mix in the order written, names lower-cased, weights as numbers."""
    record = reward_record(" CIDEr:1, pac-s++:0.50 ")
    assert record == {"spec": "cider:1,pac-s++:0.5",
                      "terms": [{"reward": "cider", "weight": 1.0}, {"reward": "pac-s++", "weight": 0.5}],
                      "aggregation": "weighted_sum"}
    assert reward_line(record) == "1 x cider + 0.5 x pac-s++ (weighted_sum)"


def test_single_reward_guard_and_aggregation():
    """A bare name is weight 1; a single weighted term keeps its weight; the KL term and aggregation are stated."""
    assert reward_record("cider")["spec"] == "cider"
    guarded = reward_record("pac-s++:2", "normalize_then_sum", kl_coef=0.05)
    assert guarded["spec"] == "pac-s++:2" and guarded["kl_coef"] == 0.05
    assert reward_line(guarded) == "2 x pac-s++ - 0.05 x KL(policy || XE) (normalize_then_sum)"


def test_announce_logs_one_line_on_the_main_process_only(caplog):
    """The main process logs the line; another process returns the same record silently."""
    with caplog.at_level(logging.INFO, logger="pacs.captioner.orchestration.reward_record"):
        record = announce_reward("scst-cider-pac-s-0.5", "cider:1,pac-s++:0.5")
        assert announce_reward("scst-cider-pac-s-0.5", "cider:1,pac-s++:0.5", log=False) == record
    assert [r.getMessage() for r in caplog.records] == [
        "stage scst-cider-pac-s-0.5: reward 1 x cider + 0.5 x pac-s++ (weighted_sum)"]
