"""The attacks on 0.5 (issue 31), each run again at smoke size so that none comes back.

A hostile or clumsy user: payloads, links, huge sizes, full disks, odd names. The attacks that fell in 0.5 are
one line and exit 2 now (bounds at load, math text in a system name, a full disk while saving weights, an output
under a file, a decompression bomb, control characters on the terminal); the ones that held must keep holding (the
run lock, verified stages, confined ids and gallery paths, HTML escaping, divergence stops, malformed JSON, pickle
payloads to score / evaluate / export, the umask, a bit-exact SCST resume). Attacks 1-4 (unpickling on resume, a
symlinked lock) are tested in tests/common/test_attacks_resume_and_links.py and 5 (caption through a symlink) with
the image-lookup rule (tests/common/test_image_lookup.py).
"""
from __future__ import annotations

import errno
import importlib
import importlib.util
import io
import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_errors import one_error_line
from image_files import decompression_bomb
from PIL import Image
from script_modules import load_captioner_testkit

from pacs import cli as pacs_cli
from pacs.metric.common.terminal import TerminalFormatter, escape_control

TESTS = Path(__file__).resolve().parents[1]
ESC = "\x1b"


def _png(path: Path, colour: tuple[int, int, int] = (200, 30, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), colour).save(path)
    return path


@pytest.fixture
def texts(tmp_path: Path) -> Path:
    """Two images' references and two systems' captions as JSON files."""
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "refs.json").write_text(json.dumps({"a": ["a red square", "a red box"],
                                                  "b": ["a blue circle", "a round blue shape"]}))
    (folder / "s1.json").write_text(json.dumps({"a": "a red square", "b": "a blue circle"}))
    (folder / "s2.json").write_text(json.dumps({"a": "red", "b": "a circle"}))
    return folder


def _evaluate(texts: Path, *extra: str) -> int:
    """`pacs evaluate` of the two systems of `texts` (length and BLEU-1: no model, no Java)."""
    return pacs_cli.main(["evaluate", "--candidates", f"s1={texts / 's1.json'}", f"s2={texts / 's2.json'}",
                          "--references", str(texts / "refs.json"), "--metrics", "length,bleu1", "--bootstrap", "0",
                          *extra])


# --- attacks that fell in 0.5 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ("threads=100000", "threads=100000: expected int >= 1 and <= 256"),
    ("world.image_size=100000", "world.image_size=100000: expected int >= 1 and <= 512"),
    ("scst.max_steps=99999999999999999999", "scst.max_steps=99999999999999999999: expected int >= 1 and <= 100000"),
    ("world.n_train=1000000000", "world.n_train=1000000000: expected int >= 1 and <= 100000"),
])
def test_7_huge_sizes_are_refused_at_load(override, message, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert pacs_cli.main(["train", "--config", "demo_smoke", f"runs_dir={runs}", override]) == 2
    line = one_error_line(capsys, among_other_lines=True, command="train")
    assert message in line and "demo_smoke.yaml" in line, line
    assert not runs.exists()  # refused before any work


def test_6_a_system_name_in_math_text_is_drawn_as_written(texts, tmp_path, capsys):
    names = ["$\\foo$", "a$b", "$x^{$"]
    for name, file in zip(names, ("s1", "s2", "s1")):
        (texts / f"{len(name)}.json").write_text((texts / f"{file}.json").read_text())
    out = tmp_path / "table.json"
    code = pacs_cli.main(["evaluate", "--candidates", *[f"{name}={texts / f'{len(name)}.json'}" for name in names],
                          "--references", str(texts / "refs.json"), "--metrics", "length", "--bootstrap", "0",
                          "--out", str(out), "--plot", str(tmp_path / "table.png")])
    assert code == 0, capsys.readouterr().err
    assert [row["system"] for row in json.loads(out.read_text())["rows"]] == names
    with Image.open(tmp_path / "table.png") as plot:
        assert plot.size[0] > 100 and plot.size[1] > 50


def test_8_a_full_disk_while_pacs_train_saves_weights_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys,
                                                                                  torch_threads_restored):
    import safetensors.torch
    from safetensors import SafetensorError

    written: list[str] = []

    def full_disk(tensors, filename, metadata=None):
        written.append(str(filename))
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    for module in ("accelerate.utils.other", "pacs.captioner.modeling.checkpoints", "pacs.captioner.modeling.features"):
        importlib.import_module(module)  # they bind `save_file` when imported: the real one, not the fake
    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    code = pacs_cli.main(["--log-level", "WARNING", "train", "--config", "demo_smoke", f"runs_dir={tmp_path}"])
    line = one_error_line(capsys, among_other_lines=True, command="train")
    assert code == 2 and len(written) == 1
    tmp = Path(written[0])  # the temporary file next to the weights file the stage was writing
    target = tmp.parent / tmp.name[1:].rsplit(".", 2)[0]
    assert line == (f"pacs train: error: {target}: No space left on device; free some disk space (or write to "
                    "another disk) and run again; finished work is kept and an interrupted stage resumes or restarts")
    assert not target.exists() and not tmp.exists()


