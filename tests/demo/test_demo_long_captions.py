"""Long multi-sentence candidates of the demo's correlation stage: judged exactly, truncated by the tiny CLIP's
context, and scored whole by `--long-captions chunk`."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pacs.captioner.demo.candidates import LONG_KINDS, late_error_paragraph, long_candidates_for, paragraph
from pacs.captioner.demo.judge import judge_caption, parse_caption
from pacs.captioner.demo.world import SHAPE_WORDS, DemoWorld, WorldConfig
from pacs.captioner.orchestration.judge_correlation import CONTRASTIVE, chunking_scorers, long_caption_summary

WORLD = DemoWorld(WorldConfig(image_size=48))
ITEMS = [WORLD.item("val", i) for i in range(60)]


def test_a_paragraph_is_judged_fully_correct_and_names_every_object_once():
    rng = np.random.default_rng(0)
    for item in ITEMS:
        text = paragraph(item, rng)
        judgement = judge_caption(text, item.scene)
        assert judgement.verdict == "correct" and judgement.score == 1.0, text
        mentions = parse_caption(text)[0]
        assert sorted(m.shape for m in mentions) == sorted(o.shape for o in item.scene.objects)
        assert text.count(" . ") >= 2  # several sentences


def test_a_late_error_paragraph_names_one_absent_shape_in_its_last_sentence_only():
    rng = np.random.default_rng(1)
    seen = 0
    for item in ITEMS:
        text = late_error_paragraph(item, rng)
        present = {o.shape for o in item.scene.objects}
        if len(present) == len(SHAPE_WORDS):
            assert text is None
            continue
        seen += 1
        head, _, last = text.rstrip(" .").rpartition(" . ")
        assert judge_caption(head + " .", item.scene).verdict == "correct"  # the error is only at the end
        judgement = judge_caption(text, item.scene)
        assert judgement.hallucinated == 1 and judgement.verdict == "wrong"
        absent = [m.shape for m in parse_caption(last)[0]]
        assert len(absent) == 1 and absent[0] not in present
    assert seen > 40


def test_long_candidates_have_both_kinds():
    rng = np.random.default_rng(2)
    kinds = {kind for item in ITEMS for kind, _ in long_candidates_for(item, rng)}
    assert kinds == set(LONG_KINDS)


@pytest.fixture(scope="module")
def tiny_scorers():
    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    from pacs.metric.scoring.scorer import Scorer

    backbone = build_backbone_from_config(tiny_clip_config(text_cfg={"context_length": 32}), seed=3)
    return {"clip": Scorer(backbone, progress=False), "pac-s++": Scorer(backbone, w=2.0, progress=False)}


def test_chunking_scorers_read_every_sentence_of_a_long_caption_and_equal_plain_scoring_on_short_ones(
        tiny_scorers, tmp_path):
    rng = np.random.default_rng(3)
    item = next(i for i in ITEMS if len(i.scene.objects) == 3)
    image = tmp_path / "a.png"
    WORLD.render(item).save(image)
    short, long = item.references[0], late_error_paragraph(item, rng)
    chunked = chunking_scorers(tiny_scorers)
    assert chunked["pac-s++"].w == 2.0 and chunked["clip"].prompt == tiny_scorers["clip"].prompt
    plain = tiny_scorers["clip"].score([str(image)] * 2, [short, long])
    whole = chunked["clip"].score([str(image)] * 2, [short, long])
    assert plain.truncated == [False, True]
    assert whole.scores[0] == pytest.approx(plain.scores[0], abs=1e-6)  # one piece: the plain score (other batches)
    assert abs(whole.scores[1] - plain.scores[1]) > 1e-6  # the end of the long caption now counts


def test_long_caption_summary_is_kendall_on_the_long_rows_alone():
    rng = np.random.default_rng(4)
    n = 40
    judge = rng.random(n)
    long_rows = np.arange(n) % 3 == 0
    metrics = {}
    for name in CONTRASTIVE:
        metrics[name] = rng.random(n)
        metrics[f"{name} chunk"] = judge + 0.1 * rng.random(n)
    truncated = {"clip": list(long_rows & (np.arange(n) % 2 == 0))}
    summary = long_caption_summary(metrics, judge, long_rows, truncated)
    assert summary["n_long"] == int(long_rows.sum())
    assert summary["n_long_truncated"]["clip"] == int((long_rows & (np.arange(n) % 2 == 0)).sum())
    for name in CONTRASTIVE:
        expected = 100 * stats.kendalltau(metrics[name][long_rows], judge[long_rows], variant="b").statistic
        assert summary["tau_b"][name]["truncate"] == pytest.approx(expected, abs=1e-9)
        chunk = 100 * stats.kendalltau(metrics[f"{name} chunk"][long_rows], judge[long_rows], variant="b").statistic
        assert summary["tau_b"][name]["chunk"] == pytest.approx(chunk, abs=1e-9)
