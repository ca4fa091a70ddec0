"""The report's story (issue 42 item 3): the headline generated from finding records, the findings ranked, labels
unique per row, constant and empty columns folded, provenance recorded and shown, the paper figure's data."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from pacs.eval.finding_claims import (
    CLAIM_GUARD,
    CLAIM_INERT,
    CLAIM_JUDGE,
    CLAIM_REWARD_RISES,
    gamed_claim,
    guard_of_claim,
)
from pacs.eval.report import build_report
from pacs.eval.report_figures import constant_columns, forest_rows, gain_points, story_figure, unique_labels
from pacs.eval.report_provenance import record_provenance
from pacs.eval.report_story import headline, ranked_findings


def _record(subject: str, claim: str, point: float, low: float, high: float, column: str = "Judge-acc",
            unit: str = " pts", holds: object = True, agrees: float | None = 0.99, **extra: object) -> dict:
    record = {"subject": subject, "claim": claim, "holds": holds, "seeds": {},
              "interval": {"column": column, "point": point, "low": low, "high": high, "unit": unit},
              "text": f"{subject}: {claim}.", **extra}
    if agrees is not None:
        record["replication"] = {"agrees": agrees}
    return record


FINDINGS = [
    _record("scst cider", CLAIM_REWARD_RISES, 0.3, 0.1, 0.5, "reward", ""),
    _record("scst cider", CLAIM_JUDGE[1], 4.0, 1.5, 6.5, agrees=0.95,
            share_of_oracle={"point": 0.4, "interval": [0.1, 0.7]}),
    _record("scst clip-s", CLAIM_JUDGE[-1], -6.0, -9.0, -3.0),
    _record("scst judge", CLAIM_JUDGE[1], 10.0, 8.0, 12.0, agrees=1.0),
    _record("scst clip-s", gamed_claim("Length"), -2.0, -3.0, -1.0, "Length", "", agrees=0.7),
    _record("scst clip-s", gamed_claim("Rep-2"), 0.05, 0.01, 0.09, "Rep-2", "", agrees=0.93),
    _record("scst pac-s++", CLAIM_JUDGE[0], 1.0, -2.0, 3.0, holds="seed-dependent", agrees=None),
    _record("scst clip-s +KL", CLAIM_GUARD, 0.5, -1.0, 2.0, agrees=0.92),
]


def test_the_headline_is_generated_from_the_finding_records() -> None:
    sentences = headline({"findings": FINDINGS, "oracle": "scst judge", "baseline": "xe"})
    assert sentences == [
        # the best by the judge, the oracle left out and named with its own gain
        ("By the judge, the best reward is scst cider: judge accuracy rises beyond noise against xe (Judge-acc "
        "+4.00 pts [+1.50, +6.50]), 40% of the oracle's gain; the oracle (scst judge, the judge as the reward) "
        "reaches Judge-acc +10.0 pts [+8.00, +12.0]."),
        # the gamed claims that hold, each signature, the fragile one marked
        ("scst clip-s was gamed: its own reward rose beyond noise while judge accuracy did not, with shorter captions "
        "(fragile: a replication agrees with probability 0.70) and more repeated word pairs."),
        ("The KL guard of scst clip-s +KL held (Judge-acc +0.500 pts [-1.00, +2.00]) (a guard holds when its reward "
        "rises and judge accuracy does not fall).")]


def test_the_headline_follows_the_records_not_the_order_or_wording_of_the_page() -> None:
    # the best system changes with the records; two gamed systems; a guard that failed; no gaming at all
    worse = [dict(r) for r in FINDINGS]
    worse[2] = _record("scst clip-s", CLAIM_JUDGE[1], 5.0, 2.0, 8.0, agrees=0.5)  # now above scst cider
    worse[-1] = _record("scst clip-s +KL", CLAIM_GUARD, -4.0, -6.0, -2.0, holds=False)
    worse.append(_record("scst pac-s++", gamed_claim("Length"), -1.0, -2.0, -0.5, "Length", ""))
    first, second, third = headline({"findings": worse, "oracle": "scst judge"})
    assert first.startswith("By the judge, the best reward is scst clip-s: judge accuracy rises beyond noise against "
                            "xe (Judge-acc +5.00 pts [+2.00, +8.00]) (fragile: a replication agrees with probability "
                            "0.50); the oracle")
    assert second == ("scst clip-s (with shorter captions (fragile: a replication agrees with probability 0.70) and "
                      "more repeated word pairs) and scst pac-s++ (with shorter captions) were gamed: each one's own "
                      "reward rose beyond noise while judge accuracy did not.")
    assert third.startswith("The KL guard of scst clip-s +KL did not hold (Judge-acc -4.00 pts [-6.00, -2.00])")
    clean = [r for r in FINDINGS if "gamed" not in r["claim"] and r["claim"] != CLAIM_GUARD]
    assert headline({"findings": clean, "oracle": "scst judge"})[1].startswith("No reward was gamed beyond noise")


def test_every_guard_of_the_menu_is_read_and_many_guarded_rows_are_named_when_held_and_counted_otherwise() -> None:
    mask = "the length mask guard keeps judge accuracy while its reward rises"
    combined = "the combination of guards keeps judge accuracy while its reward rises"
    bare = "guard keeps judge accuracy while its reward rises"
    assert [guard_of_claim(c) for c in (CLAIM_GUARD, mask, combined, CLAIM_JUDGE[1], bare)] == [
        "the KL guard", "the length mask guard", "the combination of guards", None, None]
    one = [*FINDINGS[:-1], _record("scst pac-s++ +length mask", mask, 1.5, 0.5, 2.5)]
    assert headline({"findings": one, "oracle": "scst judge"})[2] == (
        "The length mask guard of scst pac-s++ +length mask held (Judge-acc +1.50 pts [+0.500, +2.50]) (a guard "
        "holds when its reward rises and judge accuracy does not fall).")
    many = [*one, _record("scst pac-s++ +KL", CLAIM_GUARD, -3.0, -5.0, -1.0, holds=False),
            _record("scst pac-s++ +guards", combined, 0.2, -1.0, 1.4, holds="seed-dependent", agrees=None),
            _record("scst ref-pac-s++ +KL", CLAIM_GUARD, 2.0, 1.0, 3.0, agrees=0.8),
            _record("scst pac-s++ +early stop", CLAIM_INERT, -7.0, -17.0, 1.0)]
    assert headline({"findings": many, "oracle": "scst judge"})[2] == (
        "The length mask guard of scst pac-s++ +length mask (Judge-acc +1.50 pts [+0.500, +2.50]) and the KL guard "
        "of scst ref-pac-s++ +KL (Judge-acc +2.00 pts [+1.00, +3.00]) (fragile: a replication agrees with "
        "probability 0.80) held; of the other 3 guarded rows, 1 did not hold, 1 seed-dependent and 1 never acted "
        "(a guard holds when its reward rises and judge "
        "accuracy does not fall).")


def test_a_run_where_nothing_moved_says_so_instead_of_naming_a_best() -> None:
    flat = [_record("scst cider", CLAIM_REWARD_RISES, 0.002, -0.006, 0.014, "reward", "", holds=False),
            _record("scst cider", CLAIM_JUDGE[0], 0.0, 0.0, 0.0), _record("scst clip-s", CLAIM_JUDGE[0], 0.0, 0.0, 0.0),
            _record("scst judge", CLAIM_JUDGE[0], 0.0, 0.0, 0.0)]
    assert headline({"findings": flat, "oracle": "scst judge"}) == [
        ("By the judge, no reward raised judge accuracy beyond noise against xe: the highest change is scst cider's "
         "(Judge-acc +0.000 pts [+0.000, +0.000], tied with 1 other); the oracle (scst judge, the judge as the "
         "reward) reaches Judge-acc +0.000 pts [+0.000, +0.000]."),
        "No reward was gamed, and none rose beyond noise either: SCST moved no reward this run can tell from noise."]


def test_a_run_without_a_judge_is_headlined_by_its_metric() -> None:
    rows = [{"model": "xe", "test_set": "flickr8k", "C": 40.0},
            {"model": "cider", "test_set": "flickr8k", "C": 48.0, "delta": {"C": 8.0}, "ci": {"C": [3.0, 13.0]}},
            {"model": "pac-s++", "test_set": "flickr8k", "C": 38.0, "delta": {"C": -2.0}, "ci": {"C": [-5.0, 1.0]}},
            {"model": "cider", "test_set": "coco", "C": 90.0, "delta": {"C": 50.0}, "ci": {"C": [40.0, 60.0]}}]
    assert headline({"rows": rows}) == [
        ("By C on flickr8k, the best system is cider: +8.00 [+3.00, +13.0] against xe, beyond noise (paired 95% "
        "interval)."),
        ("The run has no judge, so whether a reward was gamed is not assessed here: read the gallery and the "
        "degenerate columns (length, repetition).")]
    rows[1]["ci"]["C"] = [-1.0, 13.0]  # now within noise: no best is named
    assert headline({"rows": rows})[0] == ("By C on flickr8k, no system is above xe beyond noise: the highest change "
                                           "is cider's, +8.00 [-1.00, +13.0] (paired 95% interval).")


def test_findings_are_ranked_robust_first_fragile_then_seed_dependent() -> None:
    ranked = ranked_findings([*FINDINGS, "an old sentence"])
    kinds = [kind for _, kind in ranked]
    assert kinds == ["robust"] * 6 + ["fragile", "seed-dependent", "unrated"]
    robust = [finding["replication"]["agrees"] for finding, kind in ranked if kind == "robust"]
    assert robust == sorted(robust, reverse=True) == [1.0, 0.99, 0.99, 0.95, 0.93, 0.92]
    assert ranked[6][0]["claim"] == gamed_claim("Length") and ranked[-1][0] == "an old sentence"


def test_labels_are_made_unique_by_their_hint_then_their_position() -> None:
    assert unique_labels(["cider:1,pac-s++:0.5", "cider:1,pac-s++:0.5", "cider"],
                         ["scst-mix", "scst-mix-norm", "scst-cider"]) == [
        "cider:1,pac-s++:0.5 [scst-mix]", "cider:1,pac-s++:0.5 [scst-mix-norm]", "cider"]
    assert unique_labels(["a", "a", "b"]) == ["a #1", "a #2", "b"]


def test_constant_and_empty_columns_are_told_apart_from_the_shown_ones() -> None:
    rows = [{"C": 1.0, "%Incorrect": 0.0, "B-4": 0.001, "METEOR": None},
            {"C": 2.0, "%Incorrect": 0.0, "B-4": 0.002}, {"C": 3.0, "%Incorrect": 0.0, "B-4": None}]

    def printed(row: dict, column: str) -> str | None:
        return None if row.get(column) is None else f"{row[column]:.2f}"

    shown, constant, empty = constant_columns(["C", "%Incorrect", "B-4", "METEOR"], rows, printed)
    # B-4 prints 0.00 on both rows with a value (blank on the third): constant as the reader sees it
    assert (shown, constant, empty) == (["C"], {"%Incorrect": "0.00", "B-4": "0.00"}, ["METEOR"])


def _run(tmp_path: Path) -> Path:
    """A run folder with a results table (a constant and an empty column, two reward gains of one reward) and
    the findings above."""
    run = tmp_path / "run"
    run.mkdir()
    columns = ["Judge-acc", "C", "%Incorrect", "METEOR"]

    def row(model: str, judge: float, cider: float, **extra: object) -> dict:
        return {"model": model, "Judge-acc": judge, "C": cider, "%Incorrect": 0.0, "METEOR": None, **extra}

    rows = [row("xe", 50.0, 40.0),
            row("scst cider", 54.0, 50.0, delta={"Judge-acc": 4.0, "C": 10.0, "%Incorrect": 0.0},
                ci={"Judge-acc": [1.5, 6.5], "C": [5.0, 15.0], "%Incorrect": [0.0, 0.0]},
                delta_per_seed={"Judge-acc": [3.0, 5.0]}),
            row("scst cider:1,pac-s++:0.5", 52.0, 45.0, delta={"Judge-acc": 2.0, "C": 5.0},
                ci={"Judge-acc": [-1.0, 5.0], "C": [1.0, 9.0]}),
            row("scst cider:1,pac-s++:0.5 norm", 51.0, 44.0, delta={"Judge-acc": 1.0, "C": 4.0},
                ci={"Judge-acc": [-2.0, 4.0], "C": [0.0, 8.0]}),
            row("scst judge", 60.0, 42.0, delta={"Judge-acc": 10.0, "C": 2.0},
                ci={"Judge-acc": [8.0, 12.0], "C": [-1.0, 5.0]})]
    gains = [{"reward": "cider", "model": "scst cider", "xe": 0.4, "scst": 0.5, "delta": 0.1, "ci": [0.05, 0.15]},
             {"reward": "cider:1,pac-s++:0.5", "model": "scst cider:1,pac-s++:0.5", "xe": 0.6, "scst": 0.7,
              "delta": 0.1, "ci": [0.02, 0.18]},
             {"reward": "cider:1,pac-s++:0.5", "model": "scst cider:1,pac-s++:0.5 norm", "xe": 0.6, "scst": 0.66,
              "delta": 0.06, "ci": [0.0, 0.12]},
             {"reward": "judge", "model": "scst judge", "xe": 0.5, "scst": 0.6, "delta": 0.1, "ci": [0.08, 0.12]}]
    results = {"columns": columns, "rows": rows, "baseline": "xe", "oracle": "scst judge", "seeds": [0, 1],
               "reward_gains": gains, "findings": FINDINGS}
    (run / "results.json").write_text(json.dumps(results))
    (run / "config.yaml").write_text("demo:\n  seeds: [0, 1]\n")
    return run


def test_the_page_opens_on_the_headline_and_the_figure_then_one_folded_table(tmp_path: Path) -> None:
    run = _run(tmp_path)
    page = build_report(run)
    results = json.loads((run / "results.json").read_text())
    headline_html = re.search(r'<p id="headline">(.*?)</p>', page).group(1)
    assert headline_html == " ".join(headline(results)).replace("'", "&#x27;")
    assert page.index('id="headline"') < page.index('id="story-figure"') < page.index('id="results-table"')
    assert page.count('id="results-table"') == 1 and 'id="system-table"' not in page  # the table once
    table = page[page.index('id="results-table"'):page.index("</table>", page.index('id="results-table"'))]
    header = re.findall(r"<th>(.*?)</th>", table)
    assert header == ["Judge-acc", "C"]  # %Incorrect (0 on every row) and METEOR (no value) are folded
    note = re.search(r'<p class="note" id="folded-columns">(.*?)</p>', page).group(1)
    assert note == ("equal on every row that has a value, so not shown as columns: %Incorrect 0.00; no value on any "
                    "row (not computed in this run): METEOR.")
    gains = page[page.index('id="reward-gains"'):page.index("</table>", page.index('id="reward-gains"'))]
    labels = re.findall(r'<tr><td class="name">(.*?)</td>', gains)
    assert labels == ["scst cider", "scst cider:1,pac-s++:0.5", "scst cider:1,pac-s++:0.5 norm", "scst judge"]
    assert len(set(labels)) == len(labels)
    findings = page[page.index('id="findings"'):page.index("</ul>", page.index('id="findings"'))]
    assert findings.index("scst judge: judge accuracy rises") < findings.index('class="rank-fragile"') < \
        findings.index('class="rank-seed-dependent"')
    assert 'id="provenance"' in page and "seeds</td><td class=\"prov\">0, 1</td>" in page
    assert "<summary>config.yaml</summary>" in page


def test_the_figure_draws_every_row_with_an_interval_and_pairs_each_reward_with_its_row(tmp_path: Path) -> None:
    results = json.loads((_run(tmp_path) / "results.json").read_text())
    drawn = forest_rows(results["rows"], "Judge-acc")
    assert [(d["label"], d["delta"], d["ci"], d["per_seed"]) for d in drawn] == [
        ("scst cider", 4.0, (1.5, 6.5), [3.0, 5.0]), ("scst cider:1,pac-s++:0.5", 2.0, (-1.0, 5.0), []),
        ("scst cider:1,pac-s++:0.5 norm", 1.0, (-2.0, 4.0), []), ("scst judge", 10.0, (8.0, 12.0), [])]
    points = gain_points(results["reward_gains"], results["rows"], "Judge-acc")
    # x: the reward's own gain in standard errors (gain / (interval width / 3.92)), y: the row's Judge-acc change
    assert [(p["label"], round(p["x"], 4), p["y"]) for p in points] == [
        ("scst cider", round(0.1 / (0.1 / 3.919928), 4), 4.0), ("scst cider:1,pac-s++:0.5", 2.4500, 2.0),
        ("scst cider:1,pac-s++:0.5 norm", 1.96, 1.0), ("scst judge", 9.7998, 10.0)]
    assert story_figure(results["rows"], results["reward_gains"], "Judge-acc", "xe", "scst judge", [0, 1])[:4] == \
        b"\x89PNG"


def test_provenance_is_recorded_and_shown(tmp_path: Path) -> None:
    run = _run(tmp_path)
    record_provenance(run, 1_700_000_000.0, ["pacs", "train", "--config", "demo_smoke"],
                      stages={"ran": ["data", "xe"], "skipped": []})
    recorded = json.loads((run / "provenance.json").read_text())
    commit = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[2]), "rev-parse", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()
    assert recorded["command"] == "pacs train --config demo_smoke" and recorded["started"] == "2023-11-14T22:13:20+00:00"
    assert (recorded["git"] or {}).get("commit") == (commit or None)
    page = build_report(run)
    section = page[page.index('id="provenance"'):]
    for label, value in (("command", "pacs train --config demo_smoke"), ("pacs version", recorded["pacs_version"]),
                         ("git commit", commit or "not a git checkout"), ("date", recorded["finished"]),
                         ("stages", "ran: data, xe; skipped: none")):
        assert f'<td class="name">{label}</td><td class="prov">{value}' in section, label
    assert "cpu cores" in section and "wall time" in section


def test_the_gains_of_a_run_without_xe_are_shown_against_init(tmp_path: Path) -> None:
    """A transformers run with `captioner.xe: false` keys each gain's baseline value by its row, `init`."""
    run = tmp_path / "run"
    run.mkdir()
    gains = [{"reward": "cider", "model": "cider", "init": 0.1234, "scst": 0.2345, "delta": 0.1111,
              "ci": [0.05, 0.17], "baseline": "init"}]
    results = {"columns": ["model", "test_set", "C"], "reward_gains": gains,
               "rows": [{"model": "init", "test_set": "t", "C": 12.34},
                        {"model": "cider", "test_set": "t", "C": 23.45, "delta": {"C": 11.11}, "ci": {"C": [5, 17]}}]}
    (run / "results.json").write_text(json.dumps(results))
    page = build_report(run)
    table = page[page.index('id="reward-gains"'):page.index("</table>", page.index('id="reward-gains"'))]
    assert re.findall(r"<th>(.*?)</th>", table)[:2] == ["init", "scst"]
    assert re.findall(r"<td>(.*?)</td>", table)[:2] == ["0.12", "0.23"]  # the page shows two decimals
