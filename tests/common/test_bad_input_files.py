"""Bad input files are one clear error, never a raw traceback (issue 21: nothing lost).

Deeply nested JSON (a `RecursionError` inside `json`), a caption holding a lone surrogate (a
`UnicodeEncodeError` when written or tokenized) and a torch pickle that `torch.load(weights_only=True)` refuses
(a `pickle.UnpicklingError`) are each one `InputError` naming the file and the item; the CLI prints it as one
line, exits 2 and writes nothing.
"""
from __future__ import annotations

import collections
import json
import os
import pickle
import re
from pathlib import Path

import pytest
from cli_errors import one_error_line
from PIL import Image

from pacs import cli as pacs_cli
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import check_text, first_invalid_text, lone_surrogate, read_json_file

NESTED = "[" * 100_000 + "]" * 100_000
TOO_DEEP = "is JSON nested too deeply to read"


class SneakyDict(collections.OrderedDict):
    """A container class of its own: torch's weights-only unpickler refuses it."""


@pytest.fixture
def images(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(folder / "a.png")
    return folder


def _score(tmp_path: Path, images: Path, candidates: str, *extra: str, metric: str = "clip-s") -> tuple[int, Path]:
    cands = tmp_path / "cands.json"
    cands.write_text(candidates, encoding="utf-8")
    out = tmp_path / "out.json"
    code = pacs_cli.main(["score", "--metric", metric, "--backbone", "tiny-random", "--images", str(images),
                          "--candidates", str(cands), "--out", str(out), *extra])
    return code, out


# --- the helper -----------------------------------------------------------------------------------------------

def test_read_json_file_turns_every_bad_file_into_one_input_error(tmp_path):
    path = tmp_path / "x.json"
    cases = {NESTED: TOO_DEEP, '{"a": [1,\n 2,,]}': "line 2 column 4: invalid JSON", "1" * 5000: "invalid JSON",
             '{"ok": "\\ud83d\\ude00", "bad": ["x", "ab\\ud800"]}': "bad[1] is not valid Unicode text (lone "
                                                                      "surrogate at position 2)",
             '{"\\udfff": 1}': "a key of the top-level object is not valid Unicode text"}
    for text, message in cases.items():
        path.write_text(text, encoding="utf-8")
        with pytest.raises(InputError, match=re.escape(message)) as error:
            read_json_file(path, "test")
        assert str(error.value).startswith(f"{path}: ")
        str(error.value).encode("utf-8")  # the message itself is printable
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(InputError, match="not UTF-8 text"):
        read_json_file(path, "test")
    with pytest.raises(InputError, match="test file not found"):
        read_json_file(tmp_path / "missing.json", "test")
    path.write_text('["ab\\ud800"]')
    assert read_json_file(path, "test", check_strings=False) == ["ab\ud800"]
    assert read_json_file(_write(path, '{"smile": "\\ud83d\\ude00"}'), "test") == {"smile": "\U0001F600"}
    assert lone_surrogate("ab\udc80") == 2 and lone_surrogate("fine") is None
    assert first_invalid_text({"images": [{"raw": "ok"}, {"raw": "x\ud800"}]}) == ("images[1].raw", 1)
    with pytest.raises(InputError, match=r"^caption for image 'a' is not valid Unicode text \(lone surrogate at "
                                         r"position 1\)$"):
        check_text("x\ud800", "caption for image 'a'")


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- deeply nested JSON -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["candidates", "references", "image-map"])
def test_score_nested_json_is_one_line(tmp_path, images, capsys, which):
    nested = _write(tmp_path / f"{which}.json", NESTED)
    candidates = json.dumps({"a": "a red square"})
    extra = {"candidates": [], "references": ["--references", str(nested)],
             "image-map": ["--image-map", str(nested)]}[which]
    if which == "candidates":
        candidates = NESTED
    code, out = _score(tmp_path, images, candidates, *extra, metric="ref-clip-s" if which == "references" else "clip-s")
    line = one_error_line(capsys, "score")
    expected = tmp_path / "cands.json" if which == "candidates" else nested
    assert code == 2 and not out.exists() and f"{expected}: " in line and TOO_DEEP in line, line


