"""Issue 41, round 3 of the attacks: outputs that would replace inputs, repeated JSON keys, formulas in CSV cells and
compare_findings on hostile records, each at smoke size (no model, no Java: length and BLEU only).

Each refusal is one line naming the offending path, key or field, exit 2, and the files given are byte for byte as
they were (and no output was written).
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest
from cli_errors import one_error_line
from PIL import Image
from script_modules import load_tool

from pacs import cli as pacs_cli
from pacs.metric.common.io import csv_cell, csv_cells

ESC = "\x1b"


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (links as their target's bytes) by relative path."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture
def texts(tmp_path: Path) -> Path:
    """References and two systems' captions of two images, as JSON files."""
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "refs.json").write_text(json.dumps({"a": ["a red square", "a red box"],
                                                  "b": ["a blue circle", "a round blue shape"]}))
    (folder / "a.json").write_text(json.dumps({"a": "a red square", "b": "a blue circle"}))
    (folder / "b.json").write_text(json.dumps({"a": "red", "b": "a circle"}))
    return folder


def _evaluate(texts: Path, *extra: str, candidates: tuple[str, ...] | None = None) -> int:
    """`pacs evaluate` of the two systems of `texts` (length and BLEU-1, no bootstrap)."""
    candidates = candidates or (f"a={texts / 'a.json'}", f"b={texts / 'b.json'}")
    return pacs_cli.main(["evaluate", "--candidates", *candidates, "--references", str(texts / "refs.json"),
                          "--metrics", "length,bleu1", "--bootstrap", "0", *extra])


# --- 1. outputs never replace inputs ------------------------------------------------------------------------------

def test_evaluate_out_onto_the_references_is_refused_and_they_stay(texts, capsys):
    before = _snapshot(texts)
    refs = texts / "refs.json"
    code = pacs_cli.main(["evaluate", "--candidates", str(texts / "a.json"), "--references", str(refs),
                          "--metrics", "bleu4", "--out", str(refs)])
    line = one_error_line(capsys, among_other_lines=True, command="evaluate")
    assert code == 2
    assert line == (f"pacs evaluate: error: --out {refs} is the input file of --references: an output never "
                    "replaces an input; nothing was written: choose another path")
    assert _snapshot(texts) == before  # no results in place of the references, no CSV next to them


def test_evaluate_table_out_onto_a_system_file_is_refused(texts, capsys):
    (texts / "a.csv").write_text("mine\n")
    before = _snapshot(texts)
    assert _evaluate(texts, "--out", str(texts / "a.json")) == 2
    line = one_error_line(capsys, among_other_lines=True, command="evaluate")
    assert f"--out {texts / 'a.json'} is the input file of --candidates a:" in line, line
    assert _snapshot(texts) == before


def test_evaluate_out_through_a_symlink_or_a_hard_link_to_an_input_is_refused(texts, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "link.json").symlink_to(texts / "refs.json")
    os.link(texts / "b.json", out / "hard.json")
    before = _snapshot(texts)
    assert _evaluate(texts, "--out", str(out / "link.json")) == 2
    line = one_error_line(capsys, among_other_lines=True, command="evaluate")
    assert line == (f"pacs evaluate: error: --out {out / 'link.json'} is the input file of --references "
                    f"({texts / 'refs.json'}): an output never replaces an input; nothing was written: choose "
                    "another path")
    assert _evaluate(texts, "--html", str(out / "hard.json")) == 2
    line = one_error_line(capsys, among_other_lines=True, command="evaluate")
    assert f"--html {out / 'hard.json'} is the input file of --candidates b ({texts / 'b.json'})" in line, line
    assert _snapshot(texts) == before and (out / "link.json").is_symlink()
    assert sorted(path.name for path in out.iterdir()) == ["hard.json", "link.json"]


@pytest.mark.parametrize("flag", ["--csv", "--html", "--plot", "--latex", "--markdown"])
def test_every_table_output_onto_an_input_is_refused(flag, texts, capsys):
    before = _snapshot(texts)
    assert _evaluate(texts, flag, str(texts / "refs.json")) == 2
    assert f"{flag} {texts / 'refs.json'} is the input file of --references" in one_error_line(capsys, among_other_lines=True, command="evaluate")
    assert _snapshot(texts) == before


