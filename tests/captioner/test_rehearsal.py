"""The reward comparison rehearsed at real shapes with tiny models.

Four test sets in their released formats (COCO Karpathy, nocaps, VizWiz, CC3M) whose image ids collide, the
official-format fixtures as the PAC-S (C) and PAC-S++ (A) reward models, `recipes/compare_rewards.py` on 2 CPU
processes through `accelerate launch --cpu --num_processes 2`: killed during XE and resumed, then re-run with one
changed SCST setting. Checked against an uninterrupted 2-process run with the final settings and, column by
column, against `pacs evaluate` run on each test set alone.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from captioner_testkit import tiny_pipeline_sections
from rehearsal_data import build_rehearsal_sets

from pacs.captioner.data import load_dataset
from pacs.metric.models.backbones import build_backbone_from_config, save_backbone, tiny_clip_config
from pacs.rewards.slug import reward_slug

REPO = Path(__file__).resolve().parents[2]
REWARDS = ["pac-s", "ref-pac-s++"]
SETS = ["coco", "nocaps", "vizwiz", "cc3m"]
CONTRASTIVE = {"clip": {"CLIP-S": "clip-s", "RefCLIP-S": "ref-clip-s"},
               "pac": {"PAC-S++": "pac-s++", "RefPAC-S++": "ref-pac-s++"}}


def _config(root: Path, sets: dict, models: dict) -> dict:
    tiny = {"random_config": tiny_clip_config(), "random_seed": 0}
    return {
        "run_dir": str(root / "run"),
        "data": {**sets["train"], "max_train_images": 24, "max_val_images": 4},
        "vocab": {"kind": "word", "min_count": 2, "max_length": 12},
        "features": {"source": tiny, "batch_size": 8, "dtype": "float32"},
        **tiny_pipeline_sections(16, 8, eval_every=3, save_every=2),
        "scst": {"batch_size": 4, "micro_batch_size": 2, "max_steps": 2, "k": 2, "lr": 1e-4,
                 "save_every": 2, "trackers": []},
        "reward_models": {"clip": {"backbone": "", "checkpoint": str(models["clip"])},
                          "pacs": {"backbone": "", "checkpoint": str(models["C"]), "arch": str(models["C_arch"]),
                                   "family": "pac-s"},
                          "pac": {"backbone": "", "checkpoint": str(models["A"]), "arch": str(models["A_arch"])}},
        "evaluation": {"test_sets": {name: sets[name] for name in SETS}, "beam_size": 2, "batch_size": 4,
                       "text_metrics": ["cider"], "bootstrap": 200},
    }


def _launch(config: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
            str(REPO / "recipes" / "compare_rewards.py"), "--config", str(config),
            *[arg for reward in REWARDS for arg in ("--reward", reward)], *overrides]


ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def _run(command: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, env=ENV, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _run_killed_during_xe(command: list[str], run_dir: Path) -> None:
    """Start the job and SIGKILL all its processes once XE has written its first checkpoint."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV,
                               start_new_session=True)
    deadline = time.monotonic() + 300
    try:
        while not list((run_dir / "xe" / "checkpoints").glob("step-*")):
            assert process.poll() is None, process.stderr.read().decode()[-4000:]
            assert time.monotonic() < deadline, "XE wrote no checkpoint"
            time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _output_ids(run_dir: Path) -> dict[str, str]:
    """{stage: output id} from the stage records (a stage that ran gets a new id)."""
    records = run_dir / "stages"
    ids = {}
    for path in records.rglob("*.json"):
        record = json.loads(path.read_text())
        if "stage" in record:
            ids[record["stage"]] = record.get("output_id")
    return ids


def _rows(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "compare_rewards" / "results.json").read_text())["rows"]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory, shared) -> dict:
    """Data sets, reward models and the config file of the rehearsal."""
    root = tmp_path_factory.mktemp("rehearsal")
    sets = build_rehearsal_sets(shared / "data" / "flickr8k", root / "data")
    fixtures = shared / "fixtures" / "pacscore"
    clip = root / "models" / "tiny_clip.safetensors"
    clip.parent.mkdir()
    save_backbone(build_backbone_from_config(tiny_clip_config(), seed=3), clip)
    models = {"clip": clip, "A": fixtures / "A" / "PAC++_tiny_A.pth", "A_arch": fixtures / "A" / "arch.json",
              "C": fixtures / "C" / "clip_tiny_C.pth", "C_arch": fixtures / "C" / "arch.json"}
    config = root / "compare.yaml"
    config.write_text(yaml.safe_dump(_config(root, sets, models)))
    return {"root": root, "sets": sets, "models": models, "config": config}