def test_dataset_annotation_and_benchmark_nested_json(tmp_path, capsys):
    from pacs.captioner.data.datasets import load_dataset

    nested = _write(tmp_path / "dataset_coco.json", NESTED)
    for name in ("coco-karpathy", "nocaps", "vizwiz"):
        with pytest.raises(InputError, match=TOO_DEEP) as error:
            load_dataset(name, nested, image_root=tmp_path)
        assert str(nested) in str(error.value)
    for benchmark in ("composite", "nocaps-foil", "robustness"):
        assert pacs_cli.main(["correlate", benchmark, "--data", str(nested), "--metrics", "length"]) == 2
        line = one_error_line(capsys, "correlate")
        assert f"{nested}: " in line and TOO_DEEP in line, line


def test_report_nested_gallery_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "gallery.json", NESTED)
    assert pacs_cli.main(["report", str(run)]) == 2
    line = one_error_line(capsys, "report")
    assert f"{run / 'gallery.json'}: " in line and TOO_DEEP in line
    assert not (run / "report.html").exists()


# --- lone surrogates -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("candidates, expected", [
    ('{"a": "a red\\ud800 square"}', "caption for image 'a' is not valid Unicode text (lone surrogate at position 5)"),
    ('[{"image_id": "a", "caption": "ok"}, {"image_id": "a", "caption": "\\udc00"}]',
     "caption #1 for image 'a' is not valid Unicode text (lone surrogate at position 0)"),
    ('{"a\\ud800": "a caption"}', "image id 'a\\ud800' is not valid Unicode text (lone surrogate at position 1)"),
])
def test_score_refuses_a_lone_surrogate_caption(tmp_path, images, capsys, candidates, expected):
    code, out = _score(tmp_path, images, candidates)
    line = one_error_line(capsys, "score")
    assert code == 2 and not out.exists()
    assert line == f"pacs score: error: {tmp_path / 'cands.json'}: {expected}", line


def test_references_and_evaluate_refuse_a_lone_surrogate(tmp_path, images, capsys):
    refs = _write(tmp_path / "refs.json", '{"a": ["fine", "bro\\ud800ken"]}')
    code, out = _score(tmp_path, images, '{"a": "a red square"}', "--references", str(refs), metric="ref-clip-s")
    assert code == 2 and not out.exists()
    assert one_error_line(capsys, "score").endswith(
        f"{refs}: reference #1 for image 'a' is not valid Unicode text (lone surrogate at position 3)")
    coco = _write(tmp_path / "coco.json", '{"annotations": [{"image_id": 7, "caption": "\\ud800"}]}')
    cands = _write(tmp_path / "c.json", '{"7": "a caption"}')
    out = tmp_path / "eval.json"
    assert pacs_cli.main(["evaluate", "--candidates", str(cands), "--references", str(coco), "--metrics", "length",
                          "--out", str(out)]) == 2
    assert "annotations[0] (reference for image 7) is not valid Unicode text" in one_error_line(capsys, "evaluate")
    assert not out.exists()


def test_dataset_and_gallery_refuse_a_lone_surrogate(tmp_path, capsys):
    from pacs.captioner.data.datasets import load_dataset

    path = _write(tmp_path / "dataset_coco.json", json.dumps(
        {"images": [{"filename": "a.jpg", "cocoid": 1, "split": "test", "sentences": [{"raw": "a \ud800 b"}]}]}))
    with pytest.raises(InputError, match=r"dataset_coco\.json: images\[0\]\.sentences\[0\]\.raw is not valid "
                                         r"Unicode text \(lone surrogate at position 2\)"):
        load_dataset("coco-karpathy", path, image_root=tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "gallery.json", json.dumps([{"image_id": "x", "captions": {"xe": {"caption": "\udfff"}}}]))
    assert pacs_cli.main(["report", str(run)]) == 2
    line = one_error_line(capsys, "report")
    assert line.endswith("gallery.json: [0].captions.xe.caption is not valid Unicode text (lone surrogate at "
                         "position 0)"), line
    assert not (run / "report.html").exists()


