"""SCST's KL guard: a frozen reference captioner and the per-token log-ratio of the sampled captions.

For a sampled caption y of image v the penalty is TRL's (`beta` there, `scst.kl_coef` here):

    KL(y) = Σ_t [log π(y_t | y_<t, v) − log π_ref(y_t | y_<t, v)]     over t up to and including the first <eos>

the sum over the sampled tokens of the single-sample estimate of KL(π ‖ π_ref). Both log-probabilities are
teacher-forced with the models in eval mode (no dropout) under `torch.no_grad()`, so KL(y) is exactly 0 while
the policy's weights equal the reference's. The reference (`scst.kl_reference`, default the SCST init
checkpoint, i.e. the XE model) is loaded on every process, kept in eval mode with `requires_grad=False` and never
given to the optimizer or to accelerate's DDP wrapper: it is never updated.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from pacs.captioner.modeling.checkpoints import load_captioner
from pacs.captioner.modeling.model import shift_right, token_log_probs
from pacs.metric.common.errors import InputError, NonFiniteError
from pacs.metric.training.divergence import nonfinite_parameter


def token_log_ratio(policy_logits: torch.Tensor, reference_logits: torch.Tensor,
                    tokens: torch.Tensor) -> torch.Tensor:
    """`log π(y_t) − log π_ref(y_t)` `[N, T]` of the tokens `y` `[N, T]`, zero after the first <eos>."""
    return token_log_probs(policy_logits, tokens) - token_log_probs(reference_logits, tokens)


class ReferencePolicy:
    """A frozen captioner (eval mode, no gradients) giving the KL guard's `log π_ref` of sampled captions."""

    def __init__(self, folder: str | os.PathLike, vocab: Any, device: torch.device | str = "cpu") -> None:
        model, ref_vocab, _ = load_captioner(folder, device)
        if ref_vocab.to_dict() != vocab.to_dict():
            raise InputError(f"scst.kl_reference={str(folder)!r}: its vocabulary differs from the SCST model's "
                             "(the KL compares log-probabilities of the same token ids): use a captioner trained "
                             "on the same vocab.json")
        bad = nonfinite_parameter(model.named_parameters())
        if bad is not None:
            raise NonFiniteError(f"scst.kl_reference={str(folder)!r}: weight {bad!r} is not finite",
                                 parameter="scst.kl_reference")
        model.requires_grad_(False)
        self.model = model.eval()
        self.folder = str(folder)

    @torch.no_grad()
    def sequence_kl(self, policy: Any, features: torch.Tensor, tokens: torch.Tensor, repeats: int = 1) -> torch.Tensor:
        """`KL(y)` `[N]` of the captions `tokens` `[N = B·repeats, T]` of `features` `[B, ...]` (policy in eval mode)."""
        was_training = policy.training
        policy.eval()
        try:
            policy_logits = policy(features, shift_right(tokens), repeats=repeats)
        finally:
            policy.train(was_training)
        reference_logits = self.model(features, shift_right(tokens), repeats=repeats)
        return token_log_ratio(policy_logits, reference_logits, tokens).sum(1)
