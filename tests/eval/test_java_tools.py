"""missing_java_problems: METEOR and SPICE need Java, BLEU/ROUGE-L/CIDEr-D do not (the Java lookup is faked)."""
from __future__ import annotations

from pacs.eval.java_metrics import missing_java_problems


def test_metrics_without_java_need_nothing(no_java):
    assert missing_java_problems(["bleu1", "BLEU-4", "rouge", "CIDEr-D", "pac-s", "length"]) == []


def test_meteor_and_spice_are_named_one_line_each(no_java):
    problems = missing_java_problems(["bleu4", "METEOR", "cider", "spice", "meteor"])
    assert len(problems) == 2
    assert problems[0].startswith("metric meteor needs Java") and problems[1].startswith("metric spice needs Java")
    for problem in problems:
        assert "\n" not in problem and "install a JRE" in problem and "or drop" in problem


def test_nothing_missing_when_java_is_found(java_on_path):
    assert missing_java_problems(["meteor", "spice"]) == []