def test_two_outputs_on_one_path_are_refused(texts, tmp_path, capsys):
    table = tmp_path / "table.json"
    assert _evaluate(texts, "--out", str(table), "--html", str(table)) == 2
    assert (f"--html {table} is also the --out output: each output needs its own path"
            in one_error_line(capsys, among_other_lines=True, command="evaluate"))
    assert _evaluate(texts, "--out", str(tmp_path / "table.csv")) == 2  # the CSV next to it would be --out itself
    assert (f"the CSV next to --out {tmp_path / 'table.csv'} is also the --out output"
            in one_error_line(capsys, among_other_lines=True, command="evaluate"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["texts"]


def test_the_csv_next_to_out_never_overwrites_an_existing_file(texts, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "table.csv").write_text("my own spreadsheet\n")
    assert _evaluate(texts, "--out", str(out / "table.json")) == 2
    line = one_error_line(capsys, among_other_lines=True, command="evaluate")
    assert line == (f"pacs evaluate: error: {out / 'table.csv'} exists and is the CSV written next to --out "
                    f"{out / 'table.json'}, not an output you named: it is never overwritten and nothing was "
                    f"written; name the CSV with --csv FILE (--csv {out / 'table.csv'} replaces it)")
    assert _snapshot(out) == {"table.csv": b"my own spreadsheet\n"}  # no table.json either
    # named, it is replaced; where nothing exists, it is written next to --out as before
    assert _evaluate(texts, "--out", str(out / "table.json"), "--csv", str(out / "table.csv")) == 0
    assert (out / "table.csv").read_text().startswith("system,kind,n,length,")
    assert _evaluate(texts, "--out", str(out / "fresh.json")) == 0
    assert (out / "fresh.csv").read_text() == (out / "table.csv").read_text()


def _png(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (200, 30, 30)).save(path)
    return path


def test_score_refuses_outputs_onto_its_candidates_images_and_checkpoint_before_loading_a_model(tmp_path, capsys):
    images = tmp_path / "images"
    _png(images / "a.png")
    elsewhere = _png(tmp_path / "elsewhere" / "b.png")
    candidates = tmp_path / "candidates.json"
    candidates.write_text(json.dumps({"a": "a red square", "b": "a red square"}))
    image_map = tmp_path / "map.json"
    image_map.write_text(json.dumps({"a": str(images / "a.png"), "b": str(elsewhere)}))
    checkpoint = tmp_path / "model.pt"
    checkpoint.write_bytes(b"not a model: never read when the output is refused")
    before = _snapshot(tmp_path)

    def score(*extra: str) -> int:
        return pacs_cli.main(["score", "--metric", "clip-s", "--candidates", str(candidates), *extra])

    assert score("--images", str(images), "--out", str(candidates)) == 2
    assert f"--out {candidates} is the input file of --candidates:" in one_error_line(capsys, among_other_lines=True, command="score")
    assert score("--images", str(images), "--out", str(images / "a.png")) == 2
    line = one_error_line(capsys, among_other_lines=True, command="score")
    assert f"--out {images / 'a.png'} is an existing file in {images}, the input folder of --images" in line, line
    assert score("--image-map", str(image_map), "--out", str(elsewhere)) == 2  # an image the map points to
    assert f"--out {elsewhere} is the input file of image 'b'" in one_error_line(capsys, among_other_lines=True, command="score")
    assert score("--images", str(images), "--checkpoint", str(checkpoint), "--out", str(checkpoint)) == 2
    assert f"--out {checkpoint} is the input file of --checkpoint" in one_error_line(capsys, among_other_lines=True, command="score")
    assert _snapshot(tmp_path) == before


def test_score_video_refuses_an_out_onto_its_references(tmp_path, capsys):
    candidates = tmp_path / "candidates.json"
    candidates.write_text(json.dumps({"v": "a red square"}))
    references = tmp_path / "refs.json"
    references.write_text(json.dumps({"v": ["a red square"]}))
    before = _snapshot(tmp_path)
    code = pacs_cli.main(["score-video", "--metric", "ref-pac-s++", "--candidates", str(candidates), "--references",
                          str(references), "--videos", str(tmp_path), "--out", str(references)])
    assert code == 2
    assert f"--out {references} is the input file of --references:" in one_error_line(capsys, among_other_lines=True, command="score-video")
    assert _snapshot(tmp_path) == before


def test_correlate_refuses_an_out_onto_its_data_file_or_a_file_of_its_data_folder(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "annotations.json").write_text("[]")
    before = _snapshot(tmp_path)
    for given, out in ((data / "annotations.json", data / "annotations.json"), (data, data / "annotations.json")):
        code = pacs_cli.main(["correlate", "flickr8k-expert", "--data", str(given), "--metrics", "length",
                              "--out", str(out)])
        assert code == 2
        line = one_error_line(capsys, among_other_lines=True, command="correlate")
        assert line.startswith(f"pacs correlate: error: --out {out} is ") and "--data" in line, line
    assert _snapshot(tmp_path) == before


def test_report_refuses_an_out_onto_its_run_files_or_the_run_directory(texts, tmp_path, capsys):
    run = tmp_path / "run"
    assert _evaluate(texts, "--out", str(run / "results.json")) == 0
    capsys.readouterr()
    before = _snapshot(run)
    assert pacs_cli.main(["report", str(run), "--out", str(run / "results.json")]) == 2
    line = one_error_line(capsys, among_other_lines=True, command="report")
    assert line.startswith(f"pacs report: error: --out {run / 'results.json'} is the input file of the report of "
                           f"{run}:"), line
    assert pacs_cli.main(["report", str(run), "--out", str(run)]) == 2
    assert f"--out {run} is the run directory {run}" in one_error_line(capsys, among_other_lines=True, command="report")
    assert _snapshot(run) == before


# --- 2. duplicate keys ----------------------------------------------------------------------------------------------

def test_a_key_repeated_in_the_candidates_of_score_is_refused_naming_it_and_the_file(tmp_path, capsys):
    candidates = tmp_path / "candidates.json"
    candidates.write_text('{"ID": "first", "ID": "second"}')
    code = pacs_cli.main(["score", "--metric", "clip-s", "--candidates", str(candidates), "--images", str(tmp_path)])
    assert code == 2
    assert one_error_line(capsys, among_other_lines=True, command="score") == (
        f'pacs score: error: {candidates}: the key "ID" appears twice in one object of the candidates file (JSON '
        "keys must be unique: which value is meant?)")


def test_a_key_repeated_deep_in_the_references_or_a_run_file_is_refused(texts, tmp_path, capsys):
    (texts / "refs.json").write_text('{"a": ["a red square"], "b": ["a blue circle"], "a": ["again"]}')
    assert _evaluate(texts) == 2
    line = one_error_line(capsys, among_other_lines=True, command="evaluate")
    assert f'{texts / "refs.json"}: the key "a" appears twice in one object' in line, line
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text('{"rows": [{"model": "x", "model": "y"}], "columns": []}')
    assert pacs_cli.main(["report", str(run)]) == 2
    assert f'{run / "results.json"}: the key "model" appears twice' in one_error_line(capsys, among_other_lines=True, command="report")
    assert not (run / "report.html").exists()


def test_a_repeated_key_with_control_characters_is_shown_escaped():
    from pacs.metric.common.errors import InputError
    from pacs.metric.common.json_input import parse_json_text

    with pytest.raises(InputError) as caught:
        parse_json_text('[{"k\\u001b[2J": 1, "k\\u001b[2J": 2}]', "f.json", "captions")
    assert str(caught.value) == ('f.json: the key "k\\u001b[2J" appears twice in one object of the captions file '
                                 "(JSON keys must be unique: which value is meant?)")


# --- 3. CSV formula injection -------------------------------------------------------------------------------------

def test_csv_cell_neutralises_formula_starts_and_keeps_numbers():
    assert [csv_cell(v) for v in ("=1+2", "+HYPERLINK(\"http://evil/\")", "-2+3", "@SUM(A1)", "\tx", "\rx")] == [
        "'=1+2", "'+HYPERLINK(\"http://evil/\")", "'-2+3", "'@SUM(A1)", "'\tx", "'\rx"]
    assert [csv_cell(v) for v in ("-0.5", "+1e-3", "-inf", "plain", "a=b", "", -0.5, 3, None)] == [
        "-0.5", "+1e-3", "-inf", "plain", "a=b", "", -0.5, 3, None]
    assert csv_cells({"system": "@x", "n": 2}) == {"system": "'@x", "n": 2}
    assert csv_cells(["+x", "-1"]) == ["'+x", "-1"]


def test_a_system_named_as_a_formula_is_text_in_the_table_csv_and_negative_numbers_stay(texts, tmp_path, capsys):
    from pacs.eval.system_table import table_csv

    evil = '+HYPERLINK("http://evil/"&A1)'
    out = tmp_path / "table.json"
    code = _evaluate(texts, "--out", str(out), "--baseline", "a",
                     candidates=(f"a={texts / 'a.json'}", f"{evil}={texts / 'b.json'}", f"@cmd={texts / 'a.json'}"))
    assert code == 0, capsys.readouterr().err
    rows = list(csv.DictReader(io.StringIO((tmp_path / "table.csv").read_text())))
    assert [row["system"] for row in rows] == ["a", "'" + evil, "'@cmd"]
    assert json.loads(out.read_text())["rows"][1]["system"] == evil  # the JSON keeps the name as given
    assert float(rows[1]["length_delta"]) < 0 and rows[1]["length_delta"].startswith("-")  # a number, unquoted
    table = json.loads(out.read_text())
    table["rows"][0]["system"] = "-2+3"
    assert list(csv.reader(io.StringIO(table_csv(table))))[1][0] == "'-2+3"


# --- 4. compare_findings on hostile records -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tool():
    """tools/compare_findings.py as a module."""
    return load_tool("compare_findings")


def _findings(path: Path, findings: object) -> Path:
    path.write_text(json.dumps({"rows": [], "findings": findings}))
    return path


def test_compare_findings_escapes_control_characters_and_keeps_exit_1_for_differing_runs(tool, tmp_path, capsys):
    a = _findings(tmp_path / "a.json", [{"subject": f"scst{ESC}[2J\r", "claim": "rises\u202e", "holds": True}])
    b = _findings(tmp_path / "b.json", [{"subject": f"scst{ESC}[2J\r", "claim": "rises\u202e", "holds": False}])
    assert tool.main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines() == ["0 claims alike, 1 differ",
                                "  differs: scst\\x1b[2J\\x0d: rises\\u202e — A: True, B: False"]
    assert ESC not in out and "\r" not in out and "\u202e" not in out


@pytest.mark.parametrize("content, message", [
    ([{"subject": ["a", "list"], "claim": "c", "holds": True}], "findings[0].subject: expected a string, got list"),
    ([{"subject": "s", "claim": "c", "holds": True, "replication": {"agrees": "high"}}],
     "findings[0].replication.agrees: expected a probability (a number in [0, 1]) or null, got 'high'"),
    ([{"subject": "s", "claim": "c", "holds": True, "replication": [0.5]}],
     "findings[0].replication: expected an object, got list"),
    ([{"subject": "s", "claim": "c", "holds": {"x": 1}}], "findings[0].holds: expected true, false or a string"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply to read"),
    ("{not json", "invalid JSON"),
    ('{"findings": [], "findings": []}', 'the key "findings" appears twice'),
])
def test_compare_findings_malformed_input_is_one_line_exit_2(content, message, tool, tmp_path, capsys):
    good = _findings(tmp_path / "good.json", [{"subject": "s", "claim": "c", "holds": True}])
    bad = tmp_path / "bad.json"
    if isinstance(content, str):
        bad.write_text(content)
    else:
        _findings(bad, content)
    assert tool.main([str(good), str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(f"compare_findings: error: {bad}"), captured.err
    assert message in captured.err, captured.err


def test_compare_findings_refuses_a_fifo_and_a_device_without_reading_them(tool, tmp_path, capsys):
    good = _findings(tmp_path / "good.json", [{"subject": "s", "claim": "c", "holds": True}])
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it to read would block until a writer comes: never opened
    for special in (fifo, Path("/dev/zero")):
        assert tool.main([str(good), str(special)]) == 2
        err = capsys.readouterr().err
        assert err == (f"compare_findings: error: {special}: not a regular file (a FIFO, a device or a folder): a "
                       "findings file is a results.json or demo_findings.json\n")
