"""A paper-ready system table (issue 33 item 5): a model per contrastive column, text metrics ×100, LaTeX and
Markdown with the papers' column groups and the best per column bold, colours by metric direction, the header
and SPICE-warning fixes, and `pacs.eval.evaluate_systems` on captions in memory.

The column models are the official-format fixtures (`$PACS_SHARED/fixtures/pacscore`: C a PAC-S file, A a
PAC-S++ file, both tiny and random) and pacs' `tiny-random` CLIP; the images and captions are the fixtures'.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from pacs import cli as pacs_cli

CONTRASTIVE = ["ref-clip-s", "clip-s", "pac-s", "ref-pac-s", "pac-s++", "ref-pac-s++"]


@pytest.fixture(scope="module")
def fixture_systems(shared_fixtures, tmp_path_factory):
    """Two systems on the fixture images with two or more instances: A = each image's first instance's
    candidate, B = its second; references = the first instance's; the instances kept for the expected values."""
    root = shared_fixtures / "pacscore"
    instances = json.loads((root / "inputs" / "inputs.json").read_text())["instances"]
    by_image: dict[str, list[int]] = {}
    for index, instance in enumerate(instances):
        by_image.setdefault(instance["image"], []).append(index)
    images = [image for image, rows in by_image.items() if len(rows) >= 2
              and (root / "inputs" / "images" / image).is_file()]
    folder = tmp_path_factory.mktemp("paper")
    chosen = {"A": [by_image[i][0] for i in images], "B": [by_image[i][1] for i in images]}
    for name, rows in chosen.items():
        (folder / f"{name}.json").write_text(json.dumps({instances[r]["image"]: instances[r]["candidate"] for r in rows}))
    (folder / "refs.json").write_text(json.dumps({i: instances[by_image[i][0]]["references"] for i in images}))
    return {"dir": folder, "root": root, "images": images, "chosen": chosen, "image_dir": root / "inputs" / "images"}


def _evaluate(folder: Path, *argv) -> int:
    return pacs_cli.main(["evaluate", "--references", str(folder / "refs.json"), *map(str, argv)])


def test_three_column_models_equal_three_single_model_runs(fixture_systems, capsys):
    """One call with `--metric-model` for CLIP-S, PAC-S and PAC-S++ equals, value for value, three runs of one
    model each (the same captions in the same batches: exact equality), and PAC-S / PAC-S++ equal the values the
    official code computed for these fixtures (expected.json, tolerance 1e-4 as FORMAT.md states)."""
    folder, root = fixture_systems["dir"], fixture_systems["root"]
    c_file, a_file = root / "C" / "clip_tiny_C.pth", root / "A" / "PAC++_tiny_A.pth"
    models = {"clip": ["--backbone", "tiny-random"],
              "pac-s": ["--checkpoint", c_file, "--arch", root / "C" / "arch.json", "--family", "pac-s"],
              "pac-s++": ["--checkpoint", a_file, "--arch", root / "A" / "arch.json"]}
    common = ["--images", fixture_systems["image_dir"]]
    out = folder / "table.json"
    assert _evaluate(folder, "--candidates", f"A={folder / 'A.json'}", f"B={folder / 'B.json'}",
                     "--metrics", "cider," + ",".join(CONTRASTIVE) + ",incorrect", *common,
                     "--metric-model", "clip-s=tiny-random",
                     "--metric-model", f"pac-s={c_file},arch={root / 'C' / 'arch.json'},family=pac-s",
                     "--metric-model", f"pac-s++={a_file},arch={root / 'A' / 'arch.json'}",
                     "--bootstrap", "0", "--out", out) == 0
    table = json.loads(out.read_text())
    printed = capsys.readouterr().out
    singles = {}
    for system in ("A", "B"):
        merged: dict[str, float] = {}
        for family, metrics in (("clip", "ref-clip-s,clip-s"), ("pac-s", "pac-s,ref-pac-s"),
                                ("pac-s++", "pac-s++,ref-pac-s++")):
            single = folder / f"single-{system}-{family}.json"
            assert _evaluate(folder, "--candidates", folder / f"{system}.json", "--metrics", metrics, *common,
                             *models[family], "--out", single) == 0
            merged.update(json.loads(single.read_text())["metrics"])
        singles[system] = merged
    for row in table["rows"]:
        assert {m: row["values"][m] for m in CONTRASTIVE} == singles[row["system"]]  # exactly: the same batches
    columns = table["columns"]
    assert (columns["clip-s"]["model"], columns["clip-s"]["family"], columns["clip-s"]["w"]) == ("tiny-random", "clip", 2.5)
    assert (columns["pac-s"]["family"], columns["pac-s"]["family_source"], columns["pac-s"]["w"]) == \
        ("pac-s", "user --family", 2.0)
    assert (columns["pac-s++"]["family"], columns["pac-s++"]["w"]) == ("pac-s++", 2.5)
    assert columns["ref-pac-s++"]["model"] == columns["pac-s++"]["model"]  # the Ref- variant shares its model
    assert columns["pac-s"]["given"] == f"--metric-model pac-s={c_file},arch={root / 'C' / 'arch.json'},family=pac-s"
    assert columns["cider"]["printed_scale"] == 100 and columns["pac-s"]["printed_scale"] == 1
    assert columns["incorrect"]["better"] == "lower" and columns["clip-s"]["group"] == "reference-free"
    # the official code's values for the same image/caption pairs
    expected = {name: json.loads((root / name / "expected.json").read_text())["instances"] for name in ("A", "C")}
    for row in table["rows"]:
        rows = fixture_systems["chosen"][row["system"]]
        assert row["values"]["pac-s"] == pytest.approx(np.mean([expected["C"][r]["pac_s"] for r in rows]), abs=1e-4)
        assert row["values"]["pac-s++"] == pytest.approx(np.mean([expected["A"][r]["pac_s_w2.5"] for r in rows]),
                                                         abs=1e-4)
    # the printed table: CIDEr ×100, the contrastive columns as they are
    line = next(text for text in printed.splitlines() if text.startswith("A "))
    cells = line.split()
    assert cells[1] == f"{100 * table['rows'][0]['values']['cider']:.2f}"
    assert cells[2] == f"{table['rows'][0]['values']['ref-clip-s']:.3f}"


