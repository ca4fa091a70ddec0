"""Issue 41 attacks on run records, pooling and METEOR, each run again at smoke size so that none comes back.

Run records are data, not pointers: a stage record's `summary.model` set to a path outside the run (or to another
stage's model) is refused by `pacs train ... --force evaluate` and `tools/pool_seeds.py` in one line naming the
record and the key, and nothing outside is read. Pooling refuses a copied seed folder whose records were edited
(whatever the edit: the record no longer matches its folder, or the model is the same bytes as another seed's),
an `--out` that cannot be written (under a file, in /proc, a full disk) before or without leaving any output,
records whose sections are lists and records that are not UTF-8. METEOR: a caption too long for the jar is
refused before it starts, naming the caption and the limit, and a jar that dies is one line naming the caption,
never a hang. Every attack asserts the exit status, the one line, and that nothing outside or given changed.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from script_modules import load_tool

from pacs import cli as pacs_cli
from pacs.captioner.orchestration.stages import Fingerprint
from pacs.metric.common.run_lock import LOCK_NAME

GUARDED = "seed-0/scst-clip-s-kl0.1"
"""The guarded SCST stage of seed 0 of demo_smoke (its record's `summary.model` names the chosen model)."""


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished demo_smoke run (seeds 0 and 1), trained once for the module; tests work on copies of it."""
    runs = tmp_path_factory.mktemp("smoke")
    assert pacs_cli.main(["--log-level", "ERROR", "train", "--config", "demo_smoke", f"runs_dir={runs}",
                          "threads=1"]) == 0
    return runs / "demo_smoke"


@pytest.fixture
def run(smoke_run: Path, tmp_path: Path) -> Path:
    """This test's copy of the finished run, as `<tmp>/runs/demo_smoke` (records name outputs relative to it)."""
    return Path(shutil.copytree(smoke_run, tmp_path / "runs" / "demo_smoke"))


@pytest.fixture(scope="module")
def tool():
    """tools/pool_seeds.py as a module."""
    return load_tool("pool_seeds")


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file below `folder` by relative path: its sha256. The run lock and the run's log files
    (`logs/*.log`, which record every attempt, a refused one too) aside."""
    return {path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name != LOCK_NAME
            and not (path.parent.name == "logs" and path.suffix == ".log")}


def _one_line(capsys: pytest.CaptureFixture, prefix: str) -> str:
    """The only error line on stderr (it starts with `prefix`); no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, err
    return lines[0]


def _edit_record(run_dir: Path, stage: str, edit: Callable[[dict], object]) -> Path:
    path = run_dir / "stages" / f"{stage}.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    return path


def _no_leftovers(parent: Path, name: str) -> None:
    assert not (parent / name).exists() and not list(parent.glob(f".{name}.*"))


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block runs longer than `seconds`: the hang attacks."""
    def expired(signum, frame):
        raise AssertionError(f"still running after {seconds} s: the attack hangs")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --- 3. a stage record's summary.model is data, not a pointer --------------------------------------------------------

@pytest.mark.parametrize("value, message", [
    ("OUTSIDE", "summary.model ('OUTSIDE') must be a path inside RUN"),  # a real model folder outside the run
    ("../../../..", "summary.model ('../../../..') must be a path inside RUN"),
    ("../xe/best", (f"summary.model ('../xe/best') must name a folder inside RUN/{GUARDED} (a model that stage "
                    "wrote)")),  # inside the run, but another stage's model
])
def test_3_a_model_path_in_a_stage_record_that_leaves_its_stage_is_refused_by_train_and_pool(
        run, tool, tmp_path, capsys, value, message):
    outside = Path(shutil.copytree(run / GUARDED / "best", tmp_path / "outside"))  # loadable, were it followed
    value = value.replace("OUTSIDE", str(outside))
    message = message.replace("OUTSIDE", str(outside)).replace("RUN", str(run))
    record = _edit_record(run, GUARDED, lambda r: r["summary"].update(model=value))
    before, outside_before = _snapshot(run), _snapshot(outside)
    capsys.readouterr()

    code = pacs_cli.main(["--log-level", "ERROR", "train", "--config", "demo_smoke", f"runs_dir={run.parent}",
                          "threads=1", "--force", "evaluate"])
    line = _one_line(capsys, "pacs train: error: ")
    assert code == 2 and f"{record}: {message}" in line, line
    before.pop("config.yaml")  # rewritten with this runs_dir (--force is not sticky); everything else is as it was
    assert {k: v for k, v in _snapshot(run).items() if k != "config.yaml"} == before  # the evaluation (results, table, report) is not replaced by the outside model's
    assert _snapshot(outside) == outside_before

    before = _snapshot(run)
    assert tool.main([str(run), "--out", str(tmp_path / "pooled")]) == 2
    line = _one_line(capsys, "pool_seeds: error: ")
    assert f"{record}: {message}" in line, line
    _no_leftovers(tmp_path, "pooled")
    assert _snapshot(run) == before and _snapshot(outside) == outside_before


@pytest.mark.parametrize("summary, message", [
    ({"model": "log.csv"}, f"outputs: stage {GUARDED} recorded no file in log.csv/ (not a model it wrote)"),
    ({"model": ["best"]}, f"summary.model: expected the name of a model folder of stage {GUARDED}, got list"),
    (["best"], "summary: expected an object, got list"),
])
def test_3_a_model_a_record_names_must_be_one_its_stage_recorded(run, tool, tmp_path, capsys, summary, message):
    record = _edit_record(run, GUARDED, lambda r: r.update(summary=summary if isinstance(summary, list)
                                                                  else {**r["summary"], **summary}))
    before = _snapshot(run)
    capsys.readouterr()
    assert tool.main([str(run), "--out", str(tmp_path / "pooled")]) == 2
    line = _one_line(capsys, "pool_seeds: error: ")
    assert f"{record}: {message}" in line, line
    _no_leftovers(tmp_path, "pooled")
    assert _snapshot(run) == before


def test_3_a_guarded_model_whose_files_differ_from_its_record_is_refused_by_pool(run, tool, tmp_path, capsys):
    model = run / GUARDED / "best" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-1] + b"\1")  # same size, other bytes
    capsys.readouterr()
    assert tool.main([f"{run}:0", "--out", str(tmp_path / "pooled")]) == 2
    line = _one_line(capsys, "pool_seeds: error: ")
    assert f"{run / GUARDED}: changed since its stage finished (seed-0/scst-clip-s-kl0.1/best/model.safetensors " \
           "changed content)" in line, line
    _no_leftovers(tmp_path, "pooled")


# --- 4. a copied seed folder is one model, whatever its records say ----------------------------------------------------

def _copy_seed(run_dir: Path, level: str, source: int = 0, target: int = 2) -> None:
    """Copy seed `source`'s folder and records to seed `target` and list it in config.yaml, editing the records as
    far as `level`: `seed` (settings.seed only), `paths` (and the stage name and output folder), `upstream` (and a
    recomputed fingerprint, the upstream left at the source seed's xe), `all` (a consistent record set)."""
    old, new = f"seed-{source}/", f"seed-{target}/"
    shutil.copytree(run_dir / f"seed-{source}", run_dir / f"seed-{target}")
    (run_dir / "stages" / f"seed-{target}").mkdir()
    ids: dict[str, str] = {}
    for path in sorted((run_dir / "stages" / f"seed-{source}").glob("*.json"), key=lambda p: p.name != "xe.json"):
        record = json.loads(path.read_text())
        record["settings"]["seed"] = target
        if level != "seed":
            record["stage"] = record["stage"].replace(old, new)
            record["outputs"] = {key.replace(old, new): files for key, files in record["outputs"].items()}
        if level in ("upstream", "all"):
            if level == "all":
                record["upstream"] = {name.replace(old, new): ids.get(name.replace(old, new), value)
                                      for name, value in record["upstream"].items()}
            record["fingerprint"] = Fingerprint(record["settings"], record["inputs"], record["upstream"]).digest()
            record["output_id"] = f"{record['fingerprint']}-{uuid.uuid4().hex[:8]}"
            ids[record["stage"]] = record["output_id"]
        (run_dir / "stages" / f"seed-{target}" / path.name).write_text(json.dumps(record))
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["seeds"] = [*config["seeds"], target]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.mark.parametrize("level, message", [
    ("seed", ("stages/seed-2/xe.json: stage: the record names stage 'seed-0/xe', not 'seed-2/xe' (a record copied "
              "from another stage's folder)")),
    ("paths", ("stages/seed-2/xe.json: fingerprint: not the digest of the record's own settings, inputs and upstream "
               "(the record was edited)")),
    ("upstream", ("stages/seed-2/scst-cider.json: upstream.seed-0/xe: a stage of another folder than seed-2/ (a "
                  "record copied from another seed)")),
    ("all", ("COPY/seed-2/xe/best: seed 2's xe model is the same bytes as seed 0's xe model (RUN/seed-0/xe/best): a "
             "copied seed, not another training")),
])
def test_4_pooling_refuses_a_copied_seed_whose_records_were_edited(run, tool, tmp_path, capsys, level, message):
    copy = Path(shutil.copytree(run, tmp_path / "copy"))  # the same metric stages: a copy made to add seeds
    _copy_seed(copy, level)
    before, copy_before = _snapshot(run), _snapshot(copy)
    capsys.readouterr()
    assert tool.main([f"{run}:0", f"{copy}:2", "--out", str(tmp_path / "pooled")]) == 2
    line = _one_line(capsys, "pool_seeds: error: ")
    assert message.replace("COPY", str(copy)).replace("RUN", str(run)) in line, line
    if level != "all":
        assert str(copy / "stages") in line, line
    _no_leftovers(tmp_path, "pooled")
    assert _snapshot(run) == before and _snapshot(copy) == copy_before


# --- 14. pooling's --out, a full disk, records of the wrong types or encodings ----------------------------------------

@pytest.fixture
def no_evaluation(monkeypatch):
    """Fail the test if pooling reaches the evaluation (the refusals below come before any work)."""
    from pacs.captioner.demo import pipeline

    def evaluated(*args, **kwargs):
        raise AssertionError("pooling evaluated the seeds before refusing")

    monkeypatch.setattr(pipeline, "evaluate_seed_models", evaluated)


@pytest.mark.parametrize("where, message", [
    ("FILE/x", "FILE/x: cannot be written: FILE is not a folder"),
    ("FILE/deeper/x", "FILE/deeper/x: cannot be written: FILE is not a folder"),
    ("/proc/pacs-pooled", "/proc/pacs-pooled: cannot be written: "),
])
def test_14_an_out_that_cannot_be_written_is_one_line_before_any_work(run, tool, tmp_path, capsys, no_evaluation,
                                                                      where, message):
    file = tmp_path / "a-file"
    file.write_text("kept\n")
    if where.startswith("/proc") and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    out = Path(where.replace("FILE", str(file)))
    before = _snapshot(run)
    capsys.readouterr()
    assert tool.main([str(run), "--out", str(out)]) == 2
    line = _one_line(capsys, "pool_seeds: error: ")
    assert message.replace("FILE", str(file)) in line, line
    assert file.read_text() == "kept\n" and not out.exists() and _snapshot(run) == before


def test_14_a_full_disk_while_pooling_is_one_line_and_leaves_nothing(run, tool, tmp_path, capsys, monkeypatch):
    from pacs.captioner.demo import pipeline

    def full_disk(config, data, models, guarded, metric_run, out):
        (out / "captions.json").write_text("{\"half")  # what a full disk leaves: a partial file
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "results.json"))

    monkeypatch.setattr(pipeline, "evaluate_seed_models", full_disk)
    out = tmp_path / "new" / "pooled"  # its parent too is made by pooling, and removed again
    before = _snapshot(run)
    capsys.readouterr()
    assert tool.main([str(run), "--out", str(out)]) == 2
    line = _one_line(capsys, "pool_seeds: error: ")
    assert f"{out}: not written, pooling stopped: " in line and "No space left on device; free some disk space" \
        in line, line
    assert not (tmp_path / "new").exists() and _snapshot(run) == before


