"""One `build_scorer(metric, options)` over `ModelOptions` behind every entry point (issue 40 item 4)."""
from __future__ import annotations

import pytest
from PIL import Image

from pacs.metric import score
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.scoring import api, model_options
from pacs.metric.scoring.model_options import LIBRARY_DEFAULTS, ModelOptions, build_scorer, library_options
from pacs.metric.scoring.scorer import Scorer

# typed out by hand: the fields of ModelOptions, in their order (a new option must be added here on purpose)
OPTION_NAMES = ("checkpoint, backbone, arch, family, allow_family_mismatch, w, device, batch_size, cache_dir, "
                "lora_mode, dtype, score, long_captions, workers, decode")
IMAGES = [Image.new("RGB", (64, 64), "red"), Image.new("RGB", (64, 64), "blue")]
CAPTIONS = ["a red square", "a blue square"]


@pytest.fixture(scope="module")
def tiny():
    return build_backbone_from_config(tiny_clip_config(), seed=0, family="pac-s++")


def test_there_is_one_build_scorer():
    tm_metrics = pytest.importorskip("pacs.metric.scoring.tm_metrics")
    assert api.build_scorer is model_options.build_scorer is tm_metrics.build_scorer


def test_an_unknown_keyword_names_itself_and_every_model_option(tiny):
    with pytest.raises(TypeError) as error:
        score(IMAGES, CAPTIONS, metric="pac-s++", backbone=tiny, bogus=1)
    assert str(error.value) == f"score() got an unexpected keyword argument 'bogus' (model options: {OPTION_NAMES})"


def test_where_the_defaults_live():
    # the command line's and the tables' defaults are ModelOptions' own; the library's differ only in the device
    assert ModelOptions().device == "auto" and LIBRARY_DEFAULTS == {"device": "cpu"}
    options, model = library_options("f", {"w": 2.0})
    assert model is None
    assert options == ModelOptions(device="cpu", w=2.0)


def test_a_loaded_backbone_or_scorer_comes_back_apart(tiny):
    options, model = library_options("f", {"backbone": tiny})
    assert model is tiny and options.backbone is None
    scorer = Scorer(tiny)
    assert build_scorer("pac-s++", options, scorer) is scorer  # returned as it is, caches kept


def test_every_model_option_reaches_the_scorer_through_score_and_the_torchmetrics_classes(tiny):
    tm_metrics = pytest.importorskip("pacs.metric.scoring.tm_metrics")
    metric = tm_metrics.PACScorePlusPlus(backbone=tiny, workers=1, decode="cpu", batch_size=1, w=3.0,
                                         return_per_sample=True, sync_on_compute=False)
    assert (metric.scorer.workers, metric.scorer.batch_size, metric.w, metric.scorer.progress) == (1, 1, 3.0, False)
    metric.update(IMAGES, CAPTIONS)
    direct = score(IMAGES, CAPTIONS, metric="pac-s++", backbone=tiny, workers=1, batch_size=1, w=3.0)
    assert metric.compute()["per_sample"].tolist() == direct.scores.tolist()


def test_a_bad_batch_size_is_refused_before_any_model_loads(tmp_path):
    missing = str(tmp_path / "no-such-checkpoint.pth")  # loading it would be another error
    with pytest.raises(Exception, match=r"^batch_size must be >= 1, got 0$"):
        build_scorer("pac-s", ModelOptions(checkpoint=missing, batch_size=0))
