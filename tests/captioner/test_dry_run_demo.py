"""`pacs train --dry-run` of the embedded demo (issue 42 item 7): nothing written (not its lock, config.yaml, logs
or images), every stage in the order it runs, and on a finished run the one changed setting named."""
from __future__ import annotations

import pytest
import torch
from test_dry_run import dry_run, snapshot

from pacs.captioner.demo.pipeline import stage_names
from pacs.captioner.demo.plan import plan_demo
from pacs.captioner.entry import run_from_config

torch.set_num_threads(1)


def test_a_fresh_demo_folder_plans_every_stage_and_writes_nothing(tmp_path, capsys):
    before = snapshot(tmp_path)
    run_dir = tmp_path / "demo"
    code, stages, out = dry_run(capsys, "--config", "demo_smoke", f"run_dir={run_dir}")
    assert code == 0 and snapshot(tmp_path) == before and not run_dir.exists()
    _, planned, _ = plan_demo(None, ["demo.run_dir=x"])  # the embedded default plans too
    assert [name for name, _, _ in planned] == stage_names_of("demo")
    names = [name for _, name, _ in stages]
    assert names == stage_names_of("demo_smoke")
    assert stages[0] == ("run", "data", "no record: it has not run here")
    assert stages[1] == ("run", "clip", "upstream data re-runs")
    assert {verdict for verdict, _, _ in stages} == {"run"}
    assert out.splitlines()[-1] == f"would run {len(names)}"


def stage_names_of(preset: str) -> list[str]:
    """The demo preset's stage names, as its run orders them."""
    from pacs.captioner.demo.pipeline import load_demo_config
    from pacs.metric.common.config_files import resolve_config

    return stage_names(load_demo_config(resolve_config(preset), []))


@pytest.mark.slow
def test_a_finished_demo_run_with_one_changed_setting(tmp_path, capsys):
    run_dir = tmp_path / "demo"
    overrides = ["captioning=false", f"run_dir={run_dir}", "threads=1"]  # the metric stages: a minute on CPU
    run_from_config("demo_smoke", overrides)
    before = snapshot(tmp_path)
    code, stages, _ = dry_run(capsys, "--config", "demo_smoke", *overrides, "correlation.bootstrap_resamples=60")
    assert code == 0 and snapshot(tmp_path) == before
    same = "finished with the same fingerprint, its outputs verified"
    assert stages == [("reuse", "data", same), ("reuse", "clip", same), ("reuse", "pacs", same),
                      ("run", "correlation", "re-running: correlation.bootstrap_resamples 50 -> 60")]
    _, stages, _ = dry_run(capsys, "--config", "demo_smoke", *overrides, "--force", "clip")
    assert stages == [("reuse", "data", same), ("run", "clip", "re-running (--force)"),
                      ("run", "pacs", "upstream clip re-runs"), ("run", "correlation", "upstream pacs re-runs")]
    assert snapshot(tmp_path) == before
