"""Values that are legitimately undefined are written as JSON null (never NaN/Infinity), and readers accept null."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from captioner_testkit import tiny_data, tiny_model_config

from pacs.captioner.modeling.train_xe import XEConfig, train_xe
from pacs.captioner.modeling.training_setup import ScheduleConfig
from pacs.captioner.modeling.vocab import build_vocab
from pacs.captioner.orchestration.eval_intervals import add_intervals
from pacs.captioner.orchestration.evaluation import evaluate_captions_detailed
from pacs.captioner.orchestration.judge_correlation import kendall_record as kendall
from pacs.captioner.orchestration.results_files import table_markdown
from pacs.metric.common.io import nonfinite_to_none, write_json_atomic


def test_fluency_of_no_captions_is_null_in_the_row_and_a_dash_in_the_table(tmp_path):
    row, per_image = evaluate_captions_detailed({}, {}, text_metrics=())
    assert row == {"Rep-1": None, "Rep-2": None, "Rep-3": None, "Rep-4": None, "%Incorrect": None}
    assert per_image == {}
    write_json_atomic(tmp_path / "row.json", row)  # strict JSON accepts it
    assert json.loads((tmp_path / "row.json").read_text()) == row
    # undefined ('-'), not blank: a blank cell is a column the run did not compute
    assert table_markdown([{"model": "xe", **row}], ["model"], ["Rep-1"]).splitlines()[-1] == "| xe | - |"


def test_null_per_image_values_get_no_interval_and_no_crash():
    """An eval/<model>/<set>.json read back with a null per-image SPICE value (a caption SPICE failed on)."""
    record = nonfinite_to_none({"values": {"S": [1.0, float("nan"), 2.0], "C": [1.0, 2.0, 3.0]}})
    assert record["values"]["S"] == [1.0, None, 2.0]
    base = {"image_ids": ["a", "b", "c"], "values": {"S": [0.5, 0.5, 0.5], "C": [0.0, 1.0, 2.0]}}
    rows = [{"model": "xe", "test_set": "t"}, {"model": "scst", "test_set": "t"}]
    done = add_intervals(rows, {("xe", "t"): base, ("scst", "t"): {"image_ids": ["a", "b", "c"], **record}},
                         n_resamples=20, seed=0)
    assert done == 1 and set(rows[1]["ci"]) == {"C"}  # C: +1 on every image, S: no interval (a value is missing)
    assert rows[1]["ci"]["C"] == pytest.approx([1.0, 1.0])


def test_kendall_of_a_constant_metric_is_null(tmp_path):
    judge = np.asarray([0.0, 1.0, 0.5, 1.0])
    assert kendall(np.ones(4), judge) == {"tau_b": None, "tau_c": None, "n": 4}
    defined = kendall(np.asarray([0.0, 2.0, 1.0, 3.0]), judge)
    assert math.isfinite(defined["tau_b"]) and defined["n"] == 4
    write_json_atomic(tmp_path / "correlation.json", {"length": kendall(np.ones(4), judge)})


def test_xe_trainer_state_before_any_validation_holds_null_not_minus_infinity(tmp_path):
    cache, train, _ = tiny_data(tmp_path)
    vocab = build_vocab("word", [c for _, c in train], min_count=1, max_length=8)
    config = XEConfig(output_dir=str(tmp_path / "xe"), max_steps=2, batch_size=16, micro_batch_size=16,
                      schedule=ScheduleConfig(warmup_steps=0, constant_until=2, decay_until=2, peak_lr=1e-3,
                                              final_lr=1e-3), eval_every=0, save_every=1, keep_checkpoints=5,
                      trackers=[])
    result = train_xe(config, tiny_model_config(), vocab, cache, train, {})  # no validation set
    state = json.loads((tmp_path / "xe" / "checkpoints" / "step-00000001" / "trainer_state.json").read_text())
    assert state["best_score"] is None and state["best_step"] == -1
    assert result.best_score == -math.inf and (result.best_dir / "captioner.json").is_file()
    resumed = train_xe(XEConfig(**{**config.__dict__, "max_steps": 3}), tiny_model_config(), vocab, cache, train, {})
    assert resumed.steps == 3  # a resume reads the null back
