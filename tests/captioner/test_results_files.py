"""The one results writer (`pacs.captioner.orchestration.results_files`) and the one column list
(`pacs.eval.columns.TABLE_COLUMNS`): a recipe's table, its seeds pooled and the demo's table through one code path."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from pacs.captioner.demo.captioning import DEMO_COLUMNS
from pacs.captioner.orchestration.eval_intervals import add_intervals
from pacs.captioner.orchestration.evaluation import TABLE_COLUMNS as RECIPE_COLUMNS
from pacs.captioner.orchestration.results_files import results_markdown, split_columns, write_results
from pacs.eval.columns import TABLE_COLUMNS, table_columns


def test_every_table_shows_its_columns_in_the_one_order():
    assert RECIPE_COLUMNS == ("B-4", "M", "C", "S", "CLIP-S", "PAC-S++", "RefCLIP-S", "RefPAC-S++", "Rep-1",
                              "Rep-2", "Rep-3", "Rep-4", "%Incorrect")
    assert DEMO_COLUMNS == ["B-4", "C", "CLIP-S", "PAC-S++", "RefCLIP-S", "RefPAC-S++", "Rep-1", "Rep-2", "Rep-3",
                            "Rep-4", "%Incorrect", "Judge-acc", "Judge", "Halluc.", "Length"]
    for columns in (RECIPE_COLUMNS, DEMO_COLUMNS):  # each a sub-sequence of the one list
        positions = [TABLE_COLUMNS.index(c) for c in columns]
        assert positions == sorted(positions)
    assert table_columns({"Length", "C", "B-4"}) == ["B-4", "C", "Length"]
    with pytest.raises(ValueError, match="Polos"):
        table_columns({"C", "Polos"})


def test_split_columns_tells_labels_from_values():
    assert split_columns(["test_set", "reward", "B-4", "C"]) == (["test_set", "reward"], ["B-4", "C"])
    assert split_columns(["C", "Judge-acc"]) == (["model"], ["C", "Judge-acc"])


def test_a_recipe_table_gets_each_rows_change_against_xe_with_its_interval(tmp_path):
    """The point of a recipe row's interval is its mean paired difference (computed here by hand); results.md shows
    it with the interval for the per-image columns only, results.csv the bounds."""
    xe = {"C": [10.0, 20.0, 30.0, 40.0], "CLIP-S": [0.5, 0.6, 0.7, 0.8]}
    rl = {"C": [12.0, 21.0, 36.0, 43.0], "CLIP-S": [0.52, 0.59, 0.75, 0.84]}
    ids = ["a", "b", "c", "d"]
    rows = [{"model": "xe", "test_set": "coco", "B-4": 30.0, "C": 25.0, "CLIP-S": 0.65},
            {"model": "cider", "test_set": "coco", "B-4": 31.0, "C": 28.0, "CLIP-S": 0.675}]
    per_image = {("xe", "coco"): {"image_ids": ids, "values": xe}, ("cider", "coco"): {"image_ids": ids, "values": rl}}
    assert add_intervals(rows, per_image, "xe", 200, 0) == 1
    assert rows[1]["delta"] == pytest.approx({"C": 3.0, "CLIP-S": 0.025}, abs=1e-12)
    assert "delta" not in rows[0] and "ci" not in rows[0]
    write_results(tmp_path, rows, ["model", "test_set", "B-4", "C", "CLIP-S"])
    markdown = (tmp_path / "results.md").read_text(encoding="utf-8")
    low, high = rows[1]["ci"]["C"]
    assert "| model | test_set | B-4 | C | CLIP-S |\n|---|---|---|---|---|\n| xe | coco | 30.000 | 25.000 | 0.650 |\n" \
        in markdown
    assert "Change of every column against XE (95% interval):\n\n| model | test_set | ΔC | ΔCLIP-S |\n" in markdown
    assert f"| cider | coco | +3.00 [{low:+.2f}, {high:+.2f}] | +0.025 [" in markdown
    with open(tmp_path / "results.csv", newline="", encoding="utf-8") as handle:
        header, *lines = list(csv.reader(handle))
    assert header == ["model", "test_set", "B-4", "C", "CLIP-S", "ΔC low", "ΔC high", "ΔCLIP-S low", "ΔCLIP-S high"]
    assert [float(v) for v in lines[1][5:7]] == [low, high]
    assert json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))["rows"][1]["delta"]["C"] == 3.0


def test_pooled_seeds_say_how_they_were_pooled(tmp_path):
    from pacs.captioner.orchestration.seed_runs import write_seed_results

    rows = [{"model": "xe", "test_set": "coco", "C": 25.0, "per_seed": {"C": [24.0, 26.0]}},
            {"model": "cider", "test_set": "coco", "C": 28.0, "per_seed": {"C": [27.0, 29.0]},
             "delta": {"C": 3.0}, "ci": {"C": [1.0, 5.0]}}]
    write_seed_results(tmp_path, rows, [], [0, 1], 100)
    markdown = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert markdown.startswith("Every value is the mean over seeds (2 training seeds: 0, 1;")
    assert "| cider | coco | +3.00 [+1.00, +5.00] |" in markdown
    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert results["seeds"] == [0, 1] and results["bootstrap"]["resamples"] == 100


def test_the_demo_table_through_the_same_writer(tmp_path):
    """2 decimals, '-' for a value the row holds as None (the human B-4), the Δ bounds in results.csv."""
    from pacs.captioner.demo.pipeline import DEMO_DIGITS

    rows = [{"model": "xe", **dict.fromkeys(DEMO_COLUMNS, 1.0)},
            {"model": "scst cider", **dict.fromkeys(DEMO_COLUMNS, 2.0), "delta": dict.fromkeys(DEMO_COLUMNS, 1.0),
             "ci": {c: [0.5, 1.5] for c in DEMO_COLUMNS}},
            {"model": "human", **dict.fromkeys(DEMO_COLUMNS, 3.0), "B-4": None}]
    results = {"columns": DEMO_COLUMNS, "rows": rows}
    write_results(tmp_path, results, ["model", *DEMO_COLUMNS], DEMO_DIGITS)
    markdown = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert markdown == results_markdown(results, ["model", *DEMO_COLUMNS], DEMO_DIGITS)
    assert "| human | - | " + " | ".join(["3.00"] * (len(DEMO_COLUMNS) - 1)) + " |" in markdown
    assert "| Δ vs xe | " + " | ".join(DEMO_COLUMNS) + " |" in markdown
    header = (tmp_path / "results.csv").read_text(encoding="utf-8").splitlines()[0].split(",")
    assert header[:len(DEMO_COLUMNS) + 1] == ["model", *DEMO_COLUMNS]
    assert header[len(DEMO_COLUMNS) + 1:] == [f"Δ{c} {end}" for c in DEMO_COLUMNS for end in ("low", "high")]
    assert np.isclose(float((tmp_path / "results.csv").read_text().splitlines()[2].split(",")[-1]), 1.5)
