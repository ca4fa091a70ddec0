"""Positive-augmented contrastive losses for training PAC-S / PAC-S++ (plus optional RCA-NOC and UMIC-style terms).

Decisions the papers leave open (docs/formulas.md), fixed here:
- the symmetric InfoNCE *averages* its two directions (image→text and text→image), as PAC-S++ §3.1 says;
  ``directions="sum"`` gives the PAC-S Eq. 2 form (exactly twice the value);
- the temperature is the model's own ``logit_scale`` (``exp`` of CLIP's learned log-scale); whether it is
  trained is the trainer's choice (frozen by default, see ``pacs.metric.training.trainer``);
- for SigLIP / SigLIP2 backbones (``kind="sigmoid"``) each of the paper's terms L(V,T), L(V',T), L(V,T') is SigLIP's
  pairwise sigmoid loss on that pair of embedding sets (``open_clip.loss.SigLipLoss``: positives on the diagonal,
  every other pair a negative) with the model's own scale and bias; λv, λt unchanged. The sigmoid loss has no
  directions (``directions`` applies to InfoNCE only); the optional relative term stays InfoNCE-shaped with the
  model's scale, the margin term works on cosines either way.
All embeddings given to these functions are L2-normalised ``[N, E]`` tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from pacs.metric.common.errors import PacsError

Directions = Literal["mean", "sum"]
LossKind = Literal["infonce", "sigmoid"]


def _check_pair(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.ndim != 2 or b.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"{what}: expected two [N, E] tensors of the same shape, "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")


def symmetric_infonce(img: torch.Tensor, txt: torch.Tensor, logit_scale: torch.Tensor | float,
                      directions: Directions = "mean") -> torch.Tensor:
    """Symmetric InfoNCE over the batch: row i of `img` matches row i of `txt`; the other rows are negatives."""
    _check_pair(img, txt, "symmetric_infonce")
    logits = logit_scale * img @ txt.t()
    targets = torch.arange(img.shape[0], device=img.device)
    image_to_text = F.cross_entropy(logits, targets)
    text_to_image = F.cross_entropy(logits.t(), targets)
    total = image_to_text + text_to_image
    return total / 2 if directions == "mean" else total


def sigmoid_pairwise(img: torch.Tensor, txt: torch.Tensor, logit_scale: torch.Tensor | float,
                     logit_bias: torch.Tensor | float) -> torch.Tensor:
    """SigLIP's pairwise sigmoid loss ``-Σ_ij log σ(z_ij·(s·cos_ij + b)) / N`` (z = +1 if i = j else -1).

    Row i of `img` matches row i of `txt`; every other pair of the batch is a negative. The computation is
    open_clip's own (`open_clip.loss.SigLipLoss`, one process: the caller gathers the global batch first).
    """
    from open_clip.loss import SigLipLoss

    _check_pair(img, txt, "sigmoid_pairwise")
    return SigLipLoss()(img, txt, logit_scale, logit_bias)


@dataclass
class LossTerms:
    """The total loss and its parts (detached parts are for logging)."""

    total: torch.Tensor
    real: torch.Tensor
    gen_image: torch.Tensor | None  # None: the v' term has weight 0 and v' was not encoded
    gen_text: torch.Tensor | None  # None: the t' term has weight 0 and t' was not encoded
    relative: torch.Tensor | None = None
    margin: torch.Tensor | None = None

    def as_floats(self) -> dict[str, float]:
        """Return every present term as a python float (for logs)."""
        names = ("total", "real", "gen_image", "gen_text", "relative", "margin")
        return {name: float(getattr(self, name).detach()) for name in names if getattr(self, name) is not None}


def relative_infonce(anchors: torch.Tensor, candidates: torch.Tensor, positive_mask: torch.Tensor,
                     logit_scale: torch.Tensor | float, weights: torch.Tensor | None = None) -> torch.Tensor:
    """RCA-NOC relative contrastive loss: each positive is contrasted only against the anchor's negatives.

    For anchor i with positives P_i and negatives N_i (every candidate that is not a positive):
    ``L_i = -(1/|P_i|) Σ_{p∈P_i} q_ip · log( e^{s_ip} / (e^{s_ip} + Σ_{n∈N_i} e^{s_in}) )`` with
    ``s = logit_scale · cos``; the loss is the mean of ``L_i`` over anchors having at least one positive.
    `weights` (``[N, M]``, default 1) are the per-positive re-weightings ``q`` (RCA-NOC Eq. 14).
    """
    if anchors.ndim != 2 or candidates.ndim != 2 or anchors.shape[1] != candidates.shape[1]:
        raise ValueError("relative_infonce: anchors [N, E] and candidates [M, E] must share E")
    mask = positive_mask.to(torch.bool)
    if mask.shape != (anchors.shape[0], candidates.shape[0]):
        raise ValueError(f"relative_infonce: positive_mask must be [N, M], got {tuple(mask.shape)}")
    scores = logit_scale * anchors @ candidates.t()
    negative_scores = scores.masked_fill(mask, float("-inf"))
    negative_lse = torch.logsumexp(negative_scores, dim=1, keepdim=True)  # log Σ_n e^{s_in}
    # log( e^s / (e^s + Σ e^n) ) = s - logaddexp(s, lse_neg)
    log_prob = scores - torch.logaddexp(scores, negative_lse.expand_as(scores))
    q = torch.ones_like(scores) if weights is None else weights.to(scores.dtype)
    per_pair = -(q * log_prob).masked_fill(~mask, 0.0)
    n_pos = mask.sum(dim=1)
    has_pos = n_pos > 0
    per_anchor = per_pair.sum(dim=1)[has_pos] / n_pos[has_pos]
    return per_anchor.mean()


def relative_positive_loss(img: torch.Tensor, txt: torch.Tensor, gen_img: torch.Tensor, gen_txt: torch.Tensor,
                           logit_scale: torch.Tensor | float, weighting: Literal["uniform", "similarity"] = "uniform"
                           ) -> torch.Tensor:
    """Relative InfoNCE with two positives per anchor (the real and the generated one), both directions averaged.

    Images v_i anchor over texts ``[t; t']`` (positives t_i, t'_i); texts t_i anchor over images ``[v; v']``
    (positives v_i, v'_i). ``weighting="similarity"`` ranks positives by their (detached) cosine to the anchor
    and weights each by ``exp(cos)`` normalised to mean 1 over the anchor's positives (RCA's q re-weighting).
    """
    n = img.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=img.device)
    mask = torch.cat([eye, eye], dim=1)

    def one_side(anchor: torch.Tensor, real: torch.Tensor, gen: torch.Tensor) -> torch.Tensor:
        cands = torch.cat([real, gen], dim=0)
        weights = None
        if weighting == "similarity":
            with torch.no_grad():
                sims = (anchor @ cands.t()).exp() * mask
                weights = sims / (sims.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True))
        return relative_infonce(anchor, cands, mask, logit_scale, weights)

    return (one_side(img, txt, gen_txt) + one_side(txt, img, gen_img)) / 2


def hard_negative_margin(img: torch.Tensor, txt: torch.Tensor, margin: float = 0.2) -> torch.Tensor:
    """UMIC-style margin ranking ``max(0, M - (S(v,t) - S(v,t̂)))`` on cosine scores with in-batch hardest negatives.

    For each image the hardest negative caption is the most similar non-matching caption of the batch (UMIC's
    "hard random" negative); symmetrically for each caption the hardest non-matching image. Mean of both.
    """
    _check_pair(img, txt, "hard_negative_margin")
    if img.shape[0] < 2:
        return img.sum() * 0.0
    sims = img @ txt.t()
    positive = sims.diagonal()
    off_diag = torch.eye(sims.shape[0], dtype=torch.bool, device=sims.device)
    negatives = sims.masked_fill(off_diag, float("-inf"))
    hardest_text = negatives.max(dim=1).values
    hardest_image = negatives.max(dim=0).values
    image_side = F.relu(margin - (positive - hardest_text))
    text_side = F.relu(margin - (positive - hardest_image))
    return (image_side.mean() + text_side.mean()) / 2


def positives_needed(lambda_v: float, lambda_t: float, relative_weight: float = 0.0) -> tuple[bool, bool]:
    """Whether the loss uses the generated images v' and the generated captions t' (a term with a non-zero weight)."""
    return bool(lambda_v or relative_weight), bool(lambda_t or relative_weight)


def positive_augmented_loss(img: torch.Tensor, txt: torch.Tensor, gen_img: torch.Tensor | None,
                            gen_txt: torch.Tensor | None,
                            logit_scale: torch.Tensor | float, lambda_v: float = 0.1, lambda_t: float = 0.001,
                            directions: Directions = "mean", relative_weight: float = 0.0,
                            relative_weighting: Literal["uniform", "similarity"] = "uniform",
                            margin_weight: float = 0.0, margin: float = 0.2, kind: LossKind = "infonce",
                            logit_bias: torch.Tensor | float | None = None) -> LossTerms:
    """``L = L(V,T) + λv·L(V',T) + λt·L(V,T')`` (+ optional relative and margin terms, off by default).

    `img`/`txt` are the real pair, `gen_img` the image generated from `txt` (v'), `gen_txt` the caption
    generated from `img` (t'). Defaults are PAC-S++'s λv = 0.1, λt = 0.001 (PAC-S: 0.05 / 0.1).
    `gen_img` / `gen_txt` may be None where no term uses them (`positives_needed`): that term is then None.
    `kind="sigmoid"` makes each L the SigLIP sigmoid loss with `logit_scale` and `logit_bias` (`sigmoid_pairwise`).
    """
    need_images, need_texts = positives_needed(lambda_v, lambda_t, relative_weight)
    for name, value, needed in (("gen_img", gen_img, need_images), ("gen_txt", gen_txt, need_texts)):
        if value is None and needed:
            raise PacsError(f"positive_augmented_loss: {name} is None but a loss term with a non-zero weight uses it")
    if kind not in ("infonce", "sigmoid"):
        raise PacsError(f"positive_augmented_loss: unknown loss kind {kind!r} (known: infonce, sigmoid)")
    if kind == "sigmoid" and logit_bias is None:
        raise PacsError("positive_augmented_loss: the sigmoid loss needs the model's logit_bias")

    def pair_loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if kind == "sigmoid":
            return sigmoid_pairwise(a, b, logit_scale, logit_bias)
        return symmetric_infonce(a, b, logit_scale, directions)

    real = pair_loss(img, txt)
    gen_image = pair_loss(gen_img, txt) if gen_img is not None else None
    gen_text = pair_loss(img, gen_txt) if gen_txt is not None else None
    total = real
    if gen_image is not None:
        total = total + lambda_v * gen_image
    if gen_text is not None:
        total = total + lambda_t * gen_text
    relative = margin_term = None
    if relative_weight:
        relative = relative_positive_loss(img, txt, gen_img, gen_txt, logit_scale, relative_weighting)
        total = total + relative_weight * relative
    if margin_weight:
        margin_term = hard_negative_margin(img, txt, margin)
        total = total + margin_weight * margin_term
    return LossTerms(total=total, real=real, gen_image=gen_image, gen_text=gen_text, relative=relative,
                     margin=margin_term)
