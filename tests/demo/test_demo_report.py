"""The HTML report: built from a run directory, rendered in headless Chromium (required in CI)."""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from pacs.cli import main as pacs_main
from pacs.eval.report import (
    build_report,
    highlight_caption,
    load_curves,
    load_references,
    recorded_digest,
    report_digest,
    write_report,
)
from pacs.metric.common.errors import InputError

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars")


def chromium_binary() -> str | None:
    """The headless browser to use; in CI (env CI set) its absence is a failure, elsewhere a skip."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is required by the report test in CI (apt-get install -y chromium)")
    pytest.skip("chromium not installed")
    return None


def run_chromium(binary: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Run headless chromium with a private profile folder."""
    profile = tmp_path / "chromium-profile"
    return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def make_run_dir(root: Path) -> Path:
    """A small run directory with every part the report reads."""
    run = root / "run"
    (run / "logs").mkdir(parents=True)
    (run / "correlation").mkdir()
    (run / "gallery").mkdir()
    results = {"columns": ["bleu4", "cider", "rep1"], "baseline": "xe",
               "rows": [{"model": "xe", "bleu4": 0.31, "cider": 1.2, "rep1": 0.5},
                        {"model": "scst-cider", "bleu4": 0.35, "cider": 1.5, "rep1": 0.7,
                         "delta": {"bleu4": 0.04, "cider": 0.3, "rep1": 0.2},
                         "ci": {"bleu4": [-0.01, 0.09], "cider": [0.1, 0.5], "rep1": [0.05, 0.3]}},
                        {"model": "human", "bleu4": None, "cider": 0.9, "rep1": 0.2}],
               "reward_gains": [{"reward": "cider", "xe": 1.2, "scst": 1.5, "delta": 0.3, "ci": [0.1, 0.5]}],
               "findings": ["SCST raised its own reward for cider.", "scst-cider: within noise against XE: bleu4."],
               "replication": {"expected_disagreements": 0.5, "text": "How reproducible: <0.5 & more>."},
               "system_table": {
                   "header": "3 images; human row: one reference per image against the others (the papers' protocol)",
                   "metrics": ["bleu4", "cider", "rep1"], "baseline": "human",
                   "rows": [{"system": "xe", "values": {"bleu4": 0.31, "cider": 1.2, "rep1": 0.5},
                             "delta": {"cider": 0.3, "rep1": 0.3}, "delta_ci": {"cider": [0.1, 0.5], "rep1": [-0.1, 0.6]}},
                            {"system": "scst-cider", "values": {"bleu4": 0.35, "cider": 1.5, "rep1": 0.7},
                             "ci": {"cider": [1.1, 1.9]},
                             "delta": {"cider": 0.6, "rep1": 0.5}, "delta_ci": {"cider": [-0.2, 0.9], "rep1": [0.2, 0.8]}},
                            {"system": "human", "values": {"bleu4": None, "cider": 0.9, "rep1": 0.2}}]}}
    (run / "results.json").write_text(json.dumps(results))
    (run / "config.yaml").write_text("demo:\n  seeds: [0]\n")
    (run / "logs" / "scst.reference.json").write_text(json.dumps({"label": "xe", "values": {"reward": 0.25}}))
    for name in ("scst-cider", "scst-pac-s++"):
        with open(run / "logs" / f"{name}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["step", "reward", "loss", "length", "rep1"])
            for step in range(10):
                writer.writerow([step, step * 0.1, 1 - step * 0.05, 8 + step % 3, 0.5])
    with open(run / "logs" / "xe.csv", "w", newline="") as handle:
        handle.write("step,loss,note\n0,3.0,start\n1,2.5,\n2,2.0,end\n")
    correlation = {"cider": {"tau_b": 40.0, "tau_c": 39.0, "n": 4}}
    (run / "correlation" / "correlation.json").write_text(json.dumps(correlation))
    with open(run / "correlation" / "scores.csv", "w", newline="") as handle:
        handle.write("caption,judge,cider,pac-s++\na,0.0,0.1,0.2\nb,0.5,0.4,0.3\nc,1.0,0.9,0.8\nd,0.2,0.3,0.1\n")
    Image.new("RGB", (32, 32), (200, 30, 30)).save(run / "gallery" / "img-1.png")
    Image.new("RGB", (32, 32), (30, 30, 200)).save(run / "gallery" / "img-2.png")
    gallery = [{"image_id": "img-1", "image": "gallery/img-1.png", "references": ["a red square"],
                "captions": {"xe": {"caption": "a red square", "scores": {"judge": 1.0}, "verdict": "correct"},
                             "scst-cider": {"caption": "a red circle a", "scores": {"judge": 0.5}, "verdict": "wrong",
                                            "highlights": [[6, 12, "absent"], [13, 14, "dangling"]]}}},
               {"image_id": "img-2", "image": "gallery/img-2.png", "references": ["a blue square"],
                "captions": {"xe": {"caption": "a blue square", "verdict": "correct", "highlights": []},
                             "scst-cider": {"caption": "a blue square", "verdict": "correct"}}}]
    (run / "gallery.json").write_text(json.dumps(gallery))
    return run


def test_demo_report_contains_every_section(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path)
    page = build_report(run)
    assert page.count("<tr>") >= 3 and 'id="results-table"' not in page  # the system table is the one table
    assert ">scst-cider<" in page and ">1.50<" in page
    section = page[page.index("<h2>System table</h2>"):page.index("<h2>Changes against the baseline</h2>")]
    assert "the papers&#x27; protocol" in section and 'id="system-plot"' in section
    assert '<td class="name">human</td><td>-</td><td>0.90</td><td>0.20</td>' in section
    assert "<td>1.50<br><small>[1.10, 1.90]</small></td>" in section  # a value with its own interval
    # intervals above 0 against humans: xe's cider (better) and scst-cider's rep1 (worse: Rep-n is lower-better)
    assert section.count('class="ci-up ci-better"') == 1 and section.count('class="ci-up ci-worse"') == 1
    images = re.findall(r'<img [^>]*src="data:image/png;base64,', page)
    # the story figure, system table heat map, xe curves, scst curves, correlation scatter, two gallery images
    assert len(images) == 7
    assert 'class="absent"' not in page
    assert "verdict-wrong" in page
    curves = load_curves(run)
    assert set(curves) == {"scst", "xe"}
    assert set(curves["scst"]["reward"]) == {"cider", "pac-s++"}
    assert "note" not in curves["xe"]  # non-numeric columns are not curves
    assert load_references(run) == {"scst": ("xe", {"reward": 0.25})}
    assert 'data-disagree="1"' in page and 'data-disagree="0"' in page
    assert 'only the 1 image(s)' in page
    assert '<p id="replication">How reproducible: &lt;0.5 &amp; more&gt;.</p>' in page  # escaped, after the findings
    assert page.index('id="findings"') < page.index('id="replication"')


def test_demo_report_highlights_the_given_spans() -> None:
    assert highlight_caption("a red circle a", [[6, 12, "absent"], [13, 14, "dangling"]]) == (
        'a red <mark class="hl-absent">circle</mark> <mark class="hl-dangling">a</mark>')
    assert highlight_caption("a <b> & c", []) == "a &lt;b&gt; &amp; c"
    assert highlight_caption("abc", [[1, 9, "absent"]]) == "abc"  # a span past the end is ignored


def test_demo_report_marks_missing_parts_absent_and_rejects_bad_input(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    page = build_report(empty)
    assert page.count('class="absent"') == 6  # headline, table, gallery, curves, correlation, config
    assert 'id="delta-table"' not in page and 'id="findings"' not in page and "System-level" not in page
    with pytest.raises(InputError, match="not found"):
        build_report(tmp_path / "missing")
    (empty / "results.json").write_text("{broken")
    with pytest.raises(InputError, match="results.json"):
        write_report(empty)
    assert not (empty / "report.html").exists()


REPORT_INPUTS = ["results.json", "config.yaml", "logs/xe.csv", "logs/scst.reference.json", "correlation/correlation.json",
                 "correlation/scores.csv", "gallery.json", "gallery/img-2.png"]


@pytest.mark.parametrize("changed", REPORT_INPUTS)
def test_demo_report_reuse_keeps_the_page_until_an_input_changes(tmp_path: Path, changed: str) -> None:
    run = make_run_dir(tmp_path)
    page = write_report(run, reuse=True)  # no page yet: built
    digest = recorded_digest(page)
    assert digest == report_digest(run) and len(digest) == 64
    page.write_text(page.read_text() + "<!-- kept -->")  # a marker a rebuild would drop
    write_report(run, reuse=True)
    assert page.read_text().endswith("<!-- kept -->")  # same inputs: the page is not rebuilt
    (run / "unrelated.txt").write_text("not read by the report")
    write_report(run, reuse=True)
    assert page.read_text().endswith("<!-- kept -->")
    target = run / changed
    target.write_bytes(target.read_bytes() + (b" " if changed.endswith((".json", ".csv")) else b"\0"))
    assert report_digest(run) != digest
    write_report(run, reuse=True)
    assert not page.read_text().endswith("<!-- kept -->") and recorded_digest(page) == report_digest(run)


def test_demo_report_without_reuse_always_rebuilds(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path)
    page = write_report(run)
    page.write_text(page.read_text() + "<!-- kept -->")
    write_report(run)
    assert not page.read_text().endswith("<!-- kept -->")
    page.write_text("<html>a page written by hand</html>")  # no recorded digest: rebuilt even with reuse
    assert recorded_digest(page) is None
    write_report(run, reuse=True)
    assert recorded_digest(page) == report_digest(run)


def test_demo_report_cli_writes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = make_run_dir(tmp_path)
    assert pacs_main(["report", str(run)]) == 0
    assert (run / "report.html").is_file()
    assert "report.html" in capsys.readouterr().out
    assert pacs_main(["report", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


VIEWPORT = (1280, 900)  # a laptop's first screen
ERROR_HOOK = ("<script>window.pacsErrors=[];window.addEventListener('error',e=>window.pacsErrors.push("
              "String(e.message||e.target&&e.target.src||e)),true);const pacsConsoleError=console.error;"
              "console.error=(...a)=>{window.pacsErrors.push(a.join(' '));pacsConsoleError(...a);};</script>")
BOX_PROBE = ("const box=id=>{const e=document.getElementById(id);if(!e)return 'none';const r=e.getBoundingClientRect();"
             "return [r.left,r.top,r.right,r.bottom].map(Math.round).join(',');};"
             "b.setAttribute('data-headline-box',box('headline'));b.setAttribute('data-figure-box',box('story-figure'));"
             "b.setAttribute('data-viewport',innerWidth+','+innerHeight);"
             "b.setAttribute('data-errors',window.pacsErrors.length+':'+window.pacsErrors.join(' | '));")


def probe_page(report: Path, probe: Path, checks: str) -> None:
    """A copy of the report that hooks every error (uncaught, console.error, a resource that fails) from the first
    byte and, after load, records the `checks` (JS on `b`, the body), the boxes of the headline and the figure, the
    viewport and the errors as attributes of <body>."""
    page = report.read_text()
    page = page.replace("<head>", "<head>" + ERROR_HOOK, 1)
    probe.write_text(page.replace("</body>", "<script>window.addEventListener('load',()=>{const b=document.body;"
                                  f"{checks}{BOX_PROBE}}});</script></body>"))


def boxes_in_first_screen(binary: str, tmp_path: Path, report: Path) -> dict[str, tuple[int, ...]]:
    """Render `report` in a first screen of `VIEWPORT`: no error, the headline and the figure inside it (their
    boxes), and the screenshot of that screen shows the figure (its box is no blank area); the boxes."""
    probe = tmp_path / "first-screen.html"
    probe_page(report, probe, "")
    size = f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}"
    result = run_chromium(binary, tmp_path, size, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    found = dict(re.findall(r'data-(headline-box|figure-box|viewport|errors)="([^"]*)"', result.stdout))
    assert found.get("errors") == "0:", found
    width, height = (int(v) for v in found["viewport"].split(","))  # the window less the browser's own bars
    assert width == VIEWPORT[0] and 700 <= height <= VIEWPORT[1], found
    boxes = {}
    for name in ("headline-box", "figure-box"):
        assert found[name] != "none", name
        left, top, right, bottom = (int(v) for v in found[name].split(","))
        assert 0 <= left < right <= width and 0 <= top < bottom <= height, (name, found[name], VIEWPORT)
        boxes[name] = (left, top, right, bottom)
    assert boxes["headline-box"][3] <= boxes["figure-box"][1]  # the headline, then the figure
    shot = tmp_path / "first-screen.png"
    result = run_chromium(binary, tmp_path, size, f"--screenshot={shot}", report.as_uri())
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size[0] == width and image.size[1] >= height  # the first screen, from the top of the page
    for name, minimum in (("figure-box", 50), ("headline-box", 2)):  # drawn there: a plot, text
        colours = image.crop(boxes[name]).getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > minimum, (name, len(colours or []))
    return boxes


def test_demo_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    binary = chromium_binary()
    run = make_run_dir(tmp_path)
    report = write_report(run)
    # a copy of the page that records, after load, how many images actually decoded
    probe = tmp_path / "probe.html"
    probe_page(report, probe,
               "const ok=[...document.images].filter("
               "i=>i.complete&&i.naturalWidth>0).length;b.setAttribute('data-decoded',ok);"
               "const n=s=>document.querySelectorAll(s).length;"
               "b.setAttribute('data-rows',n('#results-table tbody tr'));"
               "b.setAttribute('data-system-rows',n('#system-table tbody tr'));"
               "b.setAttribute('data-system-delta-rows',n('#system-delta-table tbody tr'));"
               "b.setAttribute('data-delta-rows',n('#delta-table tbody tr'));"
               "b.setAttribute('data-delta-up',n('#delta-table td.ci-up'));"
               "b.setAttribute('data-gain-rows',n('#reward-gains tbody tr'));"
               "b.setAttribute('data-corr-rows',n('#correlation-table tbody tr'));"
               "b.setAttribute('data-findings',n('#findings li'));"
               "b.setAttribute('data-absent',[...document.querySelectorAll('mark.hl-absent')].map(m=>m.textContent)"
               ".join('|'));"
               "b.setAttribute('data-dangling',n('.card mark.hl-dangling'));"
               "const f=document.getElementById('disagree-filter');f.click();"
               "b.setAttribute('data-visible',[...document.querySelectorAll('.gallery .card')]"
               ".filter(c=>c.offsetParent!==null).length);f.click();"
               "b.setAttribute('data-visible-after',[...document.querySelectorAll('.gallery .card')]"
               ".filter(c=>c.offsetParent!==null).length);")
    result = run_chromium(binary, tmp_path, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert 'data-decoded="7"' in dom, dom[:500]  # the story figure, the heat map, 3 plots, 2 gallery images
    assert 'data-errors="0:"' in dom
    assert 'data-rows="0"' in dom and 'data-system-rows="3"' in dom and 'data-system-delta-rows="2"' in dom
    assert 'data-delta-rows="1"' in dom and 'data-delta-up="2"' in dom  # cider and rep1 intervals exclude 0
    assert 'data-gain-rows="1"' in dom and 'data-corr-rows="1"' in dom and 'data-findings="2"' in dom
    assert 'data-absent="absent shape|circle"' in dom  # the legend's mark, then the gallery's
    assert 'data-dangling="1"' in dom
    assert 'data-visible="1"' in dom and 'data-visible-after="2"' in dom  # the filter hides the agreeing image
    boxes_in_first_screen(binary, tmp_path, report)


def test_an_error_on_the_page_is_caught_by_the_probe(tmp_path: Path) -> None:
    """The error hook of the Chromium checks sees a script error and a broken image (else "0 errors" proves
    nothing)."""
    binary = chromium_binary()
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><head></head><body><p id="headline">x</p>'
                    '<img id="story-figure" src="data:image/png;base64,AAAA"><script>undefinedName();</script></body>'
                    "</html>")
    probe = tmp_path / "probe.html"
    probe_page(page, probe, "")
    result = run_chromium(binary, tmp_path, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri())
    errors = re.search(r'data-errors="(\d+):([^"]*)"', result.stdout)
    assert errors is not None and int(errors.group(1)) == 2 and "undefinedName" in errors.group(2), result.stdout[-500:]