@pytest.mark.parametrize("stage", ["seed-0/xe", GUARDED])
@pytest.mark.parametrize("key", ["settings", "outputs", "upstream"])
def test_14_a_stage_record_section_that_is_a_list_is_one_line_naming_record_and_key(run, tool, tmp_path, capsys,
                                                                                    no_evaluation, stage, key):
    record = _edit_record(run, stage, lambda r: r.update({key: list(r[key])}))
    before = _snapshot(run)
    capsys.readouterr()
    assert tool.main([str(run), "--out", str(tmp_path / "pooled")]) == 2
    line = _one_line(capsys, "pool_seeds: error: ")
    assert f"{record}: {key}: expected an object, got list" in line, line
    _no_leftovers(tmp_path, "pooled")
    assert _snapshot(run) == before


@pytest.mark.parametrize("file, message", [
    ("stages/seed-1/xe.json", "stages/seed-1/xe.json: not UTF-8 text (byte 1): not a stage record"),
    ("config.yaml", "config.yaml"),
])
def test_14_a_record_or_config_that_is_not_utf8_is_one_line(run, tool, tmp_path, capsys, no_evaluation, file,
                                                            message):
    (run / file).write_bytes(b"{\xff\xfe: 1}\n")
    before = _snapshot(run)
    capsys.readouterr()
    assert tool.main([str(run), "--out", str(tmp_path / "pooled")]) == 2
    line = _one_line(capsys, "pool_seeds: error: ")
    assert str(run / message) in line and "UTF-8" in line, line
    _no_leftovers(tmp_path, "pooled")
    assert _snapshot(run) == before


