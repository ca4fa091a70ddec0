"""Unit tests: vocabulary, decoding, schedule, batch plan, SCST advantages, grid features, feature cache."""
from __future__ import annotations

import json
from itertools import chain, pairwise

import pytest
import torch
from captioner_testkit import tiny_model_config

from pacs.captioner.modeling.decoding import beam_search, greedy, sample
from pacs.captioner.modeling.model import Captioner, sequence_mask
from pacs.captioner.modeling.train_scst import compute_advantages
from pacs.captioner.modeling.training_setup import BatchPlan, ScheduleConfig, pacs_lr
from pacs.captioner.modeling.vocab import EOS_ID, UNK_ID, WordVocab, build_vocab, load_vocab, ptb_tokenize_fast
from pacs.metric.common.errors import InputError

torch.set_num_threads(1)


def test_ptb_tokenizer_lowercases_splits_clitics_and_drops_punctuation():
    assert ptb_tokenize_fast("A child's T-shirt, isn't RED. (Really!)") == [
        "a", "child", "'s", "t-shirt", "is", "n't", "red", "really"]


def test_word_vocab_threshold_unk_max_length_and_json_roundtrip(tmp_path):
    vocab = WordVocab.build(["a dog runs", "a dog sits", "a cat"], min_count=2, max_length=3)
    assert vocab.itos[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert vocab.itos[4:] == ["a", "dog"]  # frequency order; "runs", "sits", "cat" are rare
    assert vocab.encode("A dog flies over a dog") == [4, 5, UNK_ID]  # truncated to max_length
    assert vocab.decode([4, 5, EOS_ID, 4]) == "a dog"
    vocab.save(tmp_path / "v.json")
    again = load_vocab(tmp_path / "v.json")
    assert again.itos == vocab.itos and again.max_length == 3


def test_load_vocab_rejects_unknown_kind(tmp_path):
    (tmp_path / "v.json").write_text(json.dumps({"kind": "bpe"}))
    with pytest.raises(InputError, match="unknown vocabulary kind 'bpe'"):
        load_vocab(tmp_path / "v.json")


def test_sentencepiece_vocab_roundtrip(tmp_path):
    pytest.importorskip("sentencepiece")
    captions = ["a dog runs on the grass", "a cat sits on a mat", "two dogs play in the park"] * 30
    vocab = build_vocab("sentencepiece", captions, vocab_size=40)
    assert vocab.decode(vocab.encode("a dog sits on the grass")) == "a dog sits on the grass"
    vocab.save(tmp_path / "sp.json")
    assert load_vocab(tmp_path / "sp.json").encode("a cat") == vocab.encode("a cat")


def _model() -> Captioner:
    """A random tiny captioner with sharpened outputs (so sequences end at different lengths)."""
    config = tiny_model_config()
    config.vocab_size, config.feature_dim, config.max_length = 30, 16, 8
    torch.manual_seed(0)
    model = Captioner(config).eval()
    with torch.no_grad():
        model.head.weight.mul_(3.0)
    return model


def test_beam_size_one_equals_greedy():
    model, features = _model(), torch.randn(4, 5, 16)
    g, b = greedy(model, features), beam_search(model, features, beam_size=1)
    assert torch.equal(g.tokens, b.tokens)
    assert torch.allclose(g.log_probs, b.log_probs, atol=1e-5)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_scores_equal_teacher_forced_log_probs(length_penalty):
    model, features = _model(), torch.randn(3, 5, 16)
    decoded = beam_search(model, features, beam_size=5, length_penalty=length_penalty)
    assert decoded.tokens.shape[:2] == (3, 5)
    flat = decoded.tokens.view(15, -1)
    forced = model.log_probs(features.repeat_interleave(5, 0), flat).sum(-1).view(3, 5)
    assert torch.allclose(forced, decoded.log_probs, atol=1e-4)
    # beams come out best first by their ranking score, and are distinct
    assert torch.all(decoded.scores[:, :-1] >= decoded.scores[:, 1:] - 1e-6)
    assert len({tuple(row.tolist()) for row in flat[:5]}) == 5
    if length_penalty:
        assert torch.allclose(decoded.scores, decoded.log_probs / decoded.lengths().float() ** length_penalty)


def test_beam_search_finds_a_better_sequence_than_greedy_on_average():
    model, features = _model(), torch.randn(16, 5, 16)
    best = beam_search(model, features, beam_size=5, return_k=1).log_probs[:, 0]
    assert torch.all(best >= greedy(model, features).log_probs[:, 0] - 1e-5)


def test_sampling_log_probs_match_and_top_k_restricts_first_token():
    model, features = _model(), torch.randn(2, 5, 16)
    torch.manual_seed(1)
    drawn = sample(model, features, k=6, temperature=0.8)
    forced = model.log_probs(features.repeat_interleave(6, 0), drawn.tokens.view(12, -1)).sum(-1).view(2, 6)
    assert torch.allclose(forced, drawn.log_probs, atol=1e-4)
    top1 = sample(model, features, k=4, top_k=1)  # top-1 sampling can only pick the argmax
    g = greedy(model, features).tokens
    width = min(top1.tokens.shape[-1], g.shape[-1])
    assert torch.equal(top1.tokens[..., :width], g[..., :width].expand(-1, 4, -1))


def test_sequence_mask_stops_after_first_eos():
    tokens = torch.tensor([[5, 6, EOS_ID, 7, 0], [5, EOS_ID, EOS_ID, 0, 0]])
    assert sequence_mask(tokens).tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]


