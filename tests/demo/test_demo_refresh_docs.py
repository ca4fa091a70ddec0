"""tools/refresh_demo_docs.py: the README block of a run with the human row and its comparisons (no demo run)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_modules import load_tool

from pacs.captioner.demo.captioning import DEMO_COLUMNS
from pacs.metric.common.errors import InputError


@pytest.fixture(scope="module")
def tool():
    """tools/refresh_demo_docs.py as a module."""
    return load_tool("refresh_demo_docs")


def _row(model: str, value: float | None, **extra: object) -> dict:
    return {"model": model, **{c: value if c != "B-4" or model != "human" else None for c in DEMO_COLUMNS}, **extra}


def test_demo_refresh_block_shows_the_human_row_its_protocol_and_comparisons(tool, tmp_path: Path) -> None:
    ci = {c: [0.5, 1.5] for c in DEMO_COLUMNS}
    results = {
        "columns": DEMO_COLUMNS, "baseline": "xe", "bootstrap_resamples": 10,
        "rows": [_row("xe", 1.0), _row("scst cider", 2.0, delta=dict.fromkeys(DEMO_COLUMNS, 1.0), ci=ci),
                 _row("human", 3.0)],
        "reward_gains": [{"reward": "cider", "xe": 0.01, "scst": 0.02, "delta": 0.01, "ci": [0.005, 0.015]}],
        "human_baseline": {"protocol": "papers", "seed": 0, "held_out": {"a": 1}, "row": "human",
                           "header": "2 images; human row: one reference per image against the others; systems "
                                     "against all references (the papers' protocol); B-4 left out for humans"},
        "versus_human": {"xe": {"delta": {"C": -2.0}, "ci": {"C": [-3.0, -1.0]}},
                         "scst cider": {"delta": {"C": -1.0}, "ci": {"C": [-2.0, 0.5]}}},
        "findings": ["A line."]}
    (tmp_path / "results.json").write_text(json.dumps(results))
    block = tool.block(tmp_path)
    assert "seed 0): 2 images; human row: one reference per image against the others; systems against all " \
           "references (the papers' protocol); B-4 left out for humans." in block
    assert "| human | - | " + " | ".join(["3.00"] * (len(DEMO_COLUMNS) - 1)) + " |" in block
    assert "| Δ vs xe |" in block and "| Δ vs human |" in block
    assert "| xe |  | -2.00 [-3.00, -1.00] |" + "  |" * (len(DEMO_COLUMNS) - 2) + "\n" in block
    assert "| human |" not in block.split("| Δ vs xe |")[1].split("Change of every column against the human")[0]
    assert block.endswith("* A line.\n")
    page = "head\n<!-- demo-results:begin -->\nold\n<!-- demo-results:end -->\ntail\n"
    assert tool.replace_block(page, block, "x") == f"head\n<!-- demo-results:begin -->\n{block}\n<!-- demo-results:end -->\ntail\n"
    with pytest.raises(InputError, match="one <!-- demo-results:begin -->"):
        tool.replace_block("no markers", block, "README.md")


def test_demo_refresh_block_of_a_run_without_a_human_row(tool, tmp_path: Path) -> None:
    results = {"columns": DEMO_COLUMNS, "rows": [_row("xe", 1.0)], "bootstrap_resamples": 10}
    (tmp_path / "results.json").write_text(json.dumps(results))
    block = tool.block(tmp_path)
    assert block.startswith("| model | B-4 |") and "human" not in block


def test_demo_refresh_writes_the_findings_records_and_every_seeds_stage_seconds(tool, tmp_path: Path) -> None:
    records = [{"subject": "scst cider", "claim": "judge accuracy falls beyond noise", "holds": "seed-dependent",
                "interval": {"column": "Judge-acc", "point": -5.0, "low": -9.0, "high": -1.0, "unit": " pts"},
                "seeds": {"0": True, "1": False}, "text": "scst cider: judge accuracy falls beyond noise."},
               {"subject": "scst cider", "claim": "its own reward rises beyond noise", "holds": True,
                "interval": {"column": "reward", "point": 0.3, "low": 0.1, "high": 0.5, "unit": ""},
                "seeds": {"0": True, "1": True}, "text": "scst cider: its own reward rises beyond noise."}]
    results = {"columns": DEMO_COLUMNS, "rows": [_row("xe", 1.0)], "bootstrap_resamples": 10, "seeds": [0, 1],
               "bootstrap": {"method": "paired stratified bootstrap", "resamples": 10, "seeds": 2},
               "findings": records}
    (tmp_path / "results.json").write_text(json.dumps(results))
    (tmp_path / "stages" / "seed-1").mkdir(parents=True)
    (tmp_path / "stages" / "data.json").write_text(json.dumps({"stage": "data", "seconds": 1.5}))
    (tmp_path / "stages" / "seed-1" / "xe.json").write_text(json.dumps({"stage": "seed-1/xe", "seconds": 2.5}))
    block = tool.block(tmp_path)
    assert "data 1.5" in block and "seed-1/xe 2.5" in block and "total 4 s" in block
    found = block.split("What the run found:\n\n")[1].splitlines()
    assert found[0].startswith("* scst cider: judge accuracy falls beyond noise — seed-dependent: holds for seed 0, "
                               "not for seed 1 (Judge-acc -5.00 pts [-9.00, -1.00])")
    assert found[1] == "* scst cider: its own reward rises beyond noise (reward +0.300 [+0.100, +0.500])."
    written = tool.findings_json(tmp_path)
    assert written["findings"] == records and written["seeds"] == [0, 1] and written["bootstrap"]["seeds"] == 2
    assert written["claims"] == [["scst cider", "its own reward rises beyond noise", True],
                                 ["scst cider", "judge accuracy falls beyond noise", "seed-dependent"]]


def test_demo_refresh_writes_the_block_into_docs_demo_only(tool, tmp_path: Path, monkeypatch) -> None:
    """The generated block has one home, docs/demo.md: the README is not touched."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"columns": DEMO_COLUMNS, "rows": [_row("xe", 1.0)],
                                                  "bootstrap_resamples": 10}))
    tree = tmp_path / "tree"
    (tree / "docs").mkdir(parents=True)
    readme = "# front\n<!-- demo-results:begin -->\nold\n<!-- demo-results:end -->\n"
    (tree / "README.md").write_text(readme)
    (tree / "docs" / "demo.md").write_text("head\n<!-- demo-results:begin -->\nold\n<!-- demo-results:end -->\n")
    monkeypatch.setattr(tool, "ROOT", tree)
    assert tool.main([str(run)]) == 0
    assert (tree / "README.md").read_text() == readme
    assert (tree / "docs" / "demo.md").read_text() == (
        f"head\n<!-- demo-results:begin -->\n{tool.block(run)}\n<!-- demo-results:end -->\n")
