"""`pacs score`: the I/O contract of DESIGN.md and every bad input (clear message, exit != 0, no output file)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from pacs.cli import main
from pacs.metric.common.provenance import sha256_file
from pacs.metric.models.backbones import save_backbone
from pacs.metric.scoring.scorer import Scorer


@pytest.fixture(scope="module")
def tiny_checkpoint(aligned_backbone, tmp_path_factory) -> Path:
    """The tiny backbone saved in pacs' own format."""
    return save_backbone(aligned_backbone, tmp_path_factory.mktemp("ckpt") / "tiny.safetensors")


def _write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _score(tmp_path, checkpoint, *extra: str, metric: str = "clip-s", out: bool = True) -> tuple[int, Path]:
    out_path = tmp_path / "out.json"
    args = ["score", "--metric", metric, "--checkpoint", str(checkpoint), *extra]
    if out:
        args += ["--out", str(out_path)]
    return main(args), out_path


def test_both_formats_lookup_rules_and_output(aligned_backbone, tiny_checkpoint, image_dir, tmp_path, capsys, caplog):
    # DIR/<id> (id with extension), DIR/<id>.png / .jpg (id without), an image appearing twice, an empty caption.
    candidates = [{"image_id": "img0.png", "caption": "a dog"}, {"image_id": "img1", "caption": ""},
                  {"image_id": "img0.png", "caption": "a cat on a mat"}, {"image_id": "img2", "caption": "x"}]
    refs_coco = {"annotations": [{"image_id": "img0.png", "caption": "a dog"},
                                 {"image_id": "img0.png", "caption": "an animal"},
                                 {"image_id": "img1", "caption": "noise"}, {"image_id": "img2", "caption": "static"}]}
    refs_dict = {"img0.png": ["a dog", "an animal"], "img1": ["noise"], "img2": ["static"]}
    cand_file = _write(tmp_path / "cands.json", candidates)
    with caplog.at_level(logging.WARNING):
        code, out = _score(tmp_path, tiny_checkpoint, "--metric", "REF-CLIP-S", "--images", str(image_dir),
                           "--candidates", str(cand_file), "--references",
                           str(_write(tmp_path / "coco.json", refs_coco)), "--w", "2.0")
    assert code == 0
    summary = capsys.readouterr().out.strip().splitlines()
    assert len(summary) == 1 and "ref-clip-s" in summary[0] and "1 empty" in summary[0]
    assert any("1 empty caption" in record.getMessage() for record in caplog.records)
    result = json.loads(out.read_text())
    assert {"metric", "w", "backbone", "mean", "per_instance", "provenance"} <= set(result)
    assert result["metric"] == "ref-clip-s" and result["w"] == 2.0 and result["n_empty"] == 1
    assert [(r["image_id"], r["caption"]) for r in result["per_instance"]] == [
        (c["image_id"], c["caption"]) for c in candidates]
    provenance = result["provenance"]
    assert provenance["w"] == 2.0 and provenance["seed"] == 0 and provenance["model_fingerprint"] == \
        aligned_backbone.fingerprint and provenance["pacs_version"]
    assert provenance["checkpoint_sha256"] == sha256_file(tiny_checkpoint)
    # Same numbers as the Scorer on the same files, and the dict reference format gives the same result.
    paths = [str(image_dir / "img0.png"), str(image_dir / "img1.jpg"), str(image_dir / "img0.png"),
             str(image_dir / "img2.png")]
    direct = Scorer(aligned_backbone, w=2.0).score(paths, [c["caption"] for c in candidates],
                                                [refs_dict[c["image_id"]] for c in candidates])
    assert np.abs(np.array([r["score"] for r in result["per_instance"]]) - direct.scores).max() <= 1e-6
    assert np.isclose(result["mean"], direct.scores.mean(), atol=1e-6)
    code, out2 = _score(tmp_path, tiny_checkpoint, "--images", str(image_dir), "--metric", "ref-clip-s",
                        "--candidates", str(cand_file), "--references",
                        str(_write(tmp_path / "dict.json", refs_dict)), "--w", "2.0")
    assert code == 0 and json.loads(out2.read_text())["per_instance"] == result["per_instance"]