def test_8_a_full_disk_while_saving_a_lora_adapter_names_the_weights_file(tmp_path, monkeypatch):
    import peft.peft_model
    from safetensors import SafetensorError

    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    from pacs.metric.models.lora import attach_lora, save_adapter

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    backbone = attach_lora(build_backbone_from_config(tiny_clip_config(), seed=0))
    monkeypatch.setattr(peft.peft_model, "safe_save_file", full_disk)
    folder = tmp_path / "adapter"
    with pytest.raises(OSError) as error:
        save_adapter(backbone, folder)
    assert (error.value.errno, error.value.filename) == (errno.ENOSPC, str(folder / "adapter_model.safetensors"))
    assert list(folder.iterdir()) == []  # no partial adapter, no temporary folder


def test_8_a_full_disk_while_saving_a_captioner_names_the_weights_file(tmp_path, monkeypatch):
    from safetensors import SafetensorError

    from pacs.captioner.modeling import checkpoints

    kit = load_captioner_testkit()
    model_folder = kit.tiny_checkpoint(tmp_path)  # a captioner to save again
    model, vocab, _ = checkpoints.load_captioner(model_folder)

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoints, "save_file", full_disk)
    with pytest.raises(OSError) as error:
        checkpoints.save_captioner(tmp_path / "again", model, vocab, {"backbone": "test"})
    assert (error.value.errno, error.value.filename) == (errno.ENOSPC, str(tmp_path / "again" / "model.safetensors"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["feats", "init"])  # nothing half-written


def test_8_a_full_disk_in_any_safetensors_write_is_one_line(tmp_path, monkeypatch, capsys):
    """The CLI's safety net: a `SafetensorError` carrying an OS error, raised where no file name was attached (an
    accelerate state), names the folder of the file safetensors was writing."""
    from safetensors import SafetensorError

    import pacs.eval.report
    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28) at path "
                              f'"{tmp_path / "run" / ".tmpAb12Cd"}"')

    monkeypatch.setattr(pacs.eval.report, "write_report", full_disk)
    assert pacs_cli.main(["report", str(tmp_path / "run")]) == 2
    assert one_error_line(capsys, among_other_lines=True, command="report") == (f"pacs report: error: {tmp_path / 'run'}: No space left on device; "
                                                 "free some disk space (or write to another disk) and run again")


@pytest.mark.parametrize("command", ["score", "evaluate", "report"])
def test_9_an_output_under_a_regular_file_is_one_line(command, texts, tmp_path, capsys):
    blocker = tmp_path / "f"
    blocker.write_text("a file, not a folder")
    out = blocker / "o.json"
    if command == "score":
        images = tmp_path / "images"
        _png(images / "a.png")
        (tmp_path / "c.json").write_text(json.dumps({"a": "a red square"}))
        code = pacs_cli.main(["score", "--metric", "clip-s", "--backbone", "tiny-random", "--images", str(images),
                              "--candidates", str(tmp_path / "c.json"), "--out", str(out)])
    elif command == "evaluate":
        code = _evaluate(texts, "--out", str(out))
    else:
        run = tmp_path / "run"
        run.mkdir()
        (run / "results.json").write_text(json.dumps({"columns": ["C"], "rows": [{"model": "xe", "C": 1.0}]}))
        code = pacs_cli.main(["report", str(run), "--out", str(out)])
    line = one_error_line(capsys, among_other_lines=True, command=command)
    assert code == 2
    assert line == (f"pacs {command}: error: {blocker}: Not a directory; a part of that path is a file, not a folder:"
                    " remove it or choose another path")
    assert blocker.read_text() == "a file, not a folder"


