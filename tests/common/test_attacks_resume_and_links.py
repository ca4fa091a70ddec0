"""Issue 31 items 1 and 2, as an attacker would try them: a pickle payload in every file a resume reads (metric
training, XE, SCST) and in a transformers folder's `pytorch_model.bin`, and links planted in run directories.

The payload is an object whose `__reduce__` opens (creates) a marker file: unpickled with `weights_only=False`
it runs (checked below), so a marker that never appears proves pacs never unpickled it. Each attack goes through
the real command line (`pacs.cli.main`) and must end in one error line naming the file and exit status 2.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from pacs import cli as pacs_cli

WORDS = ["dog", "cat", "man", "woman", "red", "blue", "ball", "grass", "water", "snow", "runs", "sits"]


class Payload:
    """Unpickled, it creates `marker` (what `os.system` would do, without a shell)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple:
        return (open, (self.marker, "w"))


def plant(path: Path, marker: Path) -> None:
    """Replace `path` with a torch file (zip format, as accelerate writes them) holding the payload."""
    torch.save({"state": Payload(marker)}, path)


def test_the_payload_runs_when_unpickled_without_weights_only(tmp_path):
    """Control: the payload is live, so its marker staying absent below means nothing unpickled it."""
    marker = tmp_path / "marker"
    plant(tmp_path / "file.bin", marker)
    torch.load(tmp_path / "file.bin", weights_only=False)
    assert marker.is_file()


def _error_lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def _check_refused(code: int, lines: list[str], path: Path, marker: Path) -> None:
    assert code == 2
    assert len(lines) == 1 and str(path) in lines[0], lines
    assert not marker.exists()


# --- metric training: `pacs train-metric ... resume=STATE` ---------------------------------------------------------

def _manifest(folder: Path, n: int = 8) -> Path:
    (folder / "img").mkdir(parents=True)
    lines = []
    for i in range(n):
        Image.new("RGB", (16, 16), (i * 40, 0, 0)).save(folder / "img" / f"{i}.png")
        Image.new("RGB", (16, 16), (0, i * 40, 0)).save(folder / "img" / f"g{i}.png")
        lines.append(json.dumps({"image_id": str(i), "caption_id": str(i), "real_image": f"img/{i}.png",
                                 "caption": WORDS[i], "gen_caption": WORDS[i + 1], "gen_image": f"img/g{i}.png",
                                 "split": "val" if i >= n - 2 else "train"}))
    path = folder / "manifest.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _train_metric(manifest: Path, out: Path, *extra: str) -> int:
    return pacs_cli.main(["--log-level", "ERROR", "train-metric", "--manifest", str(manifest), "--output-dir",
                          str(out), "backbone=null", "random_init=true", "batch_size=2", "eval_every=1",
                          "log_every=0", *extra])


@pytest.fixture(scope="module")
def metric_state(tmp_path_factory) -> tuple[Path, Path]:
    """(manifest, saved state folder of step 2) of a tiny metric training."""
    folder = tmp_path_factory.mktemp("metric")
    manifest = _manifest(folder)
    assert _train_metric(manifest, folder / "run", "max_steps=2", "save_every=2") == 0
    return manifest, folder / "run" / "state" / "step_00000002"


def test_a_metric_training_state_holds_no_pickled_object_and_resumes(metric_state, tmp_path):
    manifest, state = metric_state
    assert sorted(p.name for p in state.iterdir()) == [
        "best_weights.safetensors", "model.safetensors", "optimizer.bin", "random_states_0.pkl",
        "trainer_state.json"]
    saved = json.loads((state / "trainer_state.json").read_text())
    assert (saved["step"], saved["epoch"], saved["batch_in_epoch"]) == (2, 0, 2)
    assert _train_metric(manifest, tmp_path / "resumed", f"resume={state}", "max_steps=3") == 0
    assert json.loads((tmp_path / "resumed" / "train_log.json").read_text())["steps"] == 3


@pytest.mark.parametrize("name", ["best_weights.safetensors", "model.safetensors", "optimizer.bin",
                                  "random_states_0.pkl", "trainer_state.json", "custom_checkpoint_0.pkl"])