# --- torch pickles that are not weights-only -------------------------------------------------------------------

def _unsafe_pickles(folder: Path) -> list[Path]:
    """Two pickles torch's weights-only loader refuses: an `os.system` reference and a class of its own
    (`pickle.dumps` records references; nothing is executed building them)."""
    system = folder / "system.pt"
    system.write_bytes(pickle.dumps({"state_dict": {"visual.proj": os.system}}))
    own_class = folder / "own_class.pt"
    own_class.write_bytes(pickle.dumps({"state_dict": SneakyDict(weight=[1.0, 2.0])}))
    return [system, own_class]


def _assert_refused(line: str, path: Path) -> None:
    assert f"{path}: not a weights-only checkpoint" in line and "pacs never unpickles arbitrary objects" in line, line


def test_checkpoint_pickle_refused_by_weights_only_is_one_line(tmp_path, images, capsys):
    for checkpoint in _unsafe_pickles(tmp_path):
        cands = _write(tmp_path / "c.json", '{"a": "a red square"}')
        out = tmp_path / "out.json"
        assert pacs_cli.main(["score", "--metric", "clip-s", "--checkpoint", str(checkpoint), "--images", str(images),
                              "--candidates", str(cands), "--out", str(out)]) == 2
        _assert_refused(one_error_line(capsys, "score"), checkpoint)
        assert not out.exists()


def test_backbone_file_refused_by_weights_only_is_one_line(tmp_path, images, capsys):
    weights = _unsafe_pickles(tmp_path)[0]
    cands = _write(tmp_path / "c.json", '{"a": "a red square"}')
    assert pacs_cli.main(["score", "--metric", "clip-s", "--backbone", f"ViT-S-32/{weights}", "--images", str(images),
                          "--candidates", str(cands)]) == 2
    _assert_refused(one_error_line(capsys, "score"), weights)


def test_adapter_folder_with_a_refused_pickle_is_one_line(tmp_path, images, capsys):
    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    from pacs.metric.models.factory import load_backbone
    from pacs.metric.models.lora import attach_lora, save_adapter

    folder = save_adapter(attach_lora(build_backbone_from_config(tiny_clip_config(), seed=0)), tmp_path / "adapter")
    (folder / "adapter_model.safetensors").unlink()
    weights = folder / "adapter_model.bin"
    weights.write_bytes(pickle.dumps({"base_model.model.visual.proj.lora_A.weight": os.system}))
    with pytest.raises(InputError) as error:
        load_backbone(checkpoint=str(folder))
    _assert_refused(str(error.value), weights)
    cands = _write(tmp_path / "c.json", '{"a": "a red square"}')
    assert pacs_cli.main(["score", "--metric", "pac-s++", "--checkpoint", str(folder), "--images", str(images),
                          "--candidates", str(cands)]) == 2
    _assert_refused(one_error_line(capsys, "score"), weights)


def test_a_repeated_key_in_the_metric_training_and_video_inputs_is_one_line(tmp_path):
    """The IDF table, the architecture file, the positives dataset and manifest lines read through the one JSON
    reader (or its duplicate-key hook): a repeated key is an InputError naming the file, not a silent drop."""
    from pacs.metric.training.data import read_manifest
    from pacs.metric.video.idf import IdfTable

    idf = tmp_path / "idf.json"
    idf.write_text('{"format": "x", "format": "y"}')
    with pytest.raises(InputError, match=f"{idf}.*the key \"format\" appears twice"):
        IdfTable.load(idf)
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text('{"image": "a.jpg", "image": "b.jpg", "caption": "c"}\n')
    with pytest.raises(InputError, match=f"{manifest} line 1: invalid JSON: duplicate key 'image'"):
        read_manifest(manifest)
