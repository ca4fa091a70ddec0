"""The training loop's shared work (issue 43 item 6): an image's features encoded once for its XE captions, the
cross-attention keys/values projected before SCST's repeat, beam search without re-gathering the memory — each
against the computation it replaces (written out here), with the same dropout masks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pacs.captioner.modeling.decoding import beam_search, sample
from pacs.captioner.modeling.example_rng import DROPOUT, ExampleRNG, example_generators
from pacs.captioner.modeling.model import Captioner, CaptionerConfig, DecoderState, shift_right, token_log_probs
from pacs.captioner.modeling.train_xe import image_rows, xe_loss
from pacs.metric.common.errors import InputError

# Gradient tolerance: sharing a computation sums the captions' gradients of an image before the shared layers'
# backward instead of after, a reordering of float32 sums of a few terms per element (measured: ≤ 7.4e-7 of the
# tensor's largest gradient); 1e-5 of the largest gradient leaves room for other kernels yet fails on a wrong
# mask or row (those change gradients by 1e-2 and more). The same bound serves values computed by such GEMMs.
GRAD_RTOL = 1e-5


def _model(dropout: float, share: bool = True) -> Captioner:
    """The tiny captioner in training mode; `share`: the opt-in shared image work these tests measure."""
    config = CaptionerConfig(vocab_size=40, feature_dim=24, d_model=64, n_heads=4, encoder_layers=2,
                             decoder_layers=2, ffn_dim=128, dropout=dropout, max_length=10)
    torch.manual_seed(0)
    model = Captioner(config).train()
    model.share_image_work = share
    return model


def _loss_and_grads(model: Captioner, run) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    logits, loss = run()
    loss.backward()
    return logits.detach(), loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def _assert_grads_close(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor],
                        exact: set[str]) -> None:
    for name, grad in expected.items():
        if name in exact:
            assert torch.equal(grad, got[name]), name
        else:
            assert (grad - got[name]).abs().max() <= GRAD_RTOL * grad.abs().max(), name


FEATS = torch.randn(3, 7, 24, generator=torch.Generator().manual_seed(1))
ROWS = torch.tensor([2, 0, 2, 1, 0, 2, 1, 2])  # 8 captions of 3 images, interleaved as a shuffled batch gives them
CAPTION_INDICES = [11, 4, 9, 0, 7, 2, 30, 1]  # their global example indices (the dropout streams' keys)
TOKENS = torch.randint(3, 40, (8, 11), generator=torch.Generator().manual_seed(2))


def _xe(model: Captioner, grouped: bool):
    def run():
        with model.example_rng(ExampleRNG(example_generators(5, 3, CAPTION_INDICES, DROPOUT))):
            if grouped:
                logits = model(FEATS, shift_right(TOKENS), rows=ROWS)
            else:  # before: one feature row per caption
                logits = model(FEATS[ROWS], shift_right(TOKENS))
        return logits, xe_loss(logits, TOKENS).mean()
    return _loss_and_grads(model, run)


def test_grouped_xe_equals_one_encode_per_caption_with_dropout():
    model = _model(dropout=0.3)
    before, after = _xe(model, grouped=False), _xe(model, grouped=True)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])  # same masks, same values
    # Only the projection before the first dropout is shared: every other gradient is computed as before.
    _assert_grads_close(before[2], after[2], exact=set(before[2]) - {"visual_projection.0.weight",
                                                                      "visual_projection.0.bias"})
    model.eval()
    with torch.no_grad():
        assert (model(FEATS[ROWS], shift_right(TOKENS)) - before[0]).abs().max() > 1e-2  # dropout was on


def test_grouped_xe_without_dropout_encodes_each_image_once():
    model = _model(dropout=0.0)
    encoded: list[int] = []
    model.encoder[0].register_forward_hook(lambda module, args, out: encoded.append(out.shape[0]))
    before, after = _xe(model, grouped=False), _xe(model, grouped=True)
    assert encoded == [8, 3]  # 8 captions encoded before, their 3 images now
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    decoder_only = {name for name in before[2] if name.startswith(("embedding", "positions", "decoder.", "head",
                                                                    "decoder_norm"))}
    _assert_grads_close(before[2], after[2], exact={n for n in decoder_only if "cross_attention.key_value" not in n})


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_by_default_rows_and_repeats_compute_exactly_what_one_encode_per_caption_did(dropout):
    # the exact path is the default: logits, loss and every gradient equal bit for bit (no tolerance), so a long
    # run (the main command's 2,000 XE steps) picks the checkpoint it picked before the sharing existed
    model = _model(dropout, share=False)
    before, after = _xe(model, grouped=False), _xe(model, grouped=True)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    _assert_grads_close(before[2], after[2], exact=set(before[2]))
    tokens = TOKENS[:6]

    def update(forward):
        def run():
            with model.example_rng(ExampleRNG(example_generators(7, 1, [5, 8, 2], DROPOUT))):
                logits = forward(model, FEATS, shift_right(tokens), 2)
            return logits, token_log_probs(logits, tokens).sum()
        return _loss_and_grads(model, run)

    old, new = update(_old_forward), update(lambda m, f, t, k: m(f, t, repeats=k))
    assert torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])
    _assert_grads_close(old[2], new[2], exact=set(old[2]))


def test_image_rows_fetch_each_image_once_in_first_seen_order():
    ids = ["a", "b", "c", "d"]
    cache = _DictFeatures({i: torch.full((2, 3), float(n)) for n, i in enumerate(ids)})
    image_of_caption = np.array([3, 1, 3, 0, 1], dtype=np.int32)
    feats, rows = image_rows(cache, ids, image_of_caption, [4, 2, 0, 3], "cpu")
    # captions 4, 2, 0, 3 show images 1, 3, 3, 0: fetched as [b, d, a], rows [0, 1, 1, 2]
    assert rows.tolist() == [0, 1, 1, 2]
    assert torch.equal(feats, cache.get(["b", "d", "a"]))


class _DictFeatures:
    """Cached features by id (what `image_rows` reads of a FeatureCache)."""

    def __init__(self, table: dict[str, torch.Tensor]) -> None:
        self.table = table

    def get(self, image_ids):
        return torch.stack([self.table[i] for i in image_ids])


def _old_forward(model: Captioner, features: torch.Tensor, input_tokens: torch.Tensor, repeats: int) -> torch.Tensor:
    """The forward before item 6 (b): the memory repeated, then projected to keys/values on B·repeats rows."""
    memory = model.encode(features).repeat_interleave(repeats, dim=0)
    return model._decode(input_tokens, model._memory_kv(memory), None, 0)


def test_forward_repeats_projects_once_and_matches_the_repeated_memory():
    model = _model(dropout=0.3)  # SCST's update: training mode, one dropout stream per image
    tokens = TOKENS[:6]
    advantages = torch.linspace(-1.0, 1.0, 6)

    def update(forward):
        def run():
            with model.example_rng(ExampleRNG(example_generators(7, 1, [5, 8, 2], DROPOUT))):
                logits = forward(model, FEATS, shift_right(tokens), 2)
            return logits, -(token_log_probs(logits, tokens).sum(1) * advantages).mean()
        return _loss_and_grads(model, run)

    before = update(_old_forward)
    after = update(lambda m, f, t, k: m(f, t, repeats=k))
    # The key/value projection now multiplies B·R rows instead of B·k·R: the float32 GEMM may block its sums
    # differently (measured: logits 3.8e-7 of their largest, loss 8e-7 relative, gradients 1.0e-6 of the
    # largest); a wrong row or mask moves them by 1e-2 and more.
    assert (before[0] - after[0]).abs().max() <= GRAD_RTOL * before[0].abs().max()
    assert abs(float(before[1] - after[1])) <= GRAD_RTOL * abs(float(before[1]))
    _assert_grads_close(before[2], after[2], exact=set())
    model.eval()
    with torch.no_grad():
        assert (_old_forward(model, FEATS, shift_right(tokens), 2) - before[0]).abs().max() > 1e-2  # dropout was on


def _old_gather(self: DecoderState, index: torch.Tensor) -> DecoderState:
    """Beam search's state update before item 6 (c): every cached tensor, the memory's keys/values included."""
    memory_kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.memory_kv]
    caches = [{name: t.index_select(0, index) for name, t in cache.items()} for cache in self.caches]
    return DecoderState(memory_kv, caches, self.position)


def test_beam_search_without_memory_gathers_gives_the_same_beams(monkeypatch):
    model = _model(dropout=0.1).eval()
    with torch.no_grad():
        model.head.weight.mul_(3.0)  # sharper outputs: beams end at different steps
    features = torch.randn(4, 7, 24, generator=torch.Generator().manual_seed(3))
    now = [beam_search(model, features, beam_size=b, length_penalty=p) for b, p in ((5, 0.0), (3, 1.0))]
    monkeypatch.setattr(DecoderState, "reorder_within_images", _old_gather)
    old = [beam_search(model, features, beam_size=b, length_penalty=p) for b, p in ((5, 0.0), (3, 1.0))]
    for a, b in zip(now, old):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.log_probs, b.log_probs)
    assert len({tuple(t.tolist()) for t in now[0].tokens[0]}) == 5  # five distinct beams were searched
    monkeypatch.undo()
    rng = ExampleRNG(example_generators(1, 0, range(4), 1))
    assert sample(model, features, k=3, rng=rng).tokens.shape[:2] == (4, 3)  # sample's expansion still selects


def test_forward_refuses_repeats_with_rows():
    with pytest.raises(InputError, match="either repeats or rows"):
        _model(0.0)(FEATS, shift_right(TOKENS), repeats=2, rows=ROWS)