def test_a_payload_in_a_metric_training_state_is_one_error_and_never_runs(metric_state, tmp_path, capsys, name):
    """Every file of the state (and the pickled trainer state pacs 0.5 wrote, which accelerate unpickles with
    weights_only=False) is refused naming it; the marker never appears and no output is written."""
    manifest, state = metric_state
    copy, marker = tmp_path / "state", tmp_path / "marker"
    shutil.copytree(state, copy)
    plant(copy / name, marker)
    capsys.readouterr()
    code = _train_metric(manifest, tmp_path / "out", f"resume={copy}", "max_steps=3")
    _check_refused(code, _error_lines(capsys), copy / name, marker)
    assert not (tmp_path / "out" / "checkpoint.safetensors").exists()


# --- pipeline XE and SCST: `pacs train` resuming an interrupted stage ----------------------------------------------

def _pipeline_config(run_dir: Path, flickr: Path) -> dict:
    from tests.captioner.captioner_testkit import tiny_pipeline_recipe

    return tiny_pipeline_recipe(run_dir, flickr)


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory, shared_data) -> tuple[Path, Path, Path]:
    """(config file, run directory, pristine copy) of a finished tiny pipeline run that kept its XE and SCST
    checkpoints (stage records name their inputs by absolute path: a test restores the copy in place)."""
    folder = tmp_path_factory.mktemp("pipeline")
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(_pipeline_config(folder / "run", shared_data / "flickr8k")))
    assert pacs_cli.main(["--log-level", "ERROR", "train", "--config", str(config)]) == 0
    shutil.copytree(folder / "run", folder / "pristine")
    return config, folder / "run", folder / "pristine"


def _interrupted(pipeline_run: tuple[Path, Path, Path], stage: str) -> Path:
    """Restore the run, make `stage` look interrupted (record 'running'); return its latest checkpoint folder."""
    _, run, pristine = pipeline_run
    shutil.rmtree(run)
    shutil.copytree(pristine, run)
    record_path = run / "stages" / f"{stage}.json"
    record = json.loads(record_path.read_text())
    record["status"] = "running"
    record_path.write_text(json.dumps(record))
    return max((run / stage / "checkpoints").glob("step-*"))


def _reseal(checkpoint: Path) -> None:
    """Rewrite the checkpoint's manifest for its current files, as an attacker would (sizes and sha256 match)."""
    manifest_path = checkpoint / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"] = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                         for p in sorted(checkpoint.iterdir()) if p.name != "manifest.json"}
    manifest_path.write_text(json.dumps(manifest))


RESUME_FILES = {
    "xe": ["manifest.json", "model.safetensors", "optimizer.bin", "random_states_0.pkl", "scheduler.bin",
           "trainer_state.json"],
    "scst-cider": ["extra_state_0.pt", "manifest.json", "model.safetensors", "optimizer.bin", "random_states_0.pkl",
                   "trainer_state.json"],
}


def test_the_pipeline_checkpoints_hold_the_files_attacked_below(pipeline_run):
    for stage, names in RESUME_FILES.items():
        latest = max((pipeline_run[2] / stage / "checkpoints").glob("step-*"))
        assert sorted(p.name for p in latest.iterdir()) == names


@pytest.mark.parametrize("stage,name", [(stage, name) for stage, names in RESUME_FILES.items() for name in names])
def test_a_payload_in_a_pipeline_checkpoint_is_one_error_and_never_runs(pipeline_run, tmp_path, capsys, stage, name):
    config, marker = pipeline_run[0], tmp_path / "marker"
    checkpoint = _interrupted(pipeline_run, stage)
    plant(checkpoint / name, marker)
    if name != "manifest.json":
        _reseal(checkpoint)  # past the manifest's sha256 check: the reader itself must refuse the file
    capsys.readouterr()
    code = pacs_cli.main(["--log-level", "ERROR", "train", "--config", str(config)])
    _check_refused(code, _error_lines(capsys), checkpoint / name, marker)