# --- 9. METEOR: a caption too long for the jar, a jar that dies --------------------------------------------------------

@pytest.fixture
def texts(tmp_path: Path) -> Path:
    """References of two images and a folder to write candidates to."""
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "refs.json").write_text(json.dumps({"a": ["a red square", "a red box"],
                                                  "b": ["a blue circle", "a round blue shape"]}))
    return folder


def _fake_java(folder: Path, body: str) -> Path:
    """An executable `java` (for PACS_JAVA) running the Python `body` instead of a jar; it marks each start."""
    path = folder / "java"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(f"""\
        import sys
        open({str(folder / 'started')!r}, "a").write("x")
        """) + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _meteor(texts: Path, candidates: dict[str, str], out: Path, references: Path | None = None) -> int:
    (texts / "c.json").write_text(json.dumps(candidates))
    with _deadline(120):
        return pacs_cli.main(["evaluate", "--candidates", f"s={texts / 'c.json'}", "--references",
                              str(references or texts / "refs.json"), "--metrics", "meteor", "--bootstrap", "0",
                              "--out", str(out)])


@pytest.mark.parametrize("long", ["candidate", "reference"])
def test_9_a_caption_too_long_for_meteor_is_refused_before_the_jar_starts(texts, tmp_path, capsys, monkeypatch,
                                                                          long):
    from pacs.eval.meteor_stats import MAX_METEOR_WORDS

    java = _fake_java(tmp_path, "sys.exit(1)\n")  # never started: the refusal comes first
    monkeypatch.setenv("PACS_JAVA", str(java))
    words = " ".join(["dog"] * 200_000)
    candidates, references = {"a": "a red square", "b": "a blue circle"}, None
    if long == "candidate":
        candidates["b"] = words
        expected = f"caption 'b': 200000 words, more than the {MAX_METEOR_WORDS} METEOR can align"
    else:
        references = texts / "long_refs.json"
        references.write_text(json.dumps({"a": ["a red square"], "b": ["a blue circle", words]}))
        expected = f"reference 1 of caption 'b': 200000 words, more than the {MAX_METEOR_WORDS} METEOR can align"
    given = {path.name: path.read_bytes() for path in texts.iterdir()}
    capsys.readouterr()
    out = tmp_path / "table.json"
    assert _meteor(texts, candidates, out, references) == 2
    line = _one_line(capsys, "pacs evaluate: error: ")
    assert expected in line, line
    assert not out.exists() and not (tmp_path / "started").exists()
    assert {p.name: p.read_bytes() for p in texts.iterdir() if p.name != "c.json"} == \
        {name: data for name, data in given.items() if name != "c.json"}