def test_pacs_schedule_shape():
    s = ScheduleConfig()
    assert pacs_lr(0, s) == pytest.approx(2.5e-7)
    assert pacs_lr(999, s) == pytest.approx(2.5e-4)
    assert pacs_lr(5000, s) == pytest.approx(2.5e-4)
    mid = pacs_lr(12500, s)
    linear_mid = (2.5e-4 + 1e-5) / 2
    assert linear_mid < mid < 2.5e-4  # sub-linear (square-root) decay stays above the linear one
    assert pacs_lr(15000, s) == pytest.approx(1e-5) and pacs_lr(19999, s) == pytest.approx(1e-5)
    values = [pacs_lr(t, s) for t in range(10000, 15001, 500)]
    assert all(a >= b for a, b in pairwise(values))


def test_batch_plan_splits_global_batch_over_processes_and_epochs():
    one = BatchPlan(20, 8, 4, 1, seed=3, what="t")
    two = BatchPlan(20, 8, 2, 2, seed=3, what="t")
    assert one.steps_per_epoch == 2 and one.dropped_per_epoch == 4
    full = list(chain.from_iterable(one.local_micro_batches(0, 0, 0)))
    parts = [*chain.from_iterable(two.local_micro_batches(0, 0, 0)),
             *chain.from_iterable(two.local_micro_batches(0, 0, 1))]
    assert sorted(full) == sorted(parts) and len(set(full)) == 8
    assert one.advance(0, 8) == (1, 0)
    with pytest.raises(InputError, match="multiple of processes"):
        BatchPlan(20, 8, 3, 1, seed=0, what="xe")


def test_advantages_for_each_baseline_and_nonfinite_rewards():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.0, float("nan"), 4.0]])
    repaired, adv, count = compute_advantages(rewards, "mean")
    assert count == 1
    assert torch.allclose(repaired[1], torch.tensor([0.0, 2.0, 4.0]))
    assert torch.allclose(adv, torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0]]))
    _, loo, _ = compute_advantages(torch.tensor([[1.0, 2.0, 3.0]]), "loo")
    assert torch.allclose(loo, torch.tensor([[1 - 2.5, 2 - 2.0, 3 - 1.5]]))
    _, g, _ = compute_advantages(torch.tensor([[1.0, 2.0]]), "greedy", torch.tensor([1.5]))
    assert torch.allclose(g, torch.tensor([[-0.5, 0.5]]))
    with pytest.raises(InputError, match="unknown SCST baseline"):
        compute_advantages(rewards, "median")


def test_grid_features_are_the_tokens_before_ln_post(tmp_path):
    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    from pacs.metric.models.grid import grid_feature_dim, visual_grid_features

    backbone = build_backbone_from_config(tiny_clip_config(), seed=0)
    pixels = torch.randn(2, 3, 64, 64)
    grid = visual_grid_features(backbone, pixels)
    assert grid.shape == (2, 1 + (64 // 16) ** 2, grid_feature_dim(backbone))
    visual = backbone.model.visual
    pooled = visual.ln_post(grid[:, 0]) @ visual.proj
    assert torch.allclose(pooled, backbone.model.encode_image(pixels), atol=1e-5)


def test_evaluation_rows_split_nocaps_style_domains():
    from pacs.captioner.data import CaptionItem
    from pacs.captioner.orchestration.pipeline import evaluation_rows

    items = [CaptionItem("1", None, ["a dog on grass"], "val", {"domain": "in-domain"}),
             CaptionItem("2", None, ["a red car"], "val", {"domain": "out-domain"}),
             CaptionItem("3", None, ["a cat on a mat"], "val", {"domain": "out-domain"})]
    captions = {"1": "a dog dog on the", "2": "a red car", "3": "a cat"}
    rows = evaluation_rows("nocaps", captions, items, None, [])
    assert [row["test_set"] for row in rows] == ["nocaps", "nocaps/in-domain", "nocaps/out-domain"]
    assert rows[1]["Rep-1"] == 1.0 and rows[2]["Rep-1"] == 0.0  # "dog" repeated once, in the in-domain caption
    assert rows[0]["%Incorrect"] == pytest.approx(100 / 3) and rows[1]["%Incorrect"] == 100.0


def test_forward_with_repeats_equals_repeated_features():
    model = _model()
    features, tokens = torch.randn(2, 5, 16), torch.randint(4, 30, (6, 7))
    shared = model(features, tokens, repeats=3)
    assert torch.allclose(shared, model(features.repeat_interleave(3, 0), tokens), atol=1e-5)


def test_captioner_folder_roundtrip_and_truncated_weights_refused(tmp_path):
    from pacs.captioner.modeling.checkpoints import load_captioner, save_captioner

    model, vocab = _model(), WordVocab([f"w{i}" for i in range(26)], max_length=8)
    folder = save_captioner(tmp_path / "cap", model, vocab, {"backbone": "x"}, {"stage": "test"})
    loaded, loaded_vocab, info = load_captioner(folder)
    features = torch.randn(2, 5, 16)
    assert torch.equal(beam_search(loaded, features, 3).tokens, beam_search(model, features, 3).tokens)
    assert loaded_vocab.itos == vocab.itos and info["provenance"]["stage"] == "test"
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    with pytest.raises(InputError, match="model.safetensors is unreadable"):
        load_captioner(folder)