def test_10_a_decompression_bomb_is_one_line_for_caption_as_for_score(tmp_path, capsys):
    from pacs.captioner.modeling.checkpoints import save_captioner
    from pacs.captioner.modeling.model import Captioner, CaptionerConfig
    from pacs.captioner.modeling.vocab import build_vocab
    from pacs.metric.models.backbones import tiny_clip_config

    images = tmp_path / "images"
    images.mkdir()
    bomb = decompression_bomb(images / "bomb.png")
    assert bomb.stat().st_size < 10_000
    why = "Image size (900000000 pixels) exceeds limit of 178956970 pixels, could be decompression bomb DOS attack."
    (tmp_path / "c.json").write_text(json.dumps({"bomb": "a black square"}))
    assert pacs_cli.main(["score", "--metric", "clip-s", "--backbone", "tiny-random", "--images", str(images),
                          "--candidates", str(tmp_path / "c.json")]) == 2
    assert f"cannot read image {bomb}: {why}" in one_error_line(capsys, among_other_lines=True, command="score")

    vocab = build_vocab("word", ["a black square"], min_count=1, max_length=6)
    config = CaptionerConfig(d_model=32, n_heads=4, encoder_layers=1, decoder_layers=1, ffn_dim=64, dropout=0.0,
                             vocab_size=len(vocab), feature_dim=64, max_length=vocab.max_length)
    checkpoint = save_captioner(tmp_path / "captioner", Captioner(config), vocab,
                                {"random_config": tiny_clip_config(), "random_seed": 0})
    out = tmp_path / "captions.json"
    assert pacs_cli.main(["caption", "--checkpoint", str(checkpoint), "--images", str(images),
                          "--out", str(out)]) == 2
    assert one_error_line(capsys, among_other_lines=True, command="caption") == f"pacs caption: error: image 'bomb': cannot read image {bomb}: {why}"
    assert not out.exists()


def test_11_control_characters_of_user_text_are_escaped_on_the_terminal(texts, tmp_path, capsys):
    assert escape_control("id\x00a\x1b[2J\rb\nc\td\u202e\x9b") == "id\\x00a\\x1b[2J\\x0db\\x0ac\td\\u202e\\x9b"
    # a system name: the printed table
    named = f"evil{ESC}[31m\x00"
    (texts / "evil.json").write_text((texts / "s1.json").read_text())
    code = pacs_cli.main(["evaluate", "--candidates", f"{named}={texts / 'evil.json'}", f"s2={texts / 's2.json'}",
                          "--references", str(texts / "refs.json"), "--metrics", "length", "--bootstrap", "0"])
    printed = capsys.readouterr().out
    assert code == 0 and "evil\\x1b[31m\\x00" in printed and ESC not in printed and "\x00" not in printed
    # a path in an error line
    missing = texts / f"gone{ESC}]0;title\x07.json"
    assert pacs_cli.main(["evaluate", "--candidates", f"x={missing}", "--references", str(texts / "refs.json"),
                          "--metrics", "length"]) == 2
    line = one_error_line(capsys, among_other_lines=True, command="evaluate")
    assert "gone\\x1b]0;title\\x07.json" in line and ESC not in line and "\x07" not in line
    # a warning through the CLI's log handler
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TerminalFormatter("%(levelname)s %(name)s: %(message)s"))
    record = logging.LogRecord("pacs.test", logging.WARNING, __file__, 1, "skipped image %r (%s)",
                               ("a\x1b[2J", f"b{ESC}[1m\nsecond line"), None)
    handler.emit(record)
    assert stream.getvalue() == "WARNING pacs.test: skipped image 'a\\x1b[2J' (b\\x1b[1m\nsecond line)\n"