@pytest.mark.parametrize("stage", list(RESUME_FILES))
def test_an_interrupted_pipeline_stage_resumes_from_its_intact_checkpoint(pipeline_run, capsys, stage):
    """Control for the attacks above: the same interrupted run without a payload resumes and finishes (exit 0)."""
    config, run, _ = pipeline_run
    _interrupted(pipeline_run, stage)
    assert pacs_cli.main(["--log-level", "ERROR", "train", "--config", str(config)]) == 0
    assert json.loads((run / "stages" / f"{stage}.json").read_text())["status"] == "finished"


def test_compare_rewards_resuming_a_payload_checkpoint_is_one_error_and_never_runs(pipeline_run, tmp_path, capsys):
    """recipes/compare_rewards.py resumes through the same pipeline: its own one-line error, exit 2."""
    import runpy

    config, marker = pipeline_run[0], tmp_path / "marker"
    checkpoint = _interrupted(pipeline_run, "scst-cider")
    plant(checkpoint / "extra_state_0.pt", marker)
    _reseal(checkpoint)
    compare = runpy.run_path(str(Path(__file__).resolve().parents[2] / "recipes" / "compare_rewards.py"),
                             run_name="compare_rewards")
    capsys.readouterr()
    code = compare["main"](["--config", str(config), "--reward", "cider"])
    lines = [line for line in _error_lines(capsys) if line.startswith("compare_rewards:")]
    _check_refused(code, lines, checkpoint / "extra_state_0.pt", marker)


# --- the demo: a stage's outputs are safetensors / JSON / CSV / PNG, never a pickle --------------------------------

def _is_pickle(path: Path) -> bool:
    """A plain pickle (protocol 2+ header) or torch's zip format (a `data.pkl` member)."""
    import zipfile

    with open(path, "rb") as handle:
        head = handle.read(2)
    if head[:1] == b"\x80" and head[1:2] in {bytes([n]) for n in range(2, 6)}:
        return True
    return zipfile.is_zipfile(path) and any(n.endswith("data.pkl") for n in zipfile.ZipFile(path).namelist())


@pytest.mark.slow
def test_a_demo_rerun_reads_no_pickle_and_remakes_a_planted_output(tmp_path, capsys):
    """A demo stage resume reads stage records and the outputs of finished stages: none is a pickle; an output
    replaced by a payload no longer matches its record, so the stage is made again and nothing runs."""
    command = ["--log-level", "ERROR", "train", "--config", "demo_smoke", f"runs_dir={tmp_path / 'runs'}",
               "threads=1", "seeds=[0]"]
    assert pacs_cli.main(command) == 0
    run = tmp_path / "runs" / "demo_smoke"
    files = [p for p in run.rglob("*") if p.is_file() and p.name != ".pacs.lock"]
    assert files and not [p for p in files if _is_pickle(p)]
    planted, marker = next(run.rglob("scst-judge/final/model.safetensors")), tmp_path / "marker"
    plant(planted, marker)
    capsys.readouterr()
    assert pacs_cli.main(command) == 0
    ran = capsys.readouterr().out.split("stages: ", 1)[1].split(")")[0]
    assert "scst-judge" in ran  # made again
    assert not marker.exists() and not _is_pickle(planted)


# --- `pacs caption` with a transformers folder whose pytorch_model.bin is a payload -------------------------------

def test_a_payload_pytorch_model_bin_given_to_caption_is_one_error_and_never_runs(tmp_path, capsys):
    import transformers

    folder, marker = tmp_path / "blip", tmp_path / "marker"
    folder.mkdir()
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", *WORDS]) + "\n")
    tokenizer = transformers.BertTokenizer(str(vocab), bos_token="[DEC]")
    tiny = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 37}
    text = tiny | {"vocab_size": 6 + len(WORDS), "pad_token_id": 0, "bos_token_id": 5, "eos_token_id": 3,
                   "sep_token_id": 3, "max_position_embeddings": 64}
    config = transformers.BlipConfig(text_config=text, vision_config=tiny | {"image_size": 32, "patch_size": 8},
                                     projection_dim=32)
    transformers.BlipForConditionalGeneration(config).save_pretrained(folder)
    transformers.BlipProcessor(transformers.BlipImageProcessor(size={"height": 32, "width": 32}),
                               tokenizer).save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    plant(folder / "pytorch_model.bin", marker)
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(images / "a.png")
    capsys.readouterr()
    code = pacs_cli.main(["caption", "--checkpoint", str(folder), "--images", str(images), "--out",
                          str(tmp_path / "out.json")])
    _check_refused(code, _error_lines(capsys), folder / "pytorch_model.bin", marker)
    assert not (tmp_path / "out.json").exists()


