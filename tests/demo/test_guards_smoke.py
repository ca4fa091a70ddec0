"""demo_guards_smoke.yaml end to end (issue 44 items 2-3): every guard of the menu trained at each setting, each
guard's choice recorded and recomputed by hand from the runs' own validation monitor, the combination run, the
rows and findings, pooled alike; then the guarded stages trained again with every judge value and the evaluate stage's
test-split numbers poisoned: the choice records are unchanged."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from script_modules import load_tool

from pacs.captioner.demo import captioning
from pacs.captioner.demo.pipeline import REPO_CONFIGS, guarded_stage_names, load_demo_config, run_demo
from pacs.captioner.modeling.hacking_monitor import read_monitor_rows
from pacs.captioner.modeling.scst_guards import stop_point
from pacs.captioner.modeling.train_scst import SCSTConfig, gaming_thresholds
from pacs.captioner.orchestration import guard_choice

CONFIG = REPO_CONFIGS / "demo_guards_smoke.yaml"
ROWS = ["scst pac-s++ +KL", "scst pac-s++ +length mask", "scst pac-s++ +CIDEr-D anchor", "scst pac-s++ +early stop",
        "scst pac-s++ +rep penalty", "scst pac-s++ +guards"]


def _by_hand(run_dir: Path, stage: str) -> float:
    """The validation CIDEr-D of a run's selected checkpoint, read from its monitor.csv by its recorded model."""
    summary = json.loads((run_dir / "stages" / f"{stage}.json").read_text())["summary"]
    rows = read_monitor_rows(run_dir / stage / "monitor.csv")
    if summary["model"] == "best":  # select_by cider: the best monitored step after step 0
        return max(row["cider"] for row in rows if row["step"] > 0)
    assert summary["model"] == "kept"  # stop_on_gaming: the last monitored step before a gaming signature
    kept, _ = stop_point(rows, gaming_thresholds(SCSTConfig()))
    return next(row["cider"] for row in rows if row["step"] == kept)


def _poisoned_judge(captions, scenes):
    """The demo's judge with every value replaced by a huge number that differs per caption."""
    values, judgements = REAL_JUDGE(captions, scenes)
    return {column: 1e9 * (1 + np.arange(len(v), dtype=float)) for column, v in values.items()}, judgements


REAL_JUDGE = captioning.judge_values


@pytest.mark.slow
def test_demo_guards_smoke_chooses_on_validation_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "guards"
    run_demo(CONFIG, [f"run_dir={run_dir}", "threads=1"])
    record_file = run_dir / "guard_choice-pac-s++.json"
    record = json.loads(record_file.read_text())
    assert list(record["choices"]) == ["kl_coef", "length_mask_slack", "cider_anchor", "stop_on_gaming",
                                       "rep_penalty"]
    for choice in record["choices"].values():
        values = [candidate["val_cider"] for candidate in choice["candidates"]]
        for candidate in choice["candidates"]:  # each candidate's value is its run's own validation monitor's
            assert candidate["val_cider"] == pytest.approx(_by_hand(run_dir, candidate["stage"]), rel=1e-6)
        best = max(values)
        first = next(c for c in choice["candidates"] if c["val_cider"] == best and len(c["signatures"]) == min(
            len(o["signatures"]) for o in choice["candidates"] if o["val_cider"] == best))
        assert choice["chosen_stage"] == first["stage"] and choice["criterion"] == guard_choice.CRITERION
    combined = record["combination"]
    assert combined["settings"] == guard_choice.combination(record["choices"])
    settings = json.loads((run_dir / "stages" / "scst-pac-s++-guards.json").read_text())["settings"]
    assert settings["guard"] == guard_choice.scst_keys(combined["settings"])
    assert settings["reward"] == load_demo_config(CONFIG, []).guarded.reward_spec("pac-s++", combined["settings"])
    results = json.loads((run_dir / "results.json").read_text())
    assert [row["model"] for row in results["rows"]] == ["xe", "scst pac-s++", "scst judge", *ROWS, "human"]
    assert results["guarded"]["choices_by_seed"]["0"]["pac-s++"]["guards"] == record
    assert {f["subject"] for f in results["findings"] if "guard" in f["claim"]} == set(ROWS)
    assert "| pac-s++ | 0 | best combination |" in (run_dir / "results.md").read_text()

    # the docs' "what each guard did": omission re-judged from the evaluate stage's captions; re-judged the same
    # way, the share of correct captions is each row's Judge-acc as the evaluate stage computed it
    refresh = load_tool("refresh_guard_docs")
    correct = refresh.verdict_shares(run_dir, results, "correct")
    for row in results["seed_rows"]:
        assert correct[row["model"]] == [pytest.approx(row["Judge-acc"], abs=1e-9)], row["model"]
    effects = refresh.guard_effects(run_dir, results)
    omitted = refresh.verdict_shares(run_dir, results)
    assert [line.split(" | ")[0].removeprefix("| ") for line in effects.splitlines() if line.startswith("| ")][1:] \
        == ["xe", "scst pac-s++", *ROWS, "scst judge"]
    assert f"| {omitted['xe'][0]:.1f} ({omitted['xe'][0]:.1f}) |" in effects

    # pooling the run's seed makes the same choices from the verified records: the same rows, choices and findings
    pooled = tmp_path / "pooled"
    assert load_tool("pool_seeds").main([str(run_dir), "--out", str(pooled)]) == 0
    again = json.loads((pooled / "results.json").read_text())
    for key in ("rows", "guarded", "findings", "share_of_oracle"):
        assert again[key] == results[key], key

    # poison: every judge value (validation monitor and test table) huge, the evaluate stage's test numbers NaN
    for path in [run_dir / "evaluate" / "results.json", run_dir / "results.json"]:
        text = json.loads(path.read_text())
        for row in text["rows"]:
            row.update({column: math.nan for column in text["columns"] if column in row})
        path.write_text(json.dumps(text))
    monkeypatch.setattr(captioning, "judge_values", _poisoned_judge)
    config = load_demo_config(CONFIG, [])
    run_demo(CONFIG, [f"run_dir={run_dir}", "threads=1"], force=guarded_stage_names(config))
    assert json.loads(record_file.read_text()) == record
    monitor = (run_dir / "scst-pac-s++-guards" / "judge_monitor.csv").read_text().splitlines()
    assert float(monitor[1].split(",")[1]) > 1e8  # the guarded runs did see the poisoned judge