@pytest.mark.slow
def test_reward_comparison_interrupted_resumed_rerun_equals_clean_run(rehearsal):
    root, config = rehearsal["root"], rehearsal["config"]
    run_dir = root / "interrupted"  # this test's own folder: the module's other tests may have run first
    # 1. two processes, SIGKILLed during XE, then resumed
    # a checkpoint every step (checkpoint cadence is not part of the fingerprint): the kill lands with XE's
    # first checkpoint, long before its last step, however fast the machine is
    _run_killed_during_xe(_launch(config, f"run_dir={run_dir}", "xe.save_every=1"), run_dir)
    xe_record = json.loads((run_dir / "stages" / "xe.json").read_text())
    assert xe_record["status"] == "running"
    resumed = _run(_launch(config, f"run_dir={run_dir}"))
    assert "starting 2 gloo CPU processes" in resumed.stderr
    assert "stage xe: interrupted with the same settings, resuming" in resumed.stderr, resumed.stderr[-3000:]
    before = _output_ids(run_dir)

    # 2. one changed SCST setting: exactly the SCST stages and their evaluations re-run
    rerun = _run(_launch(config, f"run_dir={run_dir}", "scst.lr=3e-4"))
    after = _output_ids(run_dir)
    changed = {name for name in after if after[name] != before.get(name)}
    expected = {f"scst-{reward_slug(r)}" for r in REWARDS} | {f"eval/{reward_slug(r)}/{s}" for r in REWARDS
                                                               for s in SETS}
    assert changed == expected
    assert "scst.lr 0.0001 -> 0.0003" in rerun.stderr

    # 3. the final numbers equal an uninterrupted 2-process run with the final settings
    clean = root / "clean"
    _run(_launch(config, f"run_dir={clean / 'run'}", "scst.lr=3e-4"))
    assert _rows(run_dir) == _rows(clean / "run")


@pytest.mark.slow
def test_every_contrastive_column_equals_pacs_evaluate_on_that_set_alone(rehearsal, tmp_path):
    """Each set's columns of a finished run equal a single-set `pacs evaluate` (reuses a run of the test above)."""
    from pacs import cli as pacs_cli
    root, models = rehearsal["root"], rehearsal["models"]
    finished = [folder for folder in (root / "clean" / "run", root / "interrupted")
                if (folder / "compare_rewards" / "results.json").is_file()]
    run_dir = finished[0] if finished else root / "run"
    if not finished:
        _run(_launch(rehearsal["config"]))
    rows = _rows(run_dir)
    options = {"clip": ["--checkpoint", str(models["clip"])],
               "pac": ["--checkpoint", str(models["A"]), "--arch", str(models["A_arch"])]}
    checked = 0
    for set_name in SETS:
        spec = rehearsal["sets"][set_name]
        dataset = load_dataset(spec["name"], spec["path"])
        items = {item.image_id: item for item in dataset.split(spec["split"]).items}
        references = tmp_path / f"{set_name}.refs.json"
        references.write_text(json.dumps({k: item.captions for k, item in items.items()}))
        image_map = tmp_path / f"{set_name}.images.json"
        image_map.write_text(json.dumps({k: str(item.image_path) for k, item in items.items()}))
        for model in ["xe", *REWARDS]:
            candidates = run_dir / "eval" / reward_slug(model) / f"{set_name}.results.json"
            row = next(r for r in rows if r["test_set"] == set_name and r["model"] == model)
            for family, columns in CONTRASTIVE.items():
                out = tmp_path / f"{set_name}-{reward_slug(model)}-{family}.json"
                code = pacs_cli.main(["evaluate", "--candidates", str(candidates), "--references", str(references),
                                      "--image-map", str(image_map), *options[family],
                                      "--metrics", ",".join(columns.values()), "--out", str(out)])
                assert code == 0
                alone = json.loads(out.read_text())["metrics"]
                for column, metric in columns.items():
                    assert row[column] == pytest.approx(alone[metric], abs=1e-6), (set_name, model, column)
                    checked += 1
    assert checked == len(SETS) * (1 + len(REWARDS)) * 4
