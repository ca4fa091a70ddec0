"""A run's CSV files (results.csv, the demo's scores.csv and curves) never hold a live spreadsheet formula."""
from __future__ import annotations


def test_a_recipe_results_csv_never_holds_a_live_formula(tmp_path) -> None:
    """results.csv of a run (`write_results`): a model or test-set name is quoted, numbers stay numbers."""
    import csv

    from pacs.captioner.orchestration.shared_stages import write_results

    rows = [{"model": "+HYPERLINK(\"http://evil/\")", "test_set": "@set", "C": -0.5}]
    write_results(tmp_path, rows, ["model", "test_set", "C"])
    with open(tmp_path / "results.csv", newline="", encoding="utf-8") as handle:
        (row,) = list(csv.DictReader(handle))
    assert row == {"model": "'+HYPERLINK(\"http://evil/\")", "test_set": "'@set", "C": "-0.5"}
