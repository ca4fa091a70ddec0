"""Long captions, one rule everywhere: truncation flags per caption, and `long_captions="chunk"`.

Expected values are computed by hand here: token counts with the BPE alone, embeddings with the open_clip model's
own full 77/16-token forward (`model.encode_text` / `model.encode_image`), never with the scorer's fast paths.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from pacs import cli as pacs_cli
from pacs.metric import score
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.scoring.long_captions import mean_of_normalised, pack_pieces, split_sentences
from pacs.metric.scoring.scorer import DEFAULT_PROMPT, Scorer

CONTEXT = 16
# "A photo depicts " is 3 BPE tokens; with SOT and EOT a prompted text fits 16 ids when its caption has <= 11 tokens.
S1 = "a red square sits."         # 5 tokens
S2 = "a blue dog runs fast."      # 6 tokens
S3 = "the sky is very blue today."  # 7 tokens
S4 = "grass grows."               # 3 tokens
LONG = f"{S1} {S2} {S3} {S4}"      # 21 tokens: truncated; chunked as [S1 S2] (11) and [S3 S4] (10)
SHORT = "a dog"
TOO_LONG_SENTENCE = "a very long sentence with many many words that never stops at all here"  # 15 tokens


@pytest.fixture(scope="module")
def short_context():
    """A tiny CLIP whose text context is 16 ids (long captions are easy to write)."""
    return build_backbone_from_config(tiny_clip_config(text_cfg={"context_length": CONTEXT}), seed=3,
                                      name="tiny-16")


def n_ids(backbone, text: str) -> int:
    """SOT + BPE + EOT, counted with the BPE alone."""
    return len(backbone.tokenize.encode_text(text)) + 2


@torch.no_grad()
def hand_text(backbone, texts: list[str]) -> torch.Tensor:
    """Normalised embeddings from the model's own full-context forward (padded to the context)."""
    return torch.nn.functional.normalize(backbone.model.encode_text(backbone.tokenize(texts)).float(), dim=-1)


@torch.no_grad()
def hand_image(backbone, image: Image.Image) -> torch.Tensor:
    """Normalised image embedding from the model's own forward."""
    pixels = backbone.preprocess(image)[None]
    return torch.nn.functional.normalize(backbone.model.encode_image(pixels).float(), dim=-1)[0]


def test_the_sentences_of_the_test_have_the_token_counts_the_tests_rely_on(short_context):
    counts = [len(short_context.tokenize.encode_text(s)) for s in (DEFAULT_PROMPT, S1, S2, S3, S4)]
    assert counts == [3, 5, 6, 7, 3]
    assert n_ids(short_context, DEFAULT_PROMPT + LONG) > CONTEXT >= n_ids(short_context, DEFAULT_PROMPT + SHORT)
    assert n_ids(short_context, DEFAULT_PROMPT + TOO_LONG_SENTENCE) > CONTEXT


def test_split_and_pack_at_sentence_boundaries():
    assert split_sentences("One. Two!  Three?\nFour five") == ["One.", "Two!", "Three?", "Four five"]
    assert split_sentences("Pi is 3.14 today.") == ["Pi is 3.14 today."]
    words = lambda text: len(text.split()) <= 6
    assert pack_pieces("a b. c d. e f g. h.", words, prompt="P ") == ["a b. c d.", "e f g. h."]
    # a sentence longer than the context stays one piece (the caller truncates it)
    assert pack_pieces("a b. c d e f g h i. j.", words) == ["a b.", "c d e f g h i.", "j."]
    assert pack_pieces("no break here at all, really not", words) == ["no break here at all, really not"]


def test_chunk_pieces_of_the_long_caption(short_context):
    fits = lambda text: n_ids(short_context, text) <= CONTEXT
    assert pack_pieces(LONG, fits, DEFAULT_PROMPT) == [f"{S1} {S2}", f"{S3} {S4}"]


def test_truncate_marks_each_truncated_caption_and_keeps_the_end_token(short_context):
    scorer = Scorer(short_context, progress=False)
    image = Image.new("RGB", (64, 64), "red")
    result = scorer.score([image] * 3, [LONG, SHORT, TOO_LONG_SENTENCE])
    assert result.truncated == [True, False, True] and result.n_truncated == 2
    assert result.long_captions == "truncate" and result.n_chunked == 0
    ids = short_context.tokenize_batch([DEFAULT_PROMPT + LONG]).ids[0]
    assert len(ids) == CONTEXT and ids[-1] == short_context.tokenize.eot_id  # EOT kept in place
    expected = hand_text(short_context, [DEFAULT_PROMPT + LONG, DEFAULT_PROMPT + SHORT])
    image_emb = hand_image(short_context, image)
    np.testing.assert_allclose(result.cosines[:2], (expected @ image_emb).numpy(), atol=1e-5)


