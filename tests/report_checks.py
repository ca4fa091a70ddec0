"""Checks of a finished run's report.html that every end-to-end run test shares (the demo's smoke run, the Flickr8k
recipe): the headline is the one its findings generate, the figure follows it, one system table without constant
or empty columns, unique row labels in every table, the provenance section (issue 42 item 3)."""
from __future__ import annotations

import html
import re
from pathlib import Path

from pacs.eval.report import load_results
from pacs.eval.report_inputs import read_input_json, results_file
from pacs.eval.report_story import headline

TABLES = ("system-table", "results-table", "reward-gains", "delta-table", "system-delta-table")


def table_html(page: str, table_id: str) -> str | None:
    """The HTML of the table with `table_id` (None: not on the page)."""
    marker = f'id="{table_id}"'
    if marker not in page:
        return None
    start = page.index(marker)
    return page[start:page.index("</table>", start)]


def check_story_report(run_dir: Path) -> str:
    """Assert the story of `run_dir/report.html` (see the module); return the page."""
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    results = read_input_json(results_file(run_dir))
    _, rows = load_results(run_dir)
    expected = headline({**results, "rows": rows})
    found = re.search(r'<p id="headline">(.*?)</p>', page)
    assert found is not None and expected and 2 <= len(expected) <= 3, expected
    assert found.group(1) == " ".join(html.escape(sentence) for sentence in expected)
    assert page.index('id="headline"') < page.index('id="story-figure"') < page.index("<h2>")  # the first screen
    assert ('id="system-table"' in page) != ('id="results-table"' in page)  # one system table
    for table_id in TABLES:
        table = table_html(page, table_id)
        if table is None:
            continue
        labels = re.findall(r'<tr><td class="name">(.*?)</td>', table)
        assert labels and len(labels) == len(set(labels)), (table_id, labels)
        if table_id in ("system-table", "results-table"):
            body = table[table.index("<tbody>"):]
            cells = [re.findall(r"<td>(.*?)(?:<br>.*?)?</td>", line) for line in body.split("</tr>") if "<td" in line]
            for index in range(len(cells[0])):
                printed = {line[index] for line in cells if line[index] not in ("-", "")}
                assert len(printed) > 1, (table_id, index, printed)  # no constant, no empty column
    section = page[page.index('id="provenance"'):]
    for label in ("pacs version", "git commit", "command", "date", "wall time", "machine", "seeds"):
        assert f'<td class="name">{label}</td>' in section, label
    assert "<summary>config.yaml</summary>" in section
    return page