# --- links planted in run directories ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_linked_run_lock_is_one_error_and_its_target_is_untouched(tmp_path, capsys, kind):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious data\n")
    run_dir = tmp_path / "runs" / "demo_smoke"
    run_dir.mkdir(parents=True)
    lock = run_dir / ".pacs.lock"
    os.symlink(outside, lock) if kind == "symlink" else os.link(outside, lock)
    before = outside.stat()
    capsys.readouterr()
    code = pacs_cli.main(["train", "--config", "demo_smoke", f"runs_dir={tmp_path / 'runs'}", "threads=1"])
    lines = _error_lines(capsys)
    assert code == 2 and len(lines) == 1 and str(lock) in lines[0], lines
    assert outside.read_text() == "precious data\n"
    after = outside.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert not (run_dir / "stages").exists()  # refused before any work


@pytest.mark.parametrize("folder", ["stages", "xe"])
def test_a_symlinked_stage_folder_of_a_pipeline_run_is_one_error_and_stays_empty(tmp_path, shared_data, capsys,
                                                                                folder):
    """The stage records' folder, or a stage's output folder, planted as a link to a folder outside the run."""
    outside, run = tmp_path / "outside", tmp_path / "run"
    outside.mkdir()
    run.mkdir()
    os.symlink(outside, run / folder)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_pipeline_config(run, shared_data / "flickr8k")))
    capsys.readouterr()
    code = pacs_cli.main(["--log-level", "ERROR", "train", "--config", str(config)])
    lines = [line for line in _error_lines(capsys) if line.startswith("pacs ")]
    assert code == 2 and lines == [(f"pacs train: error: {run / folder} is a symbolic link: pacs never writes "
                                   "through a link in a run directory (remove it)")]
    assert list(outside.iterdir()) == []


def test_a_symlinked_csv_log_is_refused_and_its_target_untouched(tmp_path):
    from pacs.captioner.modeling.training_setup import CSVTracker
    from pacs.metric.common.errors import InputError

    outside = tmp_path / "outside.csv"
    outside.write_text("keep\n")
    (tmp_path / "stage").mkdir()
    os.symlink(outside, tmp_path / "stage" / "log.csv")
    tracker = CSVTracker(tmp_path / "stage" / "log.csv", ["loss"])
    with pytest.raises(InputError, match="log.csv is a symbolic link"):
        tracker.start()
    assert outside.read_text() == "keep\n"


@pytest.mark.parametrize("folder", ["state", "adapter"])
def test_metric_training_writes_nothing_into_a_symlinked_output_folder(metric_state, tmp_path, capsys, folder):
    manifest, _ = metric_state
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "run").mkdir()
    os.symlink(outside, tmp_path / "run" / folder)
    capsys.readouterr()
    code = _train_metric(manifest, tmp_path / "run", "max_steps=2", "save_every=1")
    lines = [line for line in _error_lines(capsys) if not line.startswith("train-metric:")]  # not the progress bar
    assert code == 2 and len(lines) == 1 and str(tmp_path / "run" / folder) in lines[0], lines
    assert list(outside.iterdir()) == []


def test_an_atomic_output_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    from pacs.metric.common.io import write_json_atomic

    outside = tmp_path / "outside.json"
    outside.write_text("keep\n")
    os.symlink(outside, tmp_path / "record.json")
    write_json_atomic(tmp_path / "record.json", {"status": "finished"})
    assert outside.read_text() == "keep\n"
    assert not (tmp_path / "record.json").is_symlink()
    assert json.loads((tmp_path / "record.json").read_text()) == {"status": "finished"}
