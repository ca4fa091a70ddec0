"""tools/compare_findings.py: two runs' findings compared as sets of (subject, claim, holds) (issue 32 item 5)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_modules import load_tool


@pytest.fixture(scope="module")
def tool():
    """tools/compare_findings.py as a module."""
    return load_tool("compare_findings")


def _run(folder: Path, records: list[tuple[str, str, object]]) -> Path:
    folder.mkdir()
    findings = [{"subject": s, "claim": c, "holds": h, "interval": {}, "seeds": {}} for s, c, h in records]
    (folder / "results.json").write_text(json.dumps({"rows": [], "findings": findings}))
    return folder


def test_two_runs_with_the_same_claims_are_equal_and_a_changed_one_is_named(tool, tmp_path, capsys) -> None:
    a = _run(tmp_path / "a", [("scst cider", "judge accuracy falls beyond noise", True),
                              ("scst judge", "judge accuracy rises beyond noise", True)])
    b = _run(tmp_path / "b", [("scst judge", "judge accuracy rises beyond noise", True),
                              ("scst cider", "judge accuracy falls beyond noise", True)])
    assert tool.main([str(a), str(b)]) == 0 and capsys.readouterr().out == "2 claims alike, 0 differ\n"
    c = _run(tmp_path / "c", [("scst cider", "judge accuracy falls beyond noise", "seed-dependent"),
                              ("scst clip-s", "its own reward rises beyond noise", True)])
    assert tool.main([str(a), str(c / "results.json")]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "0 claims alike, 3 differ",
        "  differs: scst cider: judge accuracy falls beyond noise — A: True, B: seed-dependent",
        "  differs: scst clip-s: its own reward rises beyond noise — A: absent, B: True",
        "  differs: scst judge: judge accuracy rises beyond noise — A: True, B: absent"]


def test_a_run_without_findings_records_is_one_line_exit_2(tool, tmp_path, capsys) -> None:
    old = tmp_path / "old"
    old.mkdir()
    (old / "results.json").write_text(json.dumps({"rows": [], "findings": ["a sentence of 0.5"]}))
    assert tool.main([str(old), str(old)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no findings records" in err and str(old / "results.json") in err


def _rated(folder: Path, records: list[tuple[str, str, object, float]]) -> Path:
    folder.mkdir()
    findings = [{"subject": s, "claim": c, "holds": h, "interval": {}, "seeds": {}, "replication": {"agrees": p}}
                for s, c, h, p in records]
    (folder / "results.json").write_text(json.dumps({"rows": [], "findings": findings}))
    return folder


def test_differences_show_each_runs_replication_estimate_and_count_robust_contradictions(tool, tmp_path,
                                                                                         capsys) -> None:
    rises = "its own reward rises beyond noise"
    a = _rated(tmp_path / "a", [("scst cider", rises, False, 0.82), ("scst clip-s", rises, True, 0.99),
                                ("scst judge", rises, True, 0.95)])
    b = _rated(tmp_path / "b", [("scst cider", rises, True, 0.57), ("scst clip-s", rises, True, 0.98),
                                ("scst judge", rises, False, 0.93)])
    assert tool.main([str(a), str(b)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "1 claims alike, 2 differ",
        # predicted: (1 - 0.82) + (1 - 0.99) + (1 - 0.95) = 0.24 and 0.43 + 0.02 + 0.07 = 0.52; observed: the
        # cider and judge claims of each run are stated otherwise by the other (2 and 2)
        ("predicted by each run's intervals: 0.2 (A), 0.5 (B) claims decided otherwise; observed: 2 (A's decided "
        "otherwise by B), 2 (B's by A); robust contradictions (differing, and fragile in neither run): 1"),
        ("  differs: scst cider: its own reward rises beyond noise — A: False, B: True (a replication agrees: A 0.82, "
        "B 0.57)"),
        # the judge claim: 0.95 and 0.93 in the two runs, neither below 0.9: the estimate failed to flag it
        ("  differs: scst judge: its own reward rises beyond noise — A: True, B: False (a replication agrees: A 0.95, "
        "B 0.93)")]