def test_the_model_of_a_column_is_shown_in_the_html_and_the_plot_labels(fixture_systems):
    from pacs.eval.report import system_table_section

    folder, root = fixture_systems["dir"], fixture_systems["root"]
    out, page = folder / "shown.json", folder / "shown.html"
    assert _evaluate(folder, "--candidates", f"A={folder / 'A.json'}", f"B={folder / 'B.json'}",
                     "--metrics", "clip-s,pac-s++,cider", "--images", fixture_systems["image_dir"],
                     "--metric-model", "clip-s=tiny-random,w=2",
                     "--metric-model", f"pac-s++={root / 'A' / 'PAC++_tiny_A.pth'},arch={root / 'A' / 'arch.json'}",
                     "--bootstrap", "0", "--out", out, "--html", page, "--plot", folder / "shown.png") == 0
    table = json.loads(out.read_text())
    assert table["columns"]["clip-s"]["w"] == 2.0
    text = page.read_text()
    assert "<small>tiny-random (clip, w=2)</small>" in text
    assert f"<small>{table['columns']['pac-s++']['model']} (pac-s++, w=2.5)</small>" in text
    cider = table["rows"][0]["values"]["cider"]
    assert f"<td>{100 * cider:.2f}</td>" in system_table_section(table)  # ×100 in the HTML too
    assert (folder / "shown.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_metric_model_for_a_metric_not_in_the_table_or_malformed_is_one_error(fixture_systems, capsys):
    folder = fixture_systems["dir"]
    base = ["--candidates", f"A={folder / 'A.json'}", "--images", fixture_systems["image_dir"], "--bootstrap", "0"]
    for flags, message in ((["--metrics", "clip-s", "--metric-model", "pac-s=tiny-random"], "not among the metrics"),
                           (["--metrics", "clip-s", "--metric-model", "cider=tiny-random"], "not a contrastive metric"),
                           (["--metrics", "clip-s", "--metric-model", "clip-s=tiny-random,depth=3"], "'depth=3'"),
                           (["--metrics", "clip-s", "--metric-model", "clip-s"], "expected METRIC=SPEC")):
        out = folder / "refused.json"
        assert _evaluate(folder, *base, *flags, "--out", out) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0] and not out.exists(), err


# --------------------------------------------------------------------------------------------- LaTeX / Markdown

SYSTEMS = {"Show & Tell_1": {"1": "a dog runs on the grass", "2": "a cat sleeps on a bed", "3": "a man rides a bike"},
           "50% {cats}": {"1": "a dog a dog a dog", "2": "a cat on the", "3": "a man on a bike on a"},
           "plain": {"1": "a brown dog runs", "2": "a cat sleeps", "3": "a man rides a red bike down the street"}}
REFERENCES = {"1": ["a brown dog runs on the green grass", "a dog running", "the dog runs outside"],
              "2": ["a cat sleeps on a bed", "a sleeping cat", "a cat on a bed"],
              "3": ["a man rides a bike", "a cyclist on the road", "a man on a red bike"]}
TEXT_METRICS = "bleu1,cider,rep1,incorrect,length"


@pytest.fixture(scope="module")
def text_table():
    from pacs.eval import evaluate_systems

    return evaluate_systems(SYSTEMS, REFERENCES, TEXT_METRICS, bootstrap=0, human_baseline=True, seed=3)


