"""Non-finite weights are never scored: the Scorer and `pacs score` refuse them, naming the item and the model."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from pacs.cli import main
from pacs.metric.common.errors import InputError, NonFiniteError
from pacs.metric.models.backbones import Backbone, save_backbone
from pacs.metric.models.factory import load_backbone
from pacs.metric.scoring.scorer import Scorer


def _broken(backbone: Backbone, tower: str) -> Backbone:
    """A copy of `backbone` whose image (`visual`) or text tower has one NaN weight."""
    broken = copy.deepcopy(backbone)
    with torch.no_grad():
        if tower == "visual":
            broken.model.visual.proj[0, 0] = float("nan")
        else:
            broken.model.text_projection[0, 0] = float("nan")
    return broken


@pytest.fixture(scope="module")
def nan_checkpoint(tiny_backbone, tmp_path_factory) -> Path:
    """The tiny backbone with a NaN in its image projection, saved in pacs' format."""
    return save_backbone(_broken(tiny_backbone, "visual"), tmp_path_factory.mktemp("nan") / "nan.safetensors")


def test_scorer_refuses_nan_image_embeddings_naming_the_first_image_and_the_checkpoint(nan_checkpoint, image_dir):
    scorer = Scorer(load_backbone(checkpoint=str(nan_checkpoint)), progress=False)
    images = [str(image_dir / "img0.png"), str(image_dir / "img1.jpg")]
    with pytest.raises(NonFiniteError) as caught:
        scorer.score(images, ["a dog", "a cat"], names=["first", "second"])
    assert str(caught.value) == (f"image 'first': its embedding is not finite (NaN/inf): the weights of checkpoint "
                                 f"{nan_checkpoint} are not finite (a diverged training?); nothing was scored")
    assert isinstance(caught.value, InputError)
    assert scorer._image_cache == {}  # nothing non-finite was cached


def test_scorer_refuses_nan_text_embeddings_naming_the_caption(tiny_backbone, image_dir):
    scorer = Scorer(_broken(tiny_backbone, "text"), progress=False)
    with pytest.raises(NonFiniteError, match=r"^caption 'a dog': its embedding is not finite \(NaN/inf\): the weights "
                                             r"of model tiny-test are not finite"):
        scorer.score([str(image_dir / "img0.png")], ["a dog"])
    with pytest.raises(NonFiniteError, match=r"^caption 'a dog': its embedding"):
        scorer.embed_texts(["a dog"])


def test_precomputed_non_finite_image_embeddings_and_scores_are_refused(tiny_backbone):
    scorer = Scorer(tiny_backbone, progress=False)
    embeddings = torch.ones(2, tiny_backbone.model.text_projection.shape[1])
    embeddings[1, 3] = float("inf")
    with pytest.raises(NonFiniteError, match=r"^the image of candidate #1 'b': its embedding is not finite"):
        scorer.score_embeddings(embeddings, ["a", "b"])
    with pytest.raises(NonFiniteError, match=r"^candidate #0 'a': its score is (nan|inf) \(w=inf"):
        scorer.score_embeddings(torch.ones(1, embeddings.shape[1]), ["a"], w=float("inf"))


def _inputs(tmp_path: Path) -> Path:
    candidates = tmp_path / "cands.json"
    candidates.write_text(json.dumps({"img0.png": "a dog", "img1": "a cat"}), encoding="utf-8")
    return candidates


def test_pacs_score_exits_2_with_one_line_and_no_output_file(nan_checkpoint, image_dir, tmp_path, capsys):
    out = tmp_path / "out.json"
    code = main(["score", "--metric", "clip-s", "--checkpoint", str(nan_checkpoint), "--images", str(image_dir),
                 "--candidates", str(_inputs(tmp_path)), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2
    expected = (f"pacs score: error: image 'img0.png': its embedding is not finite (NaN/inf): the weights of "
                f"checkpoint {nan_checkpoint} are not finite (a diverged training?); nothing was scored")
    assert captured.err.splitlines() == [expected]
    assert captured.out == ""
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["cands.json"]


def test_pacs_score_still_writes_finite_scores(tiny_backbone, image_dir, tmp_path, capsys):
    checkpoint = save_backbone(tiny_backbone, tmp_path / "ok.safetensors")
    out = tmp_path / "out.json"
    code = main(["score", "--metric", "clip-s", "--checkpoint", str(checkpoint), "--images", str(image_dir),
                 "--candidates", str(_inputs(tmp_path)), "--out", str(out)])
    assert code == 0 and capsys.readouterr().err == ""
    result = json.loads(out.read_text(encoding="utf-8"))
    assert [row["image_id"] for row in result["per_instance"]] == ["img0.png", "img1"]