def test_a_python_warning_reaches_the_terminal_escaped() -> None:
    """`warnings.warn` text (pacs' deprecation warnings echo a config path; libraries' warnings too) goes through the
    CLIs' log handler (`setup_terminal_logging`), so its control characters are escaped like every log line."""
    code = ("import warnings\nfrom pacs.metric.common.terminal import setup_terminal_logging\nsetup_terminal_logging()\n"
            "warnings.warn('config evil\\x1b]0;title\\x07.yaml: key is deprecated', DeprecationWarning)\n")
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2], check=False)
    assert done.returncode == 0, done.stderr
    assert "config evil\\x1b]0;title\\x07.yaml: key is deprecated" in done.stderr, done.stderr
    assert ESC not in done.stderr and "\x07" not in done.stderr
    assert done.stderr.startswith("WARNING py.warnings: ")


@pytest.mark.parametrize("command", ["score", "evaluate"])
def test_11_a_full_disk_in_score_or_evaluate_names_the_file_and_no_stage(command, texts, tmp_path, monkeypatch,
                                                                        capsys):
    import pacs.metric.common.io as common_io

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what write() raises: no file name

    out = tmp_path / "out" / "result.json"
    images = tmp_path / "images"
    _png(images / "a.png")
    (tmp_path / "c.json").write_text(json.dumps({"a": "a red square"}))
    monkeypatch.setattr(common_io.json, "dump", full_disk)
    if command == "score":
        code = pacs_cli.main(["score", "--metric", "clip-s", "--backbone", "tiny-random", "--images", str(images),
                              "--candidates", str(tmp_path / "c.json"), "--out", str(out)])
    else:
        code = _evaluate(texts, "--out", str(out))
    line = one_error_line(capsys, among_other_lines=True, command=command)
    assert code == 2
    assert line == (f"pacs {command}: error: {out}: No space left on device; free some disk space (or write to "
                    "another disk) and run again")
    assert list(out.parent.iterdir()) == []  # no partial output, no temporary file


# --- attacks that held in 0.5 --------------------------------------------------------------------------------------