def _independent_best(table) -> dict[str, set[str]]:
    """The best printed value per column by hand: ×100 and 1 decimal for text metrics, 2 decimals otherwise;
    max for BLEU/CIDEr, min for Rep-1 / %Incorrect, none for length; the human row not ranked."""
    rows = [r for r in table["rows"] if r["system"] != "human"]
    best = {}
    for metric, scale, decimals, pick in (("bleu1", 100, 1, max), ("cider", 100, 1, max), ("rep1", 1, 2, min),
                                          ("incorrect", 1, 2, min)):
        printed = {r["system"]: round(r["values"][metric] * scale, decimals) for r in rows}
        top = pick(printed.values())
        best[metric] = {name for name, value in printed.items() if value == top}
    best["length"] = set()
    return best


def _balanced(text: str) -> bool:
    depth = 0
    for char in re.sub(r"\\[{}]", "", text):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def test_latex_is_compile_shaped_grouped_and_bolds_the_best_per_column(text_table):
    from pacs.eval.table_export import table_latex

    latex = table_latex(text_table)
    assert _balanced(latex)
    assert latex.count("\\begin{tabular}{lccccc}") == 1 and latex.count("\\end{tabular}") == 1
    assert latex.index("\\begin{tabular}") < latex.index("\\end{tabular}")
    # the papers' groups: reference-based B-1, C; then fluency Rep-1, %Incorrect, Length
    assert "\\multicolumn{2}{c}{Reference-based} & \\multicolumn{3}{c}{Fluency} \\\\" in latex
    assert "Model & B-1 & C & Rep-1 $\\downarrow$ & \\%Incorrect $\\downarrow$ & Length \\\\" in latex
    body = latex[latex.index("Length \\\\"):latex.index("\\bottomrule")]
    rows = [line for line in body.splitlines() if line.endswith("\\\\")][1:]
    assert len(rows) == len(SYSTEMS) + 1  # one row per system and the human row
    names = [row.split(" & ")[0] for row in rows]
    assert names == ["Show \\& Tell\\_1", "50\\% \\{cats\\}", "plain", "Humans"]  # escaped user text
    best = _independent_best(text_table)
    order = ["bleu1", "cider", "rep1", "incorrect", "length"]
    for row, table_row in zip(rows, text_table["rows"]):
        cells = row.removesuffix(" \\\\").split(" & ")[1:]
        for metric, cell in zip(order, cells):
            assert cell.startswith("\\textbf{") == (table_row["system"] in best[metric]), (metric, row)
            value = table_row["values"][metric]
            expected = "-" if value is None else f"{value * (100 if metric in ('bleu1', 'cider') else 1):.{1 if metric in ('bleu1', 'cider') else 2}f}"
            assert cell.removeprefix("\\textbf{").removesuffix("}") == expected
    assert any(best[m] for m in order)


def test_markdown_has_a_row_per_system_and_bolds_the_best_per_column(text_table):
    from pacs.eval.table_export import table_markdown

    markdown = table_markdown(text_table)
    lines = markdown.splitlines()
    assert lines[0].startswith("Columns: Reference-based: B-1, C · Fluency: Rep-1, %Incorrect, Length")
    header = lines.index("| Model | B-1 | C | Rep-1 ↓ | %Incorrect ↓ | Length |")
    assert lines[header + 1] == "|---|---:|---:|---:|---:|---:|"
    rows = [line for line in lines[header + 2:] if line.startswith("| ")]
    assert len(rows) == len(SYSTEMS) + 1
    best = _independent_best(text_table)
    for row, table_row in zip(rows, text_table["rows"]):
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]]
        assert cells[0] == {"Show & Tell_1": "Show & Tell\\_1"}.get(table_row["system"],
                                                                    "Humans" if table_row["system"] == "human"
                                                                    else table_row["system"])
        for metric, cell in zip(["bleu1", "cider", "rep1", "incorrect", "length"], cells[1:]):
            assert cell.startswith("**") == (table_row["system"] in best[metric]), (metric, row)


def test_evaluate_writes_latex_and_markdown_files(fixture_systems):
    folder = fixture_systems["dir"]
    tex, md = folder / "t.tex", folder / "t.md"
    assert _evaluate(folder, "--candidates", f"A={folder / 'A.json'}", f"B={folder / 'B.json'}", "--metrics",
                     "length,rep1", "--bootstrap", "0", "--latex", tex, "--markdown", md) == 0
    assert "\\begin{tabular}" in tex.read_text() and "| A |" in md.read_text()