def test_chunk_equals_plain_when_one_piece_suffices(short_context):
    captions = [SHORT, S1, f"{S1} {S2}", "", "two cats. one dog."]
    plain = Scorer(short_context, progress=False).embed_texts_detailed(captions)
    chunked = Scorer(short_context, progress=False, long_captions="chunk").embed_texts_detailed(captions)
    # bit-equal: every caption fits, so chunking embeds exactly the plain batch (same texts, order and shapes)
    assert torch.equal(plain.embeddings, chunked.embeddings)
    assert chunked.truncated == [False] * 5 and chunked.pieces == [1] * 5


def test_chunk_equals_the_hand_computation_on_a_multi_sentence_caption(short_context):
    image = Image.new("RGB", (64, 64), (30, 200, 90))
    scorer = Scorer(short_context, progress=False, long_captions="chunk")
    result = scorer.score([image, image], [LONG, SHORT])
    pieces = hand_text(short_context, [DEFAULT_PROMPT + f"{S1} {S2}", DEFAULT_PROMPT + f"{S3} {S4}"])
    mean = pieces.mean(dim=0)
    expected_long = mean / mean.norm()
    expected_short = hand_text(short_context, [DEFAULT_PROMPT + SHORT])[0]
    embedded = scorer.embed_texts([LONG, SHORT])
    assert torch.allclose(embedded[0], expected_long, atol=1e-5)
    assert torch.allclose(embedded[1], expected_short, atol=1e-5)
    image_emb = hand_image(short_context, image)
    cosines = torch.stack([expected_long @ image_emb, expected_short @ image_emb]).numpy()
    np.testing.assert_allclose(result.cosines, cosines, atol=1e-5)
    np.testing.assert_allclose(result.scores, 2.5 * np.maximum(cosines, 0), atol=1e-5)
    assert result.truncated == [False, False] and result.n_truncated == 0 and result.n_chunked == 1
    # the mean of the normalised pieces differs from the truncated embedding (chunking did something)
    assert not torch.allclose(embedded[0], hand_text(short_context, [DEFAULT_PROMPT + LONG])[0], atol=1e-3)
    assert torch.allclose(mean_of_normalised(pieces * 3.0), expected_long, atol=1e-6)


def test_chunk_truncates_and_counts_a_single_sentence_longer_than_the_context(short_context):
    caption = f"{S1} {TOO_LONG_SENTENCE}"
    scorer = Scorer(short_context, progress=False, long_captions="chunk")
    embedded = scorer.embed_texts_detailed([caption])
    assert embedded.truncated == [True] and embedded.pieces == [2]
    pieces = hand_text(short_context, [DEFAULT_PROMPT + S1, DEFAULT_PROMPT + TOO_LONG_SENTENCE])  # 2nd truncated
    mean = pieces.mean(dim=0)
    assert torch.allclose(embedded.embeddings[0], mean / mean.norm(), atol=1e-5)


def test_references_follow_the_long_caption_mode(short_context):
    image = Image.new("RGB", (64, 64), "blue")
    scorer = Scorer(short_context, progress=False)
    chunked = scorer.score([image], [SHORT], references=[[LONG, S4]], long_captions="chunk")
    truncated = scorer.score([image], [SHORT], references=[[LONG, S4]])
    candidate = hand_text(short_context, [DEFAULT_PROMPT + SHORT])[0]
    pieces = hand_text(short_context, [DEFAULT_PROMPT + f"{S1} {S2}", DEFAULT_PROMPT + f"{S3} {S4}"]).mean(0)
    chunked_refs = torch.stack([pieces / pieces.norm(), hand_text(short_context, [DEFAULT_PROMPT + S4])[0]])
    cut_refs = hand_text(short_context, [DEFAULT_PROMPT + LONG, DEFAULT_PROMPT + S4])
    assert chunked.ref_terms[0] == pytest.approx(float((chunked_refs @ candidate).max()), abs=1e-5)
    assert truncated.ref_terms[0] == pytest.approx(float((cut_refs @ candidate).max()), abs=1e-5)
    assert chunked.n_truncated_references == 0 and truncated.n_truncated_references == 1


def test_unknown_long_caption_mode_is_one_clear_error(short_context):
    with pytest.raises(InputError, match="long_captions= 'split'"):
        Scorer(short_context, long_captions="split")


def test_score_api_marks_truncated_captions(short_context):
    image = Image.new("RGB", (64, 64), "red")
    plain = score([image, image], [LONG, SHORT], metric="clip-s", backbone=short_context)
    assert plain.truncated == (True, False) and plain.n_truncated == 1 and plain.long_captions == "truncate"
    chunked = score([image, image], [LONG, SHORT], metric="clip-s", backbone=short_context, long_captions="chunk")
    assert chunked.truncated == (False, False) and chunked.long_captions == "chunk"
    pieces = hand_text(short_context, [DEFAULT_PROMPT + f"{S1} {S2}", DEFAULT_PROMPT + f"{S3} {S4}"]).mean(0)
    cosine = float((pieces / pieces.norm()) @ hand_image(short_context, image))
    assert chunked.details.cosines[0] == pytest.approx(cosine, abs=1e-5)


