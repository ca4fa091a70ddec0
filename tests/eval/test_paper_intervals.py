"""Paper tables with intervals (issue 42 item 6): `--latex` / `--markdown` cells carry each value's 95% bootstrap
interval (on by default with `--baseline`), bold marks the best only when it is separated from the runner-up
(its paired interval excludes 0), otherwise every row not separated from the best; one row label everywhere."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pacs import cli as pacs_cli
from pacs.eval import evaluate_systems
from pacs.eval.intervals import best_rows
from pacs.eval.system_table import table_text
from pacs.eval.table_export import best_cells, table_latex, table_markdown

REFERENCES = {f"im{i}": [f"a {animal} runs across the {place}", f"the {animal} is in the {place}",
                         f"one {animal} near a {place}"]
              for i, (animal, place) in enumerate([("dog", "park"), ("cat", "garden"), ("horse", "field"),
                                                    ("bird", "tree"), ("cow", "farm"), ("fox", "forest")])}
SHORT = {"A": {"im0": "a dog", "im1": "a cat runs", "im2": "a horse in a field", "im3": "bird",
               "im4": "a cow on the farm now", "im5": "the fox"},
         "B": {"im0": "dog runs", "im1": "a cat", "im2": "the horse", "im3": "a bird in a tree",
               "im4": "cow", "im5": "a fox in the forest"}}


def _cells(markdown: str) -> dict[str, list[str]]:
    """`{row label: [cells]}` of a Markdown table."""
    rows = [line for line in markdown.splitlines() if line.startswith("| ") and not line.startswith("| Model")]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows)}


def _by_hand(lengths: list[int], n_resamples: int, seed: int) -> tuple[float, float]:
    """The row's 95% percentile interval of mean length, recomputed: the images drawn with
    `default_rng(seed).integers(0, n, size=n)` per resample (the system table's resampler)."""
    values = np.asarray(lengths, dtype=float)
    rng = np.random.default_rng(seed)
    means = [values[rng.integers(0, len(values), size=len(values))].mean() for _ in range(n_resamples)]
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def test_latex_and_markdown_cells_carry_the_intervals_computed_by_hand():
    table = evaluate_systems(SHORT, REFERENCES, "length", bootstrap=40, seed=5, baseline="B")
    markdown, latex = table_markdown(table, intervals=True), table_latex(table, intervals=True)
    cells = _cells(markdown)
    for name, captions in SHORT.items():
        lengths = [len(captions[key].split()) for key in REFERENCES]  # the table's image order: the references'
        low, high = _by_hand(lengths, 40, 5)
        expected = f"{np.mean(lengths):.2f} [{low:.2f}, {high:.2f}]"  # length: 2 decimals, not ranked (no bold)
        assert cells[name] == [expected]
        assert f"{name} & {np.mean(lengths):.2f} {{\\scriptsize [{low:.2f}, {high:.2f}]}} \\\\" in latex
    assert "each value followed by its 95% bootstrap interval" in markdown.splitlines()[0]
    # without the option the cells are the values alone, as before
    assert _cells(table_markdown(table)) == {name: [f"{np.mean([len(c[k].split()) for k in REFERENCES]):.2f}"]
                                             for name, c in SHORT.items()}


def _cider_systems(twin: bool) -> dict[str, dict[str, str]]:
    """`good` repeats each image's first reference; `twin` (when asked) the same captions; `bad` shares no word."""
    good = {key: refs[0] for key, refs in REFERENCES.items()}
    systems = {"good": good, "bad": {key: "zzz qqq www" for key in REFERENCES}}
    if twin:
        systems["twin"] = dict(good)
    return systems


def test_bold_marks_the_best_alone_when_it_is_separated_from_the_runner_up():
    table = evaluate_systems(_cider_systems(twin=False), REFERENCES, "cider", bootstrap=50, seed=1)
    record = table["best"]["cider"]
    # bad scores 0 on every image and good > 0 on every image: every resample's difference is > 0
    assert record["best"] == "good" and record["runner_up"] == "bad" and record["separated"] is True
    assert record["difference_ci"][0] > 0
    assert best_cells(table)["cider"] == {"good"}
    cells = _cells(table_markdown(table))
    assert cells["good"][0].startswith("**") and not cells["bad"][0].startswith("**")
    assert "when its paired 95% interval against the runner-up excludes 0" in table_latex(table).splitlines()[1]


def test_bold_marks_every_row_not_separated_from_the_best():
    table = evaluate_systems(_cider_systems(twin=True), REFERENCES, "cider", bootstrap=50, seed=1)
    record = table["best"]["cider"]
    # good and twin have the same captions: their paired difference is 0 on every resample, so not separated
    assert record["difference_ci"] == [0.0, 0.0] and record["separated"] is False
    assert set(record["rows"]) == {"good", "twin"}
    latex = table_latex(table)
    rows = {line.split(" & ")[0]: line for line in latex.splitlines() if line.endswith("\\\\")}
    assert "\\textbf{" in rows["good"] and "\\textbf{" in rows["twin"] and "\\textbf{" not in rows["bad"]


def test_best_rows_on_constructed_resamples():
    rng = np.random.default_rng(0)
    base = rng.normal(size=200)
    values = {"a": 1.0, "b": 0.9, "c": 0.0}
    # a − b is 0.1 + small noise on every resample (separated); a − c is 1 + noise
    separated = best_rows(values, {"a": base + 1.0, "b": base + 0.9 + rng.normal(0, 0.01, 200), "c": base}, 1)
    assert separated["separated"] and separated["rows"] == ["a"]
    # b's difference with a straddles 0; c's does not: a and b bold
    noisy = best_rows(values, {"a": base + 1.0, "b": base + 0.9 + rng.normal(0, 1.0, 200), "c": base}, 1)
    assert not noisy["separated"] and noisy["rows"] == ["a", "b"]
    # lower is better: c is best and separated from b
    lower = best_rows(values, {"a": base + 1.0, "b": base + 0.9, "c": base}, -1)
    assert lower["best"] == "c" and lower["runner_up"] == "b" and lower["rows"] == ["c"]


def test_the_human_row_has_one_label_in_stdout_latex_markdown_and_html():
    from pacs.eval.system_table import labelled

    table = evaluate_systems(SHORT, REFERENCES, "length", bootstrap=0, human_baseline=True, seed=2)
    assert [row["system"] for row in table["rows"]] == ["A", "B", "human"]
    printed = [line.split()[0] for line in table_text(table).splitlines()[3:6]]
    assert printed == ["A", "B", "Humans"]
    assert set(_cells(table_markdown(table))) == {"A", "B", "Humans"}
    assert [line.split(" & ")[0] for line in table_latex(table).splitlines()
            if line.endswith("\\\\") and " & " in line][-3:] == ["A", "B", "Humans"]
    from pacs.eval.report import system_table_html

    page = system_table_html(labelled(table))
    assert '<td class="name">Humans</td>' in page and '<td class="name">human</td>' not in page


@pytest.mark.parametrize("flags, baseline, shown", [
    ([], True, True), ([], False, False), (["--no-paper-intervals"], True, False), (["--paper-intervals"], False, True)])
def test_paper_intervals_flag_defaults_to_on_with_a_baseline(tmp_path, flags, baseline, shown):
    for name, captions in SHORT.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(captions))
    (tmp_path / "refs.json").write_text(json.dumps(REFERENCES))
    md, tex = tmp_path / "t.md", tmp_path / "t.tex"
    argv = ["evaluate", "--references", str(tmp_path / "refs.json"), "--candidates", f"A={tmp_path / 'A.json'}",
            f"B={tmp_path / 'B.json'}", "--metrics", "length", "--bootstrap", "30", "--markdown", str(md),
            "--latex", str(tex), *(["--baseline", "B"] if baseline else []), *flags]
    assert pacs_cli.main(argv) == 0
    cells = _cells(md.read_text())
    assert all(("[" in cell[0]) == shown for cell in cells.values()), cells
    assert ("\\scriptsize" in tex.read_text()) == shown


def test_a_system_named_like_the_human_rows_label_is_refused_with_a_human_baseline():
    from pacs.metric.common.errors import InputError

    with pytest.raises(InputError, match="system name 'Humans' is the human baseline's row"):
        evaluate_systems({"Humans": SHORT["A"], "B": SHORT["B"]}, REFERENCES, "length", bootstrap=0,
                         human_baseline=True)
    # without a human row the name is free
    assert evaluate_systems({"Humans": SHORT["A"]}, REFERENCES, "length", bootstrap=0)["systems"] == ["Humans"]
