"""The demo end to end with the smoke preset (2 training seeds) into a temporary run dir, then a second run that
reuses every stage, then the same preset on 2 CPU processes (`accelerate launch --cpu --num_processes 2`): the same
table."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from report_checks import check_story_report

from pacs import cli as pacs_cli
from pacs.captioner.demo.captioning import DEMO_COLUMNS
from pacs.captioner.demo.pipeline import REPO_CONFIGS, load_demo_config, run_demo
from pacs.metric.common.errors import InputError

SEEDS = [0, 1]
PER_SEED = ["xe", "scst-cider", "scst-clip-s", "scst-pac-s++", "scst-ref-pac-s++", "scst-cider_1_pac-s++_0.5",
            "scst-judge", "scst-cider_1_pac-s++_0.5-norm", "scst-clip-s-kl0.1"]
STAGES = {"data", "clip", "pacs", "correlation", "features", "evaluate",
          *(f"seed-{seed}/{name}" for seed in SEEDS for name in PER_SEED)}
REWARDS = ["cider", "clip-s", "pac-s++", "ref-pac-s++", "cider:1,pac-s++:0.5", "judge"]
MODELS = ["xe", *(f"scst {spec}" for spec in REWARDS), "scst cider:1,pac-s++:0.5 norm", "scst clip-s +KL", "human"]


@pytest.mark.slow
def test_demo_smoke_run_end_to_end_then_cached(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    config = str(REPO_CONFIGS / "demo_smoke.yaml")
    first = run_demo(config, [f"runs_dir={tmp_path}", "threads=1"])
    out = capfd.readouterr().out  # capfd: the seed processes below write to the same descriptors
    run_dir = tmp_path / "demo_smoke"
    assert set(first["ran"]) == STAGES and first["skipped"] == []
    # the printed table has one row per model and every column
    assert "| model | " + " | ".join(DEMO_COLUMNS) + " |" in out
    for model in MODELS:
        assert f"| {model} |" in out
    assert "systems against all references (the papers' protocol); B-4 left out for humans" in out
    results = json.loads((run_dir / "results.json").read_text())
    assert [r["model"] for r in results["rows"]] == MODELS
    # the guarded run: its coefficient chosen on validation, its checkpoint the best validation CIDEr-D step
    choice = results["guarded"]["choices"]["clip-s"]
    record = json.loads((run_dir / "stages" / "seed-0" / "scst-clip-s-kl0.1.json").read_text())["summary"]
    assert choice["chosen_kl_coef"] == 0.1 and choice["val_cider"] == {"0.1": record["best_val_cider"]}
    by_seed = results["guarded"]["choices_by_seed"]
    assert by_seed["0"]["clip-s"] == choice and set(by_seed) == {"0", "1"}
    guarded_dir = run_dir / "seed-0" / "scst-clip-s-kl0.1"
    assert record["model"] == "best" and record["best_step"] >= 1 and (guarded_dir / "best").is_dir()
    monitor = (guarded_dir / "monitor.csv").read_text().splitlines()
    header = monitor[0].split(",")
    best = max((dict(zip(header, line.split(","))) for line in monitor[2:]), key=lambda r: float(r["cider"]))
    assert int(best["step"]) == record["best_step"]
    assert "kl" in (guarded_dir / "log.csv").read_text().splitlines()[0].split(",")
    # every seed trained its own XE and SCST runs (own folders and fingerprints); the table records how it pooled them
    for seed in SEEDS:
        assert json.loads((run_dir / "stages" / f"seed-{seed}" / "xe.json").read_text())["settings"]["seed"] == seed
    assert results["seeds"] == SEEDS and results["bootstrap"]["seeds"] == 2
    assert results["bootstrap"]["resamples"] == 1000 and "stratified" in results["bootstrap"]["method"]
    assert [(r["seed"], r["model"]) for r in results["seed_rows"]] == [(s, m) for s in SEEDS for m in MODELS]
    assert results["guarded"]["reward_gains"][0]["model"] == "scst clip-s +KL"
    human_row = results["rows"][-1]
    assert human_row["B-4"] is None and "ci" not in human_row and "| human | - |" in out  # B-4 blank, as the papers
    # every SCST row carries (row - XE) and its interval for every column; each reward its own gain
    for row in results["rows"][1:-1]:
        assert set(row["ci"]) == set(DEMO_COLUMNS) == set(row["delta"])
        for column in DEMO_COLUMNS:
            low, high = row["ci"][column]
            assert low <= row["delta"][column] + 1e-9 and row["delta"][column] <= high + 1e-9, (row["model"], column)
            assert row["delta"][column] == pytest.approx(row[column] - results["rows"][0][column])
    assert [g["reward"] for g in results["reward_gains"]] == [*REWARDS, "cider:1,pac-s++:0.5"] and results["findings"]
    assert results["oracle"] == "scst judge"
    # the printed findings are the records' sentences, one bullet each
    printed = out.split("What the run found:\n\n")[1].split("\n\n")[0].splitlines()
    assert printed == [f"* {record['text']}" for record in results["findings"]]
    for record in results["findings"]:
        assert {"subject", "claim", "holds", "interval", "seeds"} <= set(record) and set(record["seeds"]) == {"0", "1"}
    gains = {g["model"]: g for g in results["reward_gains"]}
    by_model = {r["model"]: r for r in results["rows"]}
    for model in ("scst cider:1,pac-s++:0.5", "scst cider:1,pac-s++:0.5 norm"):  # normalised or not, the mix's own
        assert gains[model]["scst"] == pytest.approx(by_model[model]["C"] / 100  # value is its weighted sum
                                                     + 0.5 * by_model[model]["PAC-S++"], rel=1e-5)
    # the normalised mix against the weighted sum on the judge: the paired difference of the two rows' Judge-acc
    (compared,) = results["mix_normalisation"]
    assert (compared["model"], compared["versus"]) == ("scst cider:1,pac-s++:0.5 norm", "scst cider:1,pac-s++:0.5")
    assert compared["delta"] == pytest.approx(by_model[compared["model"]]["Judge-acc"]
                                              - by_model[compared["versus"]]["Judge-acc"], abs=1e-9)
    assert compared["ci"][0] <= compared["delta"] + 1e-9 and compared["delta"] <= compared["ci"][1] + 1e-9
    assert f"`{compared['model']}` − `{compared['versus']}` (Judge-acc" in out
    norm_record = json.loads((run_dir / "stages" / "seed-0" / "scst-cider_1_pac-s++_0.5-norm.json").read_text())
    assert norm_record["settings"]["mix_normalisation"] == "normalize_then_sum"  # in the stage's fingerprint
    assert gains["scst judge"]["scst"] == pytest.approx(by_model["scst judge"]["Judge"] / 100, rel=1e-5)  # the oracle
    assert "What the run found:" in out and "Δ vs xe" in out
    # Judge-acc and Length recomputed from the captions each seed's models wrote, against the world's scenes: the
    # table's value is their mean over the seeds
    from pacs.captioner.demo.data import DemoData
    from pacs.captioner.demo.judge import judge_caption

    scenes = DemoData.build(load_demo_config(config, []).world, tmp_path / "unused").scenes()
    per_seed = [json.loads((run_dir / "evaluate" / f"seed-{seed}" / "captions.json").read_text()) for seed in SEEDS]
    written_captions = json.loads((run_dir / "evaluate" / "captions.json").read_text())
    assert written_captions == per_seed[0]
    for row in results["rows"]:
        accuracy, length = [], []
        for seed_captions in per_seed:
            captions = seed_captions[row["model"]]
            correct = sum(judge_caption(c, scenes[image_id]).is_correct for image_id, c in captions.items())
            accuracy.append(100.0 * correct / len(captions))
            length.append(sum(len(c.split()) for c in captions.values()) / len(captions))
        assert row["Judge-acc"] == pytest.approx(sum(accuracy) / 2), row["model"]
        assert row["Length"] == pytest.approx(sum(length) / 2), row["model"]
    _check_human_row(tmp_path, run_dir, results, written_captions)
    # every training stage logged curves; the metric stages really trained (validation loss fell)
    for name in ("clip", "pacs", "xe", "scst-cider", "scst-pac-s++", "scst-judge"):
        assert (run_dir / "logs" / f"{name}.csv").is_file(), name
    for stage in ("clip", "pacs"):
        summary = json.loads((run_dir / "stages" / f"{stage}.json").read_text())["summary"]
        assert summary["val_total_last"] < summary["val_total_first"], (stage, summary)
    correlation = json.loads((run_dir / "correlation" / "correlation.json").read_text())
    assert {"clip-s", "pac-s++", "ref-pac-s++", "bleu4", "cider"} <= set(correlation)
    gallery = json.loads((run_dir / "gallery.json").read_text())
    assert len(gallery) == 4 and all((run_dir / g["image"]).is_file() for g in gallery)
    page = check_story_report(run_dir)  # headline from the findings, the figure, one folded table, provenance
    assert 'id="results-table"' not in page and page.count("<tr>") >= 6  # the system table is the one table
    assert 'id="delta-table"' in page and 'id="reward-gains"' in page and 'id="findings"' in page
    assert 'id="seed-deltas"' in page  # every seed's change drawn
    assert 'id="system-table"' in page and 'id="system-plot"' in page and 'id="system-delta-table"' in page
    assert '<td class="name">human</td>' in page
    assert (run_dir / "logs" / "scst_val-cider.csv").is_file()
    assert (run_dir / "logs" / "scst_val.reference.json").is_file()
    # the hacking monitor of every SCST run, drawn per reward with XE (its step 0) as the reference line
    for label in ("cider", "clip-s", "clip-s-kl0.1"):
        hacking = (run_dir / "logs" / f"hacking-{label}.csv").read_text().splitlines()
        assert hacking[0].split(",")[:2] == ["step", "reward"] and hacking[1].startswith("0,")
    reference = json.loads((run_dir / "logs" / "hacking.reference.json").read_text())
    assert reference["label"] == "xe" and {"cider", "rep2", "length"} <= set(reference["values"])
    assert len(re.findall(r'src="data:image/png;base64,', page)) >= 4 + 4  # curves, scatter, gallery images
    assert "class=\"absent\"" not in page
    marker = (run_dir / "stages" / "clip.json").stat().st_mtime

    # `pacs caption` re-creates the demo's features from the checkpoint's recorded source: same captions
    evaluated = json.loads((run_dir / "evaluate" / "captions.json").read_text())["scst cider"]
    some = sorted(evaluated)[:3]
    images = tmp_path / "caption-input"
    images.mkdir()
    for image_id in some:
        shutil.copyfile(run_dir / "data" / "images" / f"{image_id}.png", images / f"{image_id}.png")
    out_file = tmp_path / "captions.json"
    assert pacs_cli.main(["caption", "--checkpoint", str(run_dir / "seed-0" / "scst-cider" / "final"), "--images",
                          str(images),
                          "--beam-size", "2", "--out", str(out_file)]) == 0
    written = {r["image_id"]: r["caption"] for r in json.loads(out_file.read_text())}
    assert written == {image_id: evaluated[image_id] for image_id in some}

    report_written = (run_dir / "report.html").stat().st_mtime_ns
    second = run_demo(config, [f"runs_dir={tmp_path}", "threads=1"])
    assert second["ran"] == [] and set(second["skipped"]) == STAGES
    assert (run_dir / "report.html").stat().st_mtime_ns == report_written  # same inputs: the page is kept
    assert (run_dir / "stages" / "clip.json").stat().st_mtime == marker
    assert json.loads((run_dir / "results.json").read_text())["rows"] == results["rows"]

    # a changed SCST setting re-runs only the SCST stages and the evaluation below them
    third = run_demo(config, [f"runs_dir={tmp_path}", "threads=1", "scst.rewards=[cider]"])
    assert set(third["ran"]) == {"evaluate"} and {"seed-0/xe", "seed-1/xe"} <= set(third["skipped"])
    assert ">scst clip-s</" not in (run_dir / "report.html").read_text()  # new results: the page is rebuilt

    # the seeds trained at once, each in a process of its own (parallel_seeds): the same stages and table
    capfd.readouterr()  # what the runs above printed
    parallel = run_demo(config, [f"runs_dir={tmp_path / 'parallel'}", "threads=1", "parallel_seeds=2"])
    assert set(parallel["ran"]) == STAGES and parallel["skipped"] == []
    shown = capfd.readouterr()
    assert _table(shown.out) == _table(out)
    # each seed process draws its own bars, tagged with its seed and the stage's name; its log lines are tagged too
    bars = re.split(r"[\r\n]", shown.err)
    for seed in SEEDS:
        assert any(line.startswith(f"[seed {seed}] xe: ") for line in bars), shown.err[-2000:]
        assert any(line.startswith(f"[seed {seed}] scst-clip-s-kl0.1: ") for line in bars), shown.err[-2000:]
        assert f"INFO [seed {seed}] pacs.captioner.orchestration.stages: stage seed-{seed}/xe: done" in shown.err
    assert "accelerate.checkpointing" not in shown.err and "checkpoint saved" not in shown.err  # the log file's
    assert "checkpoint saved" in (tmp_path / "parallel" / "demo_smoke" / "logs" / "seed-1.log").read_text()

    # the literal command on 2 CPU processes: same stages, same printed table as one process
    two = tmp_path / "two"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
               str(REPO_CONFIGS.parents[1] / "recipes" / "scst_pacs.py"), "--config", config,
               f"runs_dir={two}", "threads=1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400,
                          env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "starting 2 gloo CPU processes" in done.stderr
    assert "120 to extract on process 1/2" in done.stderr  # feature extraction was split, not repeated
    assert done.stdout.count("| model | B-4 |") == 1  # only the main process prints the table
    assert _table(done.stdout) == _table(out)
    stages = json.loads((two / "demo_smoke" / "stages.json").read_text())
    assert set(stages["ran"]) == STAGES and stages["skipped"] == []
    results_two = json.loads((two / "demo_smoke" / "results.json").read_text())
    rows_two = results_two["rows"]
    # the same claims, as sets of (subject, claim, holds): float rounding of another split does not change them
    assert {(r["subject"], r["claim"], str(r["holds"])) for r in results_two["findings"]} == \
        {(r["subject"], r["claim"], str(r["holds"])) for r in results["findings"]}
    assert [r["model"] for r in rows_two] == [r["model"] for r in results["rows"]]
    for row_one, row_two in zip(results["rows"], rows_two):
        for column in DEMO_COLUMNS:
            if row_one[column] is None:  # the human row's B-4
                assert row_two[column] is None
                continue
            assert row_two[column] == pytest.approx(row_one[column], abs=1e-5), (row_one["model"], column)


def _check_human_row(tmp_path: Path, run_dir: Path, results: dict, captions: dict) -> None:
    """The demo's table is `pacs evaluate --candidates NAME=FILE ... --human-baseline` on the files the run wrote,
    and the human row follows from the recorded held-out indices (CIDEr-D recomputed with pycocoevalcap)."""
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    evaluate = run_dir / "evaluate" / "seed-0"  # the first seed's table (every seed's: evaluate/seed-<s>/)
    demo_table = json.loads((evaluate / "system_table.json").read_text())
    specs = demo_table["provenance"]["config"]["candidates"]
    assert [spec.split("=", 1)[0] for spec in specs] == MODELS[:-1]
    human = results["human_baseline"]
    assert human["protocol"] == "papers" and human["held_out"] == demo_table["human_baseline"]["held_out"]
    common = ["evaluate", "--candidates", *specs, "--references", str(evaluate / "references.json"),
              "--images", str(run_dir / "data" / "images"), "--human-baseline", "--seed", str(human["seed"]),
              "--bootstrap", "0"]
    demo_rows = {row["system"]: row["values"] for row in demo_table["rows"]}
    for stage, metrics in (("clip", "bleu4,cider,rep1,rep2,rep3,rep4,incorrect,length,clip-s,ref-clip-s"),
                           ("pacs", "pac-s++,ref-pac-s++")):
        written = tmp_path / f"cli-{stage}.json"
        assert pacs_cli.main([*common, "--checkpoint", str(run_dir / stage / "checkpoint.safetensors"),
                              "--metrics", metrics, "--out", str(written)]) == 0
        cli = json.loads(written.read_text())
        assert cli["human_baseline"]["held_out"] == human["held_out"]
        assert [row["system"] for row in cli["rows"]] == list(demo_rows)
        for row in cli["rows"]:  # every row, the human one included, exactly as the demo scored it
            assert row["values"] == {m: demo_rows[row["system"]][m] for m in row["values"]}, row["system"]
    by_model = {row["model"]: row for row in results["rows"]}
    assert by_model["human"]["C"] == 100 * demo_rows["human"]["cider"] and demo_rows["human"]["bleu4"] is None
    # by hand: the held-out reference of each image is the human caption, the others its references
    references = json.loads((evaluate / "references.json").read_text())
    held_out = human["held_out"]
    assert list(held_out) == list(references)
    assert captions["human"] == {i: references[i][k] for i, k in held_out.items()}
    gts = {i: [{"caption": r} for j, r in enumerate(references[i]) if j != k] for i, k in held_out.items()}
    res = {i: [{"caption": references[i][k]}] for i, k in held_out.items()}
    tokenizer = PTBTokenizer()
    cider, _ = Cider().compute_score(tokenizer.tokenize(gts), tokenizer.tokenize(res))
    assert by_model["human"]["C"] == pytest.approx(100 * cider, abs=1e-9)
    lengths = [len(references[i][k].split()) for i, k in held_out.items()]
    assert by_model["human"]["Length"] == pytest.approx(sum(lengths) / len(lengths))


def _table(stdout: str) -> list[str]:
    """The printed results table's lines."""
    return [line for line in stdout.splitlines() if line.startswith("|")]


def test_demo_config_overrides_and_errors(tmp_path: Path) -> None:
    config = load_demo_config(None, ["xe.max_steps=7", "demo.clip.max_steps=3"])
    assert config.xe.max_steps == 7 and config.clip.max_steps == 3 and str(config.run_path()) == "runs/demo"
    smoke = load_demo_config(REPO_CONFIGS / "demo_smoke.yaml", [])
    assert str(smoke.run_path()) == "runs/demo_smoke"
    assert smoke.clip.embed_dim == config.clip.embed_dim  # inherited via _base_
    with pytest.raises(InputError, match="unknown key 'stepz'"):
        load_demo_config(None, ["xe.stepz=1"])
    plain = tmp_path / "plain.yaml"
    plain.write_text("run_dir: x\n")
    with pytest.raises(InputError, match="demo"):
        load_demo_config(plain, [])