def test_torchmetrics_class_marks_truncated_captions(short_context):
    pytest.importorskip("torchmetrics")
    from pacs.metric.scoring.tm_metrics import CLIPScore

    image = Image.new("RGB", (64, 64), "red")
    metric = CLIPScore(backbone=short_context, return_per_sample=True)
    metric.update([image, image], [LONG, SHORT])
    metric.update([image], [TOO_LONG_SENTENCE])
    result = metric.compute()
    assert result["truncated"].tolist() == [True, False, True] and metric.n_truncated == 2
    chunk = CLIPScore(backbone=short_context, return_per_sample=True, long_captions="chunk")
    chunk.update([image, image], [LONG, SHORT])
    assert chunk.compute()["truncated"].tolist() == [False, False] and chunk.long_captions == "chunk"


def test_reward_and_trl_reward_mark_truncated_captions(short_context):
    from pacs.rewards import build_reward
    from pacs.rewards.trl import reward_function

    image = Image.new("RGB", (64, 64), "red")
    reward = build_reward("clip-s", backbone=short_context, image_loader=lambda image_id: image)
    values = reward(["a", "b"], [[LONG, SHORT], [SHORT, TOO_LONG_SENTENCE]], [[], []])
    assert values.shape == (2, 2)
    assert reward.fn.last_truncated.tolist() == [[True, False], [False, True]] and reward.fn.n_truncated == 2
    chunked = build_reward("clip-s", backbone=short_context, image_loader=lambda image_id: image,
                           long_captions="chunk")
    chunked_values = chunked(["a"], [[LONG, SHORT]], [[]])
    pieces = hand_text(short_context, [DEFAULT_PROMPT + f"{S1} {S2}", DEFAULT_PROMPT + f"{S3} {S4}"]).mean(0)
    expected = 2.5 * max(float((pieces / pieces.norm()) @ hand_image(short_context, image)), 0.0)
    assert float(chunked_values[0, 0]) == pytest.approx(expected, abs=1e-5)
    assert chunked.fn.last_truncated.tolist() == [[False, False]]

    logged: dict[str, float] = {}
    trl = reward_function("clip-s", backbone=short_context)
    scores = trl(prompts=["p"] * 3, completions=[LONG, SHORT, TOO_LONG_SENTENCE], image=[image, image, None],
                 log_metric=logged.__setitem__)
    assert scores[2] is None and trl.last_truncated == [True, False, None] and trl.n_truncated == 1
    assert logged["clip-s/truncated"] == pytest.approx(0.5)


def test_cli_score_marks_truncated_captions_per_instance(short_context, tmp_path):
    from pacs.metric.models.backbones import save_backbone

    checkpoint = save_backbone(short_context, tmp_path / "tiny16.safetensors")
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (64, 64), "red").save(images / "1.png")
    (tmp_path / "cands.json").write_text(json.dumps([{"image_id": 1, "caption": LONG},
                                                     {"image_id": 1, "caption": SHORT}]))
    out = tmp_path / "out.json"
    assert pacs_cli.main(["score", "--metric", "clip-s", "--checkpoint", str(checkpoint), "--images", str(images),
                          "--candidates", str(tmp_path / "cands.json"), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [row["truncated"] for row in data["per_instance"]] == [True, False]
    assert data["n_truncated"] == 1 and data["long_captions"] == "truncate" and data["score"] == "cosine"
    assert data["provenance"]["long_captions"] == "truncate" and data["provenance"]["score"] == "cosine"
    assert math.isfinite(data["mean"])


def test_correlate_counts_the_truncated_candidates(short_context, tmp_path):
    from pacs.eval import correlate
    from pacs.metric.models.backbones import save_backbone

    checkpoint = save_backbone(short_context, tmp_path / "tiny16.safetensors")
    Image.new("RGB", (64, 64), "red").save(tmp_path / "img0.png")
    judged = [(LONG, 5), (SHORT, 1), (TOO_LONG_SENTENCE, 4), (S1, 2)]
    data = {"img0": {"image_path": "img0.png", "ground_truth": ["a red image"],
                     "human_judgement": [{"caption": c, "rating": r} for c, r in judged]}}
    (tmp_path / "composite.json").write_text(json.dumps(data))
    common = {"images": str(tmp_path), "checkpoint": str(checkpoint)}
    truncated = correlate("composite", tmp_path / "composite.json", "clip-s", **common)
    chunked = correlate("composite", tmp_path / "composite.json", "clip-s", long_captions="chunk", **common)
    assert truncated["counts"]["truncated_captions[clip-s]"] == 2  # LONG and TOO_LONG_SENTENCE
    assert chunked["counts"]["truncated_captions[clip-s]"] == 1  # only the single over-long sentence
