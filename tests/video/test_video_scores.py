"""PAC-S++ video formulas (Eqs. 6-14) on tiny random backbones and hand-built embeddings."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from pacs.metric.common.errors import InputError
from pacs.metric.video.frames import FrameSampling
from pacs.metric.video.idf import IdfTable, cached_idf, idf_from_token_ids
from pacs.metric.video.scorer import (
    VideoScorer,
    best_reference_parts,
    caption_token_embeddings,
    coarse_embedding,
    fine_grained,
    harmonic_f1,
    reference_video_score,
    text_text_score,
    video_text_score,
)

from .video_support import frame_array, write_frame_folder


def unit(*values: float) -> torch.Tensor:
    """A normalised vector."""
    return F.normalize(torch.tensor(values, dtype=torch.float32), dim=0)


def test_coarse_embedding_is_normalised_mean():
    frames = torch.stack([unit(1, 0, 0), unit(0, 1, 0)])
    coarse = coarse_embedding(frames)
    assert torch.allclose(coarse, unit(1, 1, 0), atol=1e-6)
    assert math.isclose(float(coarse.norm()), 1.0, rel_tol=1e-6)


def test_fine_grained_precision_recall_by_hand():
    # frames e0, e1; tokens e0 (idf 1), e2 (idf 3), (e0+e1)/sqrt2 (idf 0).
    frames = torch.stack([unit(1, 0, 0), unit(0, 1, 0)])
    tokens = torch.stack([unit(1, 0, 0), unit(0, 0, 1), unit(1, 1, 0)])
    idf = torch.tensor([1.0, 3.0, 0.0])
    precision, recall = fine_grained(frames, tokens, idf)
    # best frame per token: 1, 0, 1/sqrt2 -> IDF-weighted mean (1*1 + 3*0 + 0) / 4
    assert math.isclose(precision, 0.25, rel_tol=1e-6)
    # best token per frame: frame e0 -> 1 (token e0); frame e1 -> 1/sqrt2 (token (e0+e1)/sqrt2)
    assert math.isclose(recall, (1 + 1 / math.sqrt(2)) / 2, rel_tol=1e-6)
    parts = video_text_score(frames, tokens, idf)
    assert math.isclose(parts.fine, 2 * precision * recall / (precision + recall), rel_tol=1e-6)
    # coarse uses the last token (EOS) against the normalised mean of the frames: both are (e0+e1)/sqrt2
    assert math.isclose(parts.coarse, 1.0, rel_tol=1e-6)
    assert math.isclose(parts.score, (parts.coarse + parts.fine) / 2, rel_tol=1e-9)


def test_harmonic_f1_zero_when_both_zero():
    assert harmonic_f1(0.0, 0.0) == 0.0
    assert math.isclose(harmonic_f1(0.5, 1.0), 2 / 3)


def test_fine_grained_f1_symmetric_in_frames_and_tokens_without_idf():
    generator = torch.Generator().manual_seed(0)
    a = F.normalize(torch.randn(5, 8, generator=generator), dim=-1)
    b = F.normalize(torch.randn(3, 8, generator=generator), dim=-1)
    p_ab, r_ab = fine_grained(a, b, torch.ones(3))
    p_ba, r_ba = fine_grained(b, a, torch.ones(5))
    # with uniform IDF, precision over tokens of (W=a, t=b) is recall over frames of (W=b, t=a) and back
    assert math.isclose(p_ab, r_ba, rel_tol=1e-6) and math.isclose(r_ab, p_ba, rel_tol=1e-6)
    assert math.isclose(harmonic_f1(p_ab, r_ab), harmonic_f1(p_ba, r_ba), rel_tol=1e-6)


def test_text_text_score_is_symmetric_with_idf():
    generator = torch.Generator().manual_seed(1)
    cand = F.normalize(torch.randn(6, 8, generator=generator), dim=-1)
    ref = F.normalize(torch.randn(4, 8, generator=generator), dim=-1)
    cand_idf = torch.rand(6, generator=generator) + 0.1
    ref_idf = torch.rand(4, generator=generator) + 0.1
    forward = text_text_score(cand, cand_idf, ref, ref_idf)
    backward = text_text_score(ref, ref_idf, cand, cand_idf)
    assert math.isclose(forward.precision, backward.recall, rel_tol=1e-6)
    assert math.isclose(forward.recall, backward.precision, rel_tol=1e-6)
    assert math.isclose(forward.score, backward.score, rel_tol=1e-6)
    assert forward.precision != pytest.approx(forward.recall)  # the symmetry is not a trivial equality
    same = text_text_score(cand, cand_idf, cand, cand_idf)
    assert same.score == pytest.approx(1.0, abs=1e-6)


def test_token_embeddings_end_with_the_clip_text_embedding(tiny_backbone):
    captions = ["a man is riding a horse on the beach", "dog", ""]
    tokens = tiny_backbone.tokenize(captions)  # padded to 77, as open_clip encodes
    per_token = caption_token_embeddings(tiny_backbone.model, tokens)
    with torch.no_grad():
        pooled = F.normalize(tiny_backbone.model.encode_text(tokens).float(), dim=-1)
    ids = tiny_backbone.tokenize.encode(captions).ids
    for row, emb in enumerate(per_token):
        assert emb.shape[0] == len(ids[row])  # SOT .. EOS
        assert torch.allclose(emb.norm(dim=-1), torch.ones(emb.shape[0]), atol=1e-5)
        assert torch.allclose(emb[-1], pooled[row], atol=1e-5)  # t_c is the EOS token


def test_coarse_score_of_a_still_video_is_the_image_caption_cosine(tiny_backbone, tmp_path):
    image = frame_array(7, size=(40, 40))
    folder = write_frame_folder(tmp_path / "still", [image] * 4)
    scorer = VideoScorer(tiny_backbone, FrameSampling(fps=None), progress=False)
    caption = "a striped wall"
    result = scorer.score([folder], [caption])
    with torch.no_grad():
        pixels = tiny_backbone.preprocess(Image.fromarray(image)).unsqueeze(0)
        image_emb = F.normalize(tiny_backbone.model.encode_image(pixels).float(), dim=-1)[0]
        text_emb = F.normalize(tiny_backbone.model.encode_text(tiny_backbone.tokenize([caption])).float(), dim=-1)[0]
    assert result.coarse[0] == pytest.approx(float(image_emb @ text_emb), abs=1e-5)
    # every frame equal: recall is the best token cosine with that image
    tokens = scorer.embed_captions([caption])[0].tokens
    assert result.recall[0] == pytest.approx(float((tokens @ image_emb).max()), abs=1e-5)


def test_idf_formula_and_function_words(tiny_backbone):
    scorer = VideoScorer(tiny_backbone, progress=False)
    corpus = ["a man rides a horse", "a woman is cooking in the kitchen", "a dog runs on the grass",
              "a child plays with a ball", "the horse eats hay"]
    table = scorer.idf(corpus)
    sot, eot = scorer.special_ids()
    n = len(corpus)
    docs = [set(ids) for ids in scorer.tokenize_ids(corpus)]
    for token in set().union(*docs) - {sot, eot}:
        df = sum(token in doc for doc in docs)
        assert table.weights[token] == pytest.approx(math.log((n + 1) / (df + 1)))
    word = {w: scorer.tokenize_ids([w])[0][1] for w in ("a", "the", "horse", "kitchen")}
    assert table.weights[word["a"]] < table.weights[word["the"]] < table.weights[word["horse"]]
    assert table.weights[word["horse"]] < table.weights[word["kitchen"]]
    assert table.weights[sot] == 0.0
    unseen = scorer.tokenize_ids(["zebra"])[0][1]
    assert table.lookup([unseen])[0] == pytest.approx(math.log(n + 1))
    others = [v for t, v in table.weights.items() if t != eot]
    assert table.weights[eot] == pytest.approx(sum(others) / (len(others) + 1))  # EOS counted with idf 0


def test_idf_eos_weight_is_mean_of_table():
    table = idf_from_token_ids([[1, 5, 9, 2], [1, 7, 2], [1, 5, 2]], sot_id=1, eot_id=2)
    # df: 5 -> 2, 9 -> 1, 7 -> 1; SOT and EOT in all 3 documents (0 before EOS gets the mean)
    expected = {5: math.log(4 / 3), 9: math.log(2), 7: math.log(2), 1: 0.0}
    for token, value in expected.items():
        assert table.weights[token] == pytest.approx(value)
    assert table.weights[2] == pytest.approx((sum(expected.values()) + 0.0) / 5)
    with pytest.raises(InputError):
        idf_from_token_ids([], sot_id=1, eot_id=2)


def test_idf_cache_round_trip(tiny_backbone, tmp_path, monkeypatch):
    scorer = VideoScorer(tiny_backbone, cache_dir=tmp_path, progress=False)
    corpus = ["a cat sleeps", "a cat eats", "two dogs bark"]
    first = scorer.idf(corpus)
    files = list((tmp_path / "idf").glob("*.json"))
    assert len(files) == 1
    import pacs.metric.video.idf as video_idf

    monkeypatch.setattr(video_idf, "compute_idf", lambda *a, **k: pytest.fail("cache not used"))
    second = cached_idf(corpus, scorer.tokenize_ids, *scorer.special_ids(), tmp_path, "ClipTokenizer-77")
    assert second.weights == first.weights and second.default == first.default
    assert IdfTable.load(files[0]).weights == first.weights
    files[0].write_text("{}")
    with pytest.raises(InputError, match="not a pacs IDF table"):
        IdfTable.load(files[0])


def test_references_aggregate_as_emscore_coarse_and_fine_maximised_separately():
    # candidate tokens e0, e1 (EOS e1); uniform IDF.
    cand = torch.stack([unit(1, 0, 0, 0), unit(0, 1, 0, 0)])
    # r1 = (e2, e1): coarse e1·e1 = 1; P = (0 + 1)/2 = 1/2, R = (0 + 1)/2 = 1/2, F = 1/2; Score = 3/4
    r1 = torch.stack([unit(0, 0, 1, 0), unit(0, 1, 0, 0)])
    # r2 = (e0, e1, e3): coarse e1·e3 = 0; P = (1 + 1)/2 = 1, R = (1 + 1 + 0)/3 = 2/3, F = 4/5; Score = 2/5
    r2 = torch.stack([unit(1, 0, 0, 0), unit(0, 1, 0, 0), unit(0, 0, 0, 1)])
    parts = [text_text_score(cand, torch.ones(2), ref, torch.ones(len(ref))) for ref in (r1, r2)]
    assert [p.score for p in parts] == pytest.approx([0.75, 0.4], abs=1e-6)
    best = best_reference_parts(parts)
    # EMScore: (max coarse + max F) / 2 = (1 + 4/5) / 2 = 0.9 -- the best single reference gives only 0.75
    assert best.coarse == pytest.approx(1.0, abs=1e-6) and best.fine == pytest.approx(0.8, abs=1e-6)
    assert best.precision == pytest.approx(1.0, abs=1e-6) and best.recall == pytest.approx(2 / 3, abs=1e-6)
    assert best.score == pytest.approx(0.9, abs=1e-6)
    assert reference_video_score(0.5, parts) == pytest.approx((0.5 + 0.9) / 2, abs=1e-6)
    with pytest.raises(InputError, match="at least one reference"):
        best_reference_parts([])


def test_scorer_reference_term_maximises_coarse_and_fine_separately(tiny_backbone, tmp_path):
    video = write_frame_folder(tmp_path / "v", [frame_array(i) for i in range(3)])
    scorer = VideoScorer(tiny_backbone, FrameSampling(fps=None), progress=False)
    caption, refs = "a striped red wall", ["a red dog", "blue"]
    idf = scorer.idf(refs)
    based = scorer.score([video], [caption], [refs], idf=idf)
    cand = scorer.embed_captions([caption])[0]
    coarse, fine = [], []
    for ref in scorer.embed_captions(refs, prompt=False):
        # a second, plain implementation of Eq. 13's terms for text: cosine matrix, IDF-weighted best matches
        sim = (cand.tokens @ ref.tokens.T).double()
        wc, wr = idf.lookup(cand.ids).double(), idf.lookup(ref.ids).double()
        precision = float((wc * sim.max(dim=1).values).sum() / wc.sum())
        recall = float((wr * sim.max(dim=0).values).sum() / wr.sum())
        coarse.append(float(sim[-1, -1]))
        fine.append(2 * precision * recall / (precision + recall))
    best_single = max((c + f) / 2 for c, f in zip(coarse, fine))
    expected = (max(coarse) + max(fine)) / 2
    assert int(np.argmax(coarse)) != int(np.argmax(fine))  # the case where the two rules differ
    assert expected > best_single + 1e-4
    assert based.ref_terms[0] == pytest.approx(expected, abs=1e-5)
    assert based.scores[0] == pytest.approx((based.video_scores[0] + expected) / 2, abs=1e-5)


def test_scores_do_not_depend_on_batch_size(tiny_backbone, tmp_path):
    videos = [write_frame_folder(tmp_path / f"v{i}", [frame_array(3 * i + j) for j in range(3)]) for i in range(3)]
    captions = ["a red and white pattern", "stripes", "a person walks a dog in the park at night", "",
                "blue lines on a wall"]
    refs = [["a pattern"], ["lines", "a striped wall"], ["a dog in a park"], ["nothing"], ["blue stripes"]]
    pairs = [videos[i % 3] for i in range(len(captions))]
    idf_corpus = [r for group in refs for r in group]
    results = []
    for batch_size in (1, 2, 16):
        scorer = VideoScorer(tiny_backbone, FrameSampling(fps=None), batch_size=batch_size, progress=False)
        results.append(scorer.score(pairs, captions, refs, idf=scorer.idf(idf_corpus)))
    for other in results[1:]:
        np.testing.assert_allclose(other.scores, results[0].scores, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(other.fine, results[0].fine, rtol=1e-5, atol=1e-6)
    assert results[0].n_empty == 1
    assert len(set(np.round(results[0].scores, 6))) == len(captions)  # not a constant


def test_reference_score_is_eq14(tiny_backbone, tmp_path):
    video = write_frame_folder(tmp_path / "v", [frame_array(i) for i in range(3)])
    scorer = VideoScorer(tiny_backbone, FrameSampling(fps=None), w=2.0, progress=False)
    caption, refs = "a striped red wall", ["a wall", "a striped red wall", "a cat"]
    idf = scorer.idf(refs)
    free = scorer.score([video], [caption], idf=idf)
    based = scorer.score([video], [caption], [refs], idf=idf)
    cand = scorer.embed_captions([caption])[0]
    text_scores = []
    for ref in scorer.embed_captions(refs, prompt=False):
        text_scores.append(text_text_score(cand.tokens, idf.lookup(cand.ids), ref.tokens, idf.lookup(ref.ids)).score)
    assert max(text_scores) == pytest.approx(1.0, abs=1e-6)  # the identical reference wins
    assert based.ref_terms[0] == pytest.approx(max(text_scores))
    assert based.scores[0] == pytest.approx(2.0 * (free.video_scores[0] + max(text_scores)) / 2)
    assert free.scores[0] == pytest.approx(2.0 * free.video_scores[0])
    with pytest.raises(InputError, match="candidate 0"):
        scorer.score([video], [caption], [[]])


def test_caption_ends_at_the_first_eos_like_the_text_tower(tiny_backbone):
    scorer = VideoScorer(tiny_backbone, progress=False)
    cut, plain = scorer.embed_captions(["a dog <|endoftext|> runs far away", "a dog"])
    assert cut.ids == plain.ids
    assert torch.allclose(cut.tokens, plain.tokens, atol=1e-5)


def test_lora_backbone_token_embeddings(tmp_path):
    from pacs.metric.models.lora import attach_lora

    from .video_support import build_tiny_backbone

    backbone = attach_lora(build_tiny_backbone(), rank=2)
    with torch.no_grad():  # a non-zero adapter, so that the LoRA path matters
        for name, parameter in backbone.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    captions = ["a cat on a mat", "two dogs"]
    tokens = backbone.tokenize(captions)
    with torch.no_grad():
        pooled = F.normalize(backbone.model.encode_text(tokens).float(), dim=-1)
    per_token = caption_token_embeddings(backbone.model, tokens)
    for row, emb in enumerate(per_token):
        assert torch.allclose(emb[-1], pooled[row], atol=1e-5)
    base = caption_token_embeddings(build_tiny_backbone().model, tokens)
    assert not torch.allclose(base[0][-1], per_token[0][-1], atol=1e-3)
    folder = write_frame_folder(tmp_path / "v", [frame_array(i) for i in range(2)])
    scorer = VideoScorer(backbone, FrameSampling(fps=None), progress=False)
    assert scorer.score([folder], captions[:1]).scores.shape == (1,)


def test_per_pair_scores_match_a_padded_batch_computation():
    # an independent, batched form of Eqs. 9-13 with padding masks (the layout EMScore computes in)
    generator = torch.Generator().manual_seed(5)
    frames = [F.normalize(torch.randn(n, 16, generator=generator), dim=-1) for n in (3, 7, 1)]
    tokens = [F.normalize(torch.randn(n, 16, generator=generator), dim=-1) for n in (4, 2, 9)]
    idfs = [torch.rand(len(t), generator=generator) for t in tokens]
    max_f, max_l = max(len(f) for f in frames), max(len(t) for t in tokens)
    frame_pad = torch.zeros(3, max_f, 16)
    token_pad = torch.zeros(3, max_l, 16)
    frame_mask = torch.zeros(3, max_f, dtype=torch.bool)
    idf_pad = torch.zeros(3, max_l)
    for i in range(3):
        frame_pad[i, : len(frames[i])], frame_mask[i, : len(frames[i])] = frames[i], True
        token_pad[i, : len(tokens[i])], idf_pad[i, : len(tokens[i])] = tokens[i], idfs[i]
    sim = token_pad @ frame_pad.transpose(1, 2)  # [B, L, F]
    token_best = sim.masked_fill(~frame_mask[:, None, :], -2).max(dim=2).values
    precision = (token_best * idf_pad).sum(1) / idf_pad.sum(1)
    token_mask = torch.zeros(3, max_l, dtype=torch.bool)
    for i in range(3):
        token_mask[i, : len(tokens[i])] = True
    frame_best = sim.masked_fill(~token_mask[:, :, None], -2).max(dim=1).values
    recall = (frame_best * frame_mask).sum(1) / frame_mask.sum(1)
    video = F.normalize((frame_pad * frame_mask[..., None]).sum(1) / frame_mask.sum(1, keepdim=True), dim=-1)
    eos = torch.stack([t[-1] for t in tokens])
    coarse = (video * eos).sum(-1)
    expected = (coarse + 2 * precision * recall / (precision + recall)) / 2
    for i in range(3):
        parts = video_text_score(frames[i], tokens[i], idfs[i])
        assert parts.score == pytest.approx(float(expected[i]), abs=1e-6)
        assert parts.precision == pytest.approx(float(precision[i]), abs=1e-6)
        assert parts.recall == pytest.approx(float(recall[i]), abs=1e-6)
