"""`make_tiny_captioner` (issue 42 item 7): a tiny transformers captioner folder built offline, that `pacs caption`
loads and runs; a bad kind or an existing folder is one line and nothing written."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from pacs import cli as pacs_cli
from pacs.captioner.modeling.hf_captioning import TRANSFORMERS, checkpoint_kind
from pacs.captioner.modeling.tiny_captioner import TINY_WORDS, make_tiny_captioner
from pacs.metric.common.errors import InputError


@pytest.mark.parametrize("kind", ["git", "blip"])
def test_pacs_caption_runs_the_tiny_folder(tmp_path, kind, monkeypatch):
    """The folder is a transformers captioner; `pacs caption` writes one caption per image from its vocabulary."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = make_tiny_captioner(tmp_path / f"tiny-{kind}", kind=kind, seed=1)
    assert checkpoint_kind(folder) == TRANSFORMERS
    assert [p.name for p in tmp_path.iterdir()] == [f"tiny-{kind}"]  # no scratch folder left behind
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(images / f"{name}.png")
    out = tmp_path / "captions.json"
    code = pacs_cli.main(["caption", "--checkpoint", str(folder), "--images", str(images), "--out", str(out),
                          "--beam-size", "1", "--max-new-tokens", "5", "--device", "cpu"])
    assert code == 0
    rows = json.loads(out.read_text())
    assert sorted(row["image_id"] for row in rows) == ["a", "b"]
    for row in rows:
        assert set(row["caption"].split()) <= set(TINY_WORDS)


def test_refusals_write_nothing(tmp_path):
    """An unknown kind and an existing folder are refused before anything is written."""
    with pytest.raises(InputError, match="tiny captioner kind 'vit': choose one of git, blip"):
        make_tiny_captioner(tmp_path / "x", kind="vit")
    assert not (tmp_path / "x").exists()
    (tmp_path / "taken").mkdir()
    with pytest.raises(InputError, match="exists"):
        make_tiny_captioner(tmp_path / "taken")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
