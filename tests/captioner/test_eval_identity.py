"""Evaluation at real shapes: test sets with colliding ids, evaluation split over processes, paired intervals."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
CONTRASTIVE = ("RefCLIP-S", "RefPAC-S++", "CLIP-S", "PAC-S++")
LAUNCH_2 = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, shared_data):
    """The rehearsal sets (COCO ids 1..5 and nocaps ids 1..5 on different images) and two tiny captioners."""
    from eval_driver import build_inputs

    root = tmp_path_factory.mktemp("eval-inputs")
    build_inputs(root, shared_data / "flickr8k")
    return root


def _rows(run_dir: Path) -> dict[tuple[str, str], dict]:
    rows = json.loads((run_dir / "eval" / "results.json").read_text())["rows"]
    return {(row["model"], row["test_set"]): row for row in rows}


def test_colliding_ids_of_two_test_sets_do_not_share_image_embeddings(inputs, tmp_path):
    from eval_driver import evaluate

    sets = json.loads((inputs / "inputs.json").read_text())["sets"]
    from pacs.captioner.data import load_dataset

    coco_ids = {i.image_id for i in load_dataset("coco-karpathy", sets["coco"]["path"]).split("test").items}
    nocaps_ids = {i.image_id for i in load_dataset("nocaps", sets["nocaps"]["path"]).split("val").items}
    assert coco_ids & nocaps_ids  # the situation of the issue: equal ids, different images

    evaluate(tmp_path / "both", inputs, ["coco", "nocaps"])  # one run: the scorers are shared by both sets
    evaluate(tmp_path / "nocaps", inputs, ["nocaps"])
    evaluate(tmp_path / "coco", inputs, ["coco"])
    both, alone = _rows(tmp_path / "both"), {**_rows(tmp_path / "nocaps"), **_rows(tmp_path / "coco")}
    assert set(both) == set(alone) and ("xe", "nocaps/in-domain") in both
    for key, row in both.items():
        # bit-equal: each chunk is scored in one scorer call with the text caches cleared first, so a set's images
        # and captions are embedded in the same batches in a run of both sets as in a run of it alone
        for column in CONTRASTIVE:  # before: nocaps got the COCO images' embeddings (keys=ids)
            assert row[column] == alone[key][column], (key, column)


@pytest.mark.slow
def test_two_processes_evaluate_exactly_as_one(inputs, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    outputs = {}
    for name, launcher in (("one", [sys.executable]), ("two", LAUNCH_2)):
        run_env = dict(env, ACCELERATE_USE_CPU="1") if name == "two" else env
        done = subprocess.run(launcher + [str(HERE / "eval_driver.py"), str(tmp_path / name), str(inputs),
                                          "coco,nocaps"], capture_output=True, text=True, env=run_env, timeout=400,
                              check=False)
        assert done.returncode == 0, done.stderr[-4000:]
        outputs[name] = done.stdout
    assert "WORLD 1" in outputs["one"] and "WORLD 2" in outputs["two"]
    # 2 models x 2 sets x 5 images; chunks of 2 images round robin: rank 0 takes chunks 0 and 2 (3 images of each
    # set), rank 1 chunk 1 (2 images). Before, every process that ran evaluate_models captioned everything.
    counts = {name: sorted(line.split()[1:] for line in out.splitlines() if line.startswith("CAPTIONED "))
              for name, out in outputs.items()}
    assert counts == {"one": [["0", "20"]], "two": [["0", "12"], ["1", "8"]]}
    one, two = (json.loads((tmp_path / n / "eval" / "results.json").read_text()) for n in ("one", "two"))
    # every column, row and interval bit-identical: chunks are the unit of work (captioned and scored in the same
    # batches on any process count, pacs.captioner.orchestration.eval_processes), so the floats are the same computation
    assert one == two
    assert any("ci" in row for row in one["rows"]) and len(one["rows"]) == 2 * (1 + 1 + 3)  # coco, nocaps + 3 domains
    for model in ("xe", "pac-s++"):
        for test_set in ("coco", "nocaps"):
            a, b = (json.loads((tmp_path / n / "eval" / model / f"{test_set}.results.json").read_text())
                    for n in ("one", "two"))
            assert a == b and len(a) == 5


def test_paired_interval_is_eval_bootstrap_of_the_paired_differences():
    from pacs.captioner.orchestration.eval_intervals import add_intervals

    xe = {"C": [10.0, 20.0, 30.0, 40.0, 50.0], "CLIP-S": [0.5, 0.6, 0.7, 0.8, 0.9]}
    rl = {"C": [12.0, 19.0, 35.0, 40.0, 58.0], "CLIP-S": [0.55, 0.6, 0.72, 0.81, 0.93]}
    ids = ["1", "2", "3", "4", "5"]
    rows = [{"model": "xe", "test_set": "coco", "C": 30.0}, {"model": "cider", "test_set": "coco", "C": 32.8}]
    per_image = {("xe", "coco"): {"image_ids": ids, "values": xe}, ("cider", "coco"): {"image_ids": ids, "values": rl}}
    assert add_intervals(rows, per_image, "xe", n_resamples=400, seed=7) == 1
    assert "ci" not in rows[0]
    # independent: the same resample indices (numpy's generator seeded 7, 5 draws in [0, 5) per resample),
    # mean of the paired differences, 2.5 / 97.5 percentiles
    rng = np.random.default_rng(7)
    draws = [rng.integers(0, 5, size=5) for _ in range(400)]
    for column in ("C", "CLIP-S"):
        diff = np.asarray(rl[column]) - np.asarray(xe[column])
        means = [float(np.asarray(rl[column])[d].mean() - np.asarray(xe[column])[d].mean()) for d in draws]
        low, high = np.percentile(means, [2.5, 97.5])
        assert rows[1]["ci"][column] == pytest.approx([low, high], abs=1e-12)
        assert low <= diff.mean() <= high


def test_results_files_show_the_intervals(tmp_path):
    from pacs.captioner.orchestration.pipeline import write_results

    rows = [{"test_set": "coco", "reward": "– (XE)", "C": 30.0},
            {"test_set": "coco", "reward": "cider", "C": 32.5, "ci": {"C": [0.5, 4.25]}}]
    write_results(tmp_path, rows, ["test_set", "reward", "B-4", "C"])
    csv_lines = (tmp_path / "results.csv").read_text(encoding="utf-8").splitlines()
    assert csv_lines[0] == "test_set,reward,B-4,C,ΔC low,ΔC high"
    assert csv_lines[1] == "coco,– (XE),,30.0,," and csv_lines[2] == "coco,cider,,32.5,0.5,4.25"
    markdown = (tmp_path / "results.md").read_text(encoding="utf-8")
    # a row with an interval but no point estimate (`delta`) shows the interval alone
    assert "| test_set | reward | ΔC |\n|---|---|---|\n| coco | cider | [+0.500, +4.25] |\n" in markdown
    assert json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))["rows"][1]["ci"] == {"C": [0.5, 4.25]}