def test_dict_candidates_and_image_map_override(tiny_checkpoint, image_dir, tmp_path):
    cand = _write(tmp_path / "c.json", {"42": "a photo", "img3": "another"})
    mapping = _write(tmp_path / "map.json", {"42": str(image_dir / "img4.png"), "img3": str(image_dir / "img5.jpg")})
    code, out = _score(tmp_path, tiny_checkpoint, "--images", str(image_dir), "--image-map", str(mapping),
                       "--candidates", str(cand))
    assert code == 0
    rows = json.loads(out.read_text())["per_instance"]
    assert [r["image_id"] for r in rows] == ["42", "img3"]
    # img3 is mapped to img5.jpg: the score differs from scoring img3.jpg itself.
    code, plain = _score(tmp_path, tiny_checkpoint, "--images", str(image_dir),
                         "--candidates", str(_write(tmp_path / "c2.json", {"img3": "another"})))
    assert json.loads(plain.read_text())["per_instance"][0]["score"] != rows[1]["score"]


BAD_INPUTS = {
    # name: (candidates, references, metric, expected message fragment)
    "missing image": ({"img0": "ok", "nope42": "a dog"}, None, "clip-s", "'nope42'"),
    "non-string candidate (dict)": ({"img0": ["a", "list"]}, None, "clip-s", "image id 'img0' is not a string"),
    "non-string candidate (list)": ([{"image_id": "img0", "caption": 7}], None, "clip-s", "candidate #0"),
    "missing reference": ({"img0": "a", "img1": "b"}, {"img0": ["r"]}, "ref-clip-s", "'img1'"),
    "malformed candidates JSON": ('{"img0": "a",', None, "clip-s", "malformed JSON"),
    "malformed references JSON": ({"img0": "a"}, "[1, 2", "ref-clip-s", "malformed JSON"),
    "unknown metric": ({"img0": "a"}, None, "pac-z", "unknown metric 'pac-z'"),
    "non-string reference": ({"img0": "a"}, {"img0": ["ok", 3]}, "ref-clip-s", "image id 'img0' is not a string"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_inputs_fail_cleanly(case, tiny_checkpoint, image_dir, tmp_path, capsys):
    candidates, references, metric, fragment = BAD_INPUTS[case]
    extra = ["--images", str(image_dir), "--candidates", str(_write(tmp_path / "cands.json", candidates))]
    if references is not None:
        extra += ["--references", str(_write(tmp_path / "refs.json", references))]
    code, out = _score(tmp_path, tiny_checkpoint, *extra, metric=metric)
    error = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert not out.exists() and not list(tmp_path.glob(".out.json*"))
    assert len(error) == 1 and fragment in error[0], error


def test_corrupt_image_names_the_file(tiny_checkpoint, image_dir, tmp_path, capsys):
    images = tmp_path / "imgs"
    images.mkdir()
    (images / "good.png").write_bytes((image_dir / "img0.png").read_bytes())
    (images / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated jpeg")
    cands = _write(tmp_path / "c.json", {"good": "fine", "bad": "broken"})
    code, out = _score(tmp_path, tiny_checkpoint, "--images", str(images), "--candidates", str(cands))
    error = capsys.readouterr().err
    assert code != 0 and not out.exists()
    assert "bad.jpg" in error and "'bad'" in error and "cannot read image" in error


def test_checkpoint_with_unknown_layout(tmp_path, image_dir, capsys):
    checkpoint = tmp_path / "weird.pt"
    torch.save({"state_dict": {"encoder.layers.0.weight": torch.zeros(2, 2)}}, checkpoint)
    cands = _write(tmp_path / "c.json", {"img0": "a"})
    code, out = _score(tmp_path, checkpoint, "--images", str(image_dir), "--candidates", str(cands))
    error = capsys.readouterr().err
    assert code != 0 and not out.exists()
    assert "no known layout" in error and "encoder.layers.0.weight" in error and "weird.pt" in error


def test_pac_s_without_checkpoint_is_a_clear_error(image_dir, tmp_path, capsys):
    cands = _write(tmp_path / "c.json", {"img0": "a"})
    code = main(["score", "--metric", "pac-s", "--images", str(image_dir), "--candidates", str(cands),
                 "--out", str(tmp_path / "o.json")])
    assert code != 0 and "pass --checkpoint" in capsys.readouterr().err and not (tmp_path / "o.json").exists()


def test_uncached_pretrained_tag_via_cli_is_one_line(image_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    cands = _write(tmp_path / "c.json", {"img0": "a"})
    code = main(["score", "--metric", "clip-s", "--backbone", "ViT-B-32/openai", "--images", str(image_dir),
                 "--candidates", str(cands), "--out", str(tmp_path / "o.json")])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not (tmp_path / "o.json").exists()
    assert len(error) == 1 and "open_clip_pytorch_model.bin" in error[0] and "--backbone ViT-B-32/" in error[0]