def test_in_memory_captions_give_the_table_of_files(text_table, tmp_path):
    from pacs.eval import evaluate_systems

    files = []
    for index, (name, captions) in enumerate(SYSTEMS.items()):
        path = tmp_path / f"s{index}.json"
        path.write_text(json.dumps(captions))
        files.append(f"{name}={path}")
    (tmp_path / "refs.json").write_text(json.dumps(REFERENCES))
    from_files = evaluate_systems(files, tmp_path / "refs.json", TEXT_METRICS, bootstrap=0, human_baseline=True, seed=3)
    assert [r["values"] for r in from_files["rows"]] == [r["values"] for r in text_table["rows"]]
    assert text_table["rows"][0]["file"] is None and text_table["provenance"]["config"]["references"] == "in memory"
    # lengths by hand
    assert [r["values"]["length"] for r in text_table["rows"][:3]] == \
        [np.mean([len(c.split()) for c in captions.values()]) for captions in SYSTEMS.values()]


# --------------------------------------------------------------------------------------------- colours, header, SPICE

def _toy_table():
    return {"header": "toy", "metrics": ["cider", "incorrect", "length"], "baseline": "base",
            "columns": {"cider": {"printed_scale": 100.0}},
            "rows": [{"system": "base", "values": {"cider": 0.5, "incorrect": 10.0, "length": 8.0}},
                     {"system": "new", "values": {"cider": 0.9, "incorrect": 40.0, "length": 10.0},
                      "delta": {"cider": 0.4, "incorrect": 30.0, "length": 2.0},
                      "delta_ci": {"cider": [0.1, 0.6], "incorrect": [20.0, 40.0], "length": [1.0, 3.0]}},
                     {"system": "other", "values": {"cider": 0.7, "incorrect": 20.0, "length": 9.0},
                      "delta": {"cider": -0.3, "incorrect": -5.0, "length": -1.0},
                      "delta_ci": {"cider": [-0.5, -0.1], "incorrect": [-8.0, -2.0], "length": [-2.0, -0.5]}}]}


def test_colours_mean_better_or_worse_by_the_metric_direction():
    """+30 %Incorrect is worse, +0.4 CIDEr better; -5 %Incorrect better, -0.3 CIDEr worse; length has no
    direction; the heat map runs from each metric's worst (0) to its best (1) row."""
    from pacs.eval.report import normalised_columns, system_table_section

    section = system_table_section(_toy_table())
    delta = section[section.index('id="delta-table"'):]
    cells = re.findall(r'<td class="([^"]*)">([^<]*)<br>', delta)
    assert cells == [("ci-up ci-better", "+40.0"), ("ci-up ci-worse", "+30.0"), ("ci-up", "+2.00"),
                     ("ci-down ci-worse", "-30.0"), ("ci-down ci-better", "-5.00"), ("ci-down", "-1.00")]
    grid = normalised_columns(_toy_table())
    assert [line[0] for line in grid] == pytest.approx([0.0, 1.0, 0.5], abs=1e-12)  # CIDEr: 0.5 worst, 0.9 best
    assert [line[1] for line in grid] == pytest.approx([1.0, 0.0, 2 / 3], abs=1e-12)  # %Incorrect: 10 best, 40 worst
    assert [line[2] for line in grid] == pytest.approx([0.0, 1.0, 0.5], abs=1e-12)  # length: lowest to highest


def test_the_printed_header_keeps_every_metric_name_apart():
    from pacs.eval.system_table import table_text

    metrics = ["clip-s", "ref-clip-s", "ref-pac-s++", "pac-s++", "incorrect"]
    table = {"header": "h", "metrics": metrics, "baseline": None,
             "rows": [{"system": "a-very-long-system-name", "values": dict.fromkeys(metrics, 0.123456)}]}
    lines = table_text(table).splitlines()
    assert lines[2].split() == ["system", *metrics]  # `clip-sref-clip-s` no more
    assert lines[3].split() == ["a-very-long-system-name", *["0.123"] * len(metrics)]


def test_an_unavailable_spice_is_tried_and_warned_about_once_per_table(monkeypatch, caplog):
    from pacs.eval import evaluate_systems, text_metrics
    from pacs.eval.spice import SpiceUnavailable

    calls = []

    def unavailable(*args, **kwargs):
        calls.append(1)
        raise SpiceUnavailable("SPICE is unavailable: no CoreNLP jars (test)")

    monkeypatch.setattr(text_metrics, "compute_spice", unavailable)
    with caplog.at_level(logging.WARNING):
        table = evaluate_systems(SYSTEMS, REFERENCES, "spice,length", bootstrap=0, human_baseline=True, seed=3)
    assert len(calls) == 1
    assert [r.getMessage() for r in caplog.records].count("SPICE is unavailable: no CoreNLP jars (test)") == 1
    assert all(row["values"]["spice"] is None and row["unavailable"]["spice"].startswith("SPICE is unavailable")
               for row in table["rows"])
