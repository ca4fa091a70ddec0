"""The command `pacs export --format official` prints to score its output works as printed (issue 21, item 10.4).

A model the official code builds differently (`--allow-nonstandard-arch`) cannot be rebuilt from an `--arch`
preset: the export writes its architecture next to the file (`<name>.arch.json`) and the hint names it.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
from PIL import Image

from pacs.cli import main
from pacs.metric.models.backbones import build_backbone_from_config, save_backbone, tiny_clip_config
from pacs.metric.models.factory import load_backbone

HINT = "score it with: pacs score --metric pac-s++ "


def _score_inputs(folder: Path) -> list[str]:
    images = folder / "images"
    images.mkdir()
    Image.new("RGB", (48, 40), "red").save(images / "red.png")
    candidates = folder / "candidates.json"
    candidates.write_text(json.dumps([{"image_id": "red", "caption": "a red square"}]))
    return ["--images", str(images), "--candidates", str(candidates)]


def test_the_hint_of_a_nonstandard_official_export_loads_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = build_backbone_from_config(tiny_clip_config(), seed=0, name="tiny", family="pac-s++")  # 2 heads of 32
    save_backbone(model, tmp_path / "trained.safetensors")
    out = tmp_path / "exported" / "tiny.pth"
    assert main(["export", "--checkpoint", str(tmp_path / "trained.safetensors"), "--format", "official",
                 "--out", str(out), "--allow-nonstandard-arch"]) == 0
    printed = capsys.readouterr().out
    hint = shlex.split(printed.split(HINT, 1)[1].strip())
    assert hint == ["--checkpoint", str(out), "--arch", str(tmp_path / "exported" / "tiny.arch.json")]
    arch = json.loads(Path(hint[3]).read_text())
    assert arch["model_cfg"]["vision_cfg"]["head_width"] == 32 and arch["model_cfg"]["text_cfg"]["heads"] == 2

    inputs = _score_inputs(tmp_path)
    assert main(["score", "--metric", "pac-s++", *hint, *inputs, "--out", str(tmp_path / "scores.json")]) == 0
    assert main(["score", "--metric", "pac-s++", "--checkpoint", str(out), "--arch", "openai", *inputs]) == 2
    assert "heads = width // 64 is 0" in capsys.readouterr().err  # what the old hint (--arch openai) led to

    reloaded = load_backbone(checkpoint=hint[1], arch=hint[3])
    pixels = torch.stack([model.preprocess(Image.new("RGB", (48, 40), "red"))])
    tokens = model.tokenize(["a red square", "two dogs"])
    with torch.no_grad():
        assert torch.allclose(reloaded.model.encode_image(pixels), model.model.encode_image(pixels), atol=1e-6)
        assert torch.allclose(reloaded.model.encode_text(tokens), model.model.encode_text(tokens), atol=1e-6)

    # an existing architecture file is not replaced without --overwrite
    assert main(["export", "--checkpoint", str(tmp_path / "trained.safetensors"), "--format", "official",
                 "--out", str(tmp_path / "exported" / "tiny2.pth"), "--allow-nonstandard-arch"]) == 0
    (tmp_path / "exported" / "tiny2.pth").unlink()
    assert main(["export", "--checkpoint", str(tmp_path / "trained.safetensors"), "--format", "official",
                 "--out", str(tmp_path / "exported" / "tiny2.pth"), "--allow-nonstandard-arch"]) == 2
    assert "tiny2.arch.json exists" in capsys.readouterr().err
    assert not (tmp_path / "exported" / "tiny2.pth").exists()