HOLD = """
import sys, time
from pacs.metric.common.run_lock import RunDirectoryLock
lock = RunDirectoryLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_run_lock_a_second_train_exits_2_naming_the_holder(tmp_path, capsys):
    run_dir = tmp_path / "runs" / "demo_smoke"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in run_dir.iterdir())
        assert pacs_cli.main(["train", "--config", "demo_smoke", f"runs_dir={run_dir.parent}"]) == 2
        line = one_error_line(capsys, among_other_lines=True, command="train")
        assert f"is in use by pid {holder.pid} on host " in line, line
        assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing written
    finally:
        holder.kill()
        holder.wait()


def test_verified_stages_a_changed_output_reruns_the_stage(tmp_path, caplog):
    from pacs.captioner.orchestration.stages import StageRunner

    calls: list[str] = []

    def chain() -> StageRunner:
        runner = StageRunner(tmp_path / "run")

        def make() -> None:
            calls.append("make")
            (runner.folder("make") / "weights.bin").write_bytes(bytes(range(256)) * 8)

        def use() -> None:
            calls.append("use")
            (runner.folder("use") / "out.txt").write_text("ok")

        runner.run("make", make, {"size": 1})
        runner.run("use", use, {}, upstream=["make"])
        return runner

    chain()
    weights = tmp_path / "run" / "make" / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0xFF  # the attacker swaps one byte, same size
    weights.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="pacs.captioner.orchestration.stages"):
        runner = chain()
    assert calls == ["make", "use", "make", "use"] and runner.ran == ["make", "use"]
    assert weights.read_bytes() == bytes(range(256)) * 8


def test_confined_ids_and_gallery_paths(tmp_path, capsys):
    images = tmp_path / "images"
    _png(images / "a.png")
    secret = _png(tmp_path / "outside" / "secret.png")
    (tmp_path / "c.json").write_text(json.dumps({"a": "a red square", "../outside/secret": "a caption"}))
    out = tmp_path / "out.json"
    assert pacs_cli.main(["score", "--metric", "clip-s", "--backbone", "tiny-random", "--images", str(images),
                          "--candidates", str(tmp_path / "c.json"), "--out", str(out)]) == 2
    line = one_error_line(capsys, among_other_lines=True, command="score")
    assert "image id '../outside/secret'" in line and "must be a path inside the image folder" in line, line
    assert not out.exists()
    run = tmp_path / "run"
    _png(run / "gallery" / "ok.png")
    (run / "gallery.json").write_text(json.dumps([
        {"image_id": "ok", "image": "gallery/ok.png", "references": ["a red square"], "captions": {}},
        {"image_id": "bad", "image": f"../{secret.parent.name}/{secret.name}", "references": [], "captions": {}}]))
    assert pacs_cli.main(["report", str(run)]) == 2
    line = one_error_line(capsys, among_other_lines=True, command="report")
    assert "entry #1 (image id 'bad')" in line and "must be a path inside the run directory" in line, line
    assert not (run / "report.html").exists()


def test_html_in_names_and_captions_is_escaped_in_the_report(tmp_path, capsys):
    run = tmp_path / "run"
    _png(run / "gallery" / "ok.png")
    attack = "<script>alert(1)</script>"
    (run / "results.json").write_text(json.dumps({"columns": ["C"], "rows": [{"model": attack, "C": 1.0}]}))
    (run / "gallery.json").write_text(json.dumps([{"image_id": "ok", "image": "gallery/ok.png",
                                                   "references": [attack],
                                                   "captions": {attack: {"caption": f"a {attack}"}}}]))
    assert pacs_cli.main(["report", str(run)]) == 0, capsys.readouterr().err
    page = (run / "report.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page


def test_divergence_stops_xe_at_the_first_non_finite_loss(tmp_path):
    from pacs.captioner.modeling.train_xe import XEConfig, train_xe
    from pacs.captioner.modeling.training_setup import ScheduleConfig
    from pacs.captioner.modeling.vocab import build_vocab
    from pacs.metric.common.errors import TrainingDivergedError

    kit = load_captioner_testkit()
    cache, train, val = kit.tiny_data(tmp_path)
    vocab = build_vocab("word", [c for _, c in train], min_count=1, max_length=8)
    config = XEConfig(output_dir=str(tmp_path / "xe"), max_steps=4, batch_size=16, micro_batch_size=8,
                      schedule=ScheduleConfig(warmup_steps=0, constant_until=4, decay_until=4, peak_lr=1e308,
                                              final_lr=1.0),
                      eval_every=0, val_beam_size=1, val_max_images=2, save_every=0, log_every=1, trackers=[])
    with pytest.raises(TrainingDivergedError, match="training diverged at optimizer step 2"):
        train_xe(config, kit.tiny_model_config(), vocab, cache, train, val)
    assert not (tmp_path / "xe" / "best").exists() and not (tmp_path / "xe" / "final").exists()


def test_malformed_json_is_one_line_naming_file_and_line(texts, capsys):
    bad = texts / "bad.json"
    bad.write_text('{"a": "a red square",\n "b": }\n')
    assert pacs_cli.main(["evaluate", "--candidates", f"x={bad}", "--references", str(texts / "refs.json"),
                          "--metrics", "length"]) == 2
    line = one_error_line(capsys, among_other_lines=True, command="evaluate")
    assert str(bad) in line and "line 2" in line, line


class _Payload:
    """Unpickling runs `touch MARKER` (what an attacker's checkpoint does)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("command", ["score", "evaluate", "export"])
def test_pickle_payloads_are_refused_and_never_run(command, texts, tmp_path, capsys):
    marker = tmp_path / "PWNED"
    payload = tmp_path / "model.pt"
    torch.save({"state_dict": {"x": _Payload(marker)}}, payload)
    images = tmp_path / "images"
    _png(images / "a.png")
    (tmp_path / "c.json").write_text(json.dumps({"a": "a red square"}))
    if command == "score":
        argv = ["score", "--metric", "clip-s", "--checkpoint", str(payload), "--images", str(images),
                "--candidates", str(tmp_path / "c.json")]
    elif command == "evaluate":
        argv = ["evaluate", "--candidates", f"s1={texts / 's1.json'}", "--references", str(texts / "refs.json"),
                "--metrics", "clip-s", "--images", str(images), "--checkpoint", str(payload)]
        (texts / "s1.json").write_text(json.dumps({"a": "a red square"}))
        (texts / "refs.json").write_text(json.dumps({"a": ["a red square"]}))
    else:
        argv = ["export", "--checkpoint", str(payload), "--out", str(tmp_path / "exported")]
    assert pacs_cli.main(argv) == 2
    line = one_error_line(capsys, among_other_lines=True, command=command)
    assert str(payload) in line, line
    assert not marker.exists()


def test_outputs_follow_the_umask(texts, tmp_path):
    out = tmp_path / "new" / "table.json"
    previous = os.umask(0o027)
    try:
        assert _evaluate(texts, "--out", str(out)) == 0
    finally:
        os.umask(previous)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and stat.S_IMODE(out.parent.stat().st_mode) == 0o750


class _Interrupt(Exception):
    """Raised by the reward at a chosen call: the run stops as a killed one would, between checkpoints."""


def test_scst_resume_is_bit_exact(tmp_path):
    from pacs.captioner.modeling.train_scst import SCSTConfig, train_scst

    kit = load_captioner_testkit()
    data = tmp_path / "data"
    cache, train, _ = kit.tiny_data(data)
    init = kit.tiny_checkpoint(data, dropout=0.1)
    items = list({image_id: [caption] for image_id, caption in train}.items())

    def run(out: Path, stop_at: int = 0) -> list[float]:
        calls = [0]

        def reward(ids, captions, refs):
            calls[0] += 1
            if calls[0] == stop_at:
                raise _Interrupt
            return kit.overlap_reward(ids, captions, refs)

        config = SCSTConfig(output_dir=str(out), reward="overlap", lr=1e-3, batch_size=8, micro_batch_size=4,
                            epochs=4, max_steps=5, samples="multinomial", k=3, save_every=3, keep_checkpoints=5,
                            trackers=[])
        return train_scst(config, init, cache, items, reward).losses

    full = run(tmp_path / "full")
    with pytest.raises(_Interrupt):
        run(tmp_path / "killed", stop_at=9)  # 2 reward calls per step: call 9 is in step 5, after the step-3 save
    resumed = run(tmp_path / "killed")
    assert len(full) == 5 and len(set(full)) > 1
    assert resumed == full[3:]  # exact float equality: dropout and multinomial sampling on


def test_8_a_full_disk_in_compare_rewards_is_one_line(tmp_path, monkeypatch, capsys):
    """recipes/compare_rewards.py has the same safety net as pacs train: a `SafetensorError` carrying an OS error
    raised anywhere in its runs is one line naming the folder, exit 2 (was: a raw traceback)."""
    import runpy

    from safetensors import SafetensorError

    import pacs.captioner.orchestration.pipeline
    import pacs.captioner.orchestration.seed_runs
    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28) at path "
                              f'"{tmp_path / "run" / ".tmpAb12Cd"}"')

    monkeypatch.setattr(pacs.captioner.orchestration.pipeline, "run_pipeline", full_disk)
    monkeypatch.setattr(pacs.captioner.orchestration.seed_runs, "run_seeds", full_disk)
    script = Path(__file__).resolve().parents[2] / "recipes" / "compare_rewards.py"
    compare = runpy.run_path(str(script), run_name="compare_rewards")
    assert compare["main"](["--config", "flickr8k_tiny", "--reward", "cider", f"run_dir={tmp_path / 'run'}"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("compare_rewards")]
    assert err == [(f"compare_rewards: error: {tmp_path / 'run'}: No space left on device; free some disk space "
                   "(or write to another disk) and run again; finished work is kept and an interrupted stage "
                   "resumes or restarts")], err