def test_9_the_word_limit_is_what_the_jar_scores(texts, tmp_path, capsys):
    """A caption of exactly MAX_METEOR_WORDS words is scored (the limit refuses only what breaks the jar)."""
    from pacs.eval.meteor_stats import MAX_METEOR_WORDS, check_meteor_lengths

    words = " ".join(["dog"] * MAX_METEOR_WORDS)
    check_meteor_lengths([words], [[words]], ["a"])  # no error
    with pytest.raises(Exception, match=rf"^caption 'a': {MAX_METEOR_WORDS + 1} words"):
        check_meteor_lengths([words + " dog"], [["a dog"]], ["a"])


@pytest.mark.parametrize("behaviour, reason", [
    # the jar runs out of memory on caption b: it prints Java's exception and exits
    ("""\
     for line in sys.stdin:
         if "poison" in line:
             sys.stderr.write('Exception in thread "main" java.lang.OutOfMemoryError: Java heap space\\n'
                              '\\tat edu.cmu.meteor.aligner.Aligner.align(Unknown Source)\\n')
             sys.exit(1)
         print("1.0 2.0 3.0", flush=True)
     """, "caption 'b' (java.lang.OutOfMemoryError: Java heap space)"),
    # the jar is gone before it reads anything: a closed pipe, no answer
    ("sys.exit(3)\n", "caption 'a' (exit status 3)"),
    # the jar closes its output and keeps running: end of file is detected, the process is stopped
    ("""\
     import os, time
     os.close(1)
     sys.stdin.readline()
     time.sleep(600)
     """, "caption 'a' (exit status "),
])
def test_9_a_meteor_jar_that_dies_is_one_line_naming_the_caption_and_never_a_hang(texts, tmp_path, capsys,
                                                                                  monkeypatch, behaviour, reason):
    monkeypatch.setenv("PACS_JAVA", str(_fake_java(tmp_path, behaviour)))
    monkeypatch.setattr("pacs.eval.meteor_stats._STOP_SECONDS", 2.0)
    out = tmp_path / "table.json"
    capsys.readouterr()
    assert _meteor(texts, {"a": "a red square", "b": "a poison circle"}, out) == 2
    line = _one_line(capsys, "pacs evaluate: error: ")
    assert f"the METEOR jar died while scoring {reason}" in line, line
    assert not out.exists() and (tmp_path / "started").read_text() == "x"  # one jar, and no retry
