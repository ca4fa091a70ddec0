"""PAC-S++ for video captions (PAC-S++ §3.4, Eqs. 6-14; EMScore-style coarse + fine-grained matching).

Pure functions on embeddings (`coarse_embedding`, `fine_grained`, `text_fine_grained`, `video_text_score`,
`text_text_score`) and `VideoScorer`, which reads and embeds frames (cached per video, in memory and optionally on
disk), embeds captions token by token (`caption_token_embeddings`), computes IDF weights, and scores.

- frames: `W_f^j = Norm(E_v(w^j))` (Eq. 6); coarse video embedding `W_c = Norm(mean_j W_f^j)` (Eq. 7);
- caption: `t_f = Norm(W · LN(E_t(t)))` for every token SOT..EOT (Eq. 8), `t_c = t_f^EOS`;
- coarse `W_c · t_c` (Eq. 9); precision `P = Σ_l IDF_l max_j W_f^j·t_f^l / Σ_l IDF_l` (Eq. 10); recall
  `R = mean_j max_l W_f^j·t_f^l` (Eq. 11); `F = 2PR/(P+R)` (Eq. 12); `Score = (coarse + F)/2` (Eq. 13);
- reference-based (Eq. 14): `(Score(W, t) + Score(t, R)) / 2`, where `Score(t, r)` is Eq. 13 with the
  reference's tokens in place of the frames (coarse `t_c·r_c`; the reference side of the matching is IDF-weighted
  too, as in EMScore, which makes the text-text score symmetric) and, as in EMScore's reference code, the terms are
  maximised over the references separately: `Score(t, R) = (max_r coarse(t, r) + max_r F(t, r)) / 2`.
The formulas carry no scale factor; `w` (default 1) multiplies the final score and changes no ranking.
With `score="sigmoid"` (models with a logit bias only) the video score and the reference term are each mapped by
the model's calibration, `sigmoid(logit_scale·S + logit_bias)`, before Eq. 14's mean (range (0, 1); `w` is not
applied). Long captions are truncated to the text context (every token is matched, Eqs. 8-12: sentence chunking
is not defined there) and each truncated caption is reported (`VideoScoreResult.truncated`).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from tqdm import tqdm

from pacs.metric.common.device import resolve_device
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import Backbone
from pacs.metric.scoring.conventions import calibration, check_long_captions, check_score_kind
from pacs.metric.scoring.embedding_cache import EmbeddingCache
from pacs.metric.scoring.scorer import image_identity
from pacs.metric.video.frames import (
    Frame,
    FrameSampling,
    ShortVideo,
    cap_indices,
    iter_frames,
    short_video,
    source_digest,
)
from pacs.metric.video.idf import IdfTable, cached_idf

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# Pure functions on embeddings
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class ScoreParts:
    """The terms of Eq. 13 for one caption: coarse, precision, recall, fine (their F1) and the score."""

    coarse: float
    precision: float
    recall: float
    fine: float
    score: float


def harmonic_f1(precision: float, recall: float) -> float:
    """`2PR/(P+R)` (Eq. 12); 0 when `P + R` is 0."""
    total = precision + recall
    return 0.0 if total == 0 else 2.0 * precision * recall / total


def coarse_embedding(frame_embs: torch.Tensor) -> torch.Tensor:
    """`W_c`: the L2-normalised mean of the (normalised) frame embeddings `[F, E]` (Eq. 7)."""
    return F.normalize(frame_embs.float().mean(dim=0), dim=-1)


def fine_grained(frame_embs: torch.Tensor, token_embs: torch.Tensor, idf: torch.Tensor) -> tuple[float, float]:
    """IDF-weighted precision over caption tokens (Eq. 10) and recall over frames (Eq. 11)."""
    similarity = token_embs.float() @ frame_embs.float().T  # [L, F]
    idf = idf.float()
    precision = float((idf * similarity.max(dim=1).values).sum() / idf.sum())
    recall = float(similarity.max(dim=0).values.mean())
    return precision, recall


def text_fine_grained(cand_embs: torch.Tensor, cand_idf: torch.Tensor, ref_embs: torch.Tensor,
                      ref_idf: torch.Tensor) -> tuple[float, float]:
    """Token-to-token precision (candidate tokens, IDF-weighted) and recall (reference tokens, IDF-weighted)."""
    similarity = cand_embs.float() @ ref_embs.float().T  # [Lc, Lr]
    cand_idf, ref_idf = cand_idf.float(), ref_idf.float()
    precision = float((cand_idf * similarity.max(dim=1).values).sum() / cand_idf.sum())
    recall = float((ref_idf * similarity.max(dim=0).values).sum() / ref_idf.sum())
    return precision, recall


def video_text_score(frame_embs: torch.Tensor, token_embs: torch.Tensor, idf: torch.Tensor) -> ScoreParts:
    """Eqs. 9-13 for one video `[F, E]` and one caption's tokens `[L, E]` (EOS last) with their IDF `[L]`."""
    coarse = float(coarse_embedding(frame_embs) @ token_embs[-1].float())
    precision, recall = fine_grained(frame_embs, token_embs, idf)
    fine = harmonic_f1(precision, recall)
    return ScoreParts(coarse, precision, recall, fine, (coarse + fine) / 2.0)


def text_text_score(cand_embs: torch.Tensor, cand_idf: torch.Tensor, ref_embs: torch.Tensor,
                    ref_idf: torch.Tensor) -> ScoreParts:
    """Eq. 13 with a reference sentence in place of the video: coarse `t_c·r_c`, token matching F1."""
    coarse = float(cand_embs[-1].float() @ ref_embs[-1].float())
    precision, recall = text_fine_grained(cand_embs, cand_idf, ref_embs, ref_idf)
    fine = harmonic_f1(precision, recall)
    return ScoreParts(coarse, precision, recall, fine, (coarse + fine) / 2.0)


def best_reference_parts(text_parts: Sequence[ScoreParts]) -> ScoreParts:
    """EMScore's aggregation over references: P, R, F and coarse each maximised separately, then combined.

    The combined score is `(max_r coarse_r + max_r F_r) / 2`; the two maxima may come from different references
    (EMScore's `emscore/scorer.py` does this), so it is at least the best single reference's score.
    """
    if not text_parts:
        raise InputError("a reference-based video score needs at least one reference")
    coarse = max(p.coarse for p in text_parts)
    fine = max(p.fine for p in text_parts)
    return ScoreParts(coarse=coarse, precision=max(p.precision for p in text_parts),
                      recall=max(p.recall for p in text_parts), fine=fine, score=(coarse + fine) / 2.0)


def reference_video_score(video_score: float, text_parts: Sequence[ScoreParts]) -> float:
    """Eq. 14 aggregated as EMScore: the mean of the video score and `best_reference_parts(text_parts).score`."""
    return (video_score + best_reference_parts(text_parts).score) / 2.0


# ---------------------------------------------------------------------------------------------------------------
# Caption token embeddings (Eq. 8)
# ---------------------------------------------------------------------------------------------------------------

def _check_text_tower(model: torch.nn.Module) -> None:
    needed = ("token_embedding", "positional_embedding", "transformer", "ln_final", "text_projection")
    missing = [name for name in needed if not hasattr(model, name)]
    if missing:
        raise InputError("video scores need an open_clip CLIP with its own text transformer "
                         f"(this model lacks {', '.join(missing)})")
    pool = getattr(model, "text_pool_type", "argmax")
    if pool not in ("argmax", "eos"):
        raise InputError(f"video scores need EOS pooling of the text tower (this model pools by {pool!r})")


def eos_positions(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Position of the EOS token of every row (the pooling rule of the model's text tower)."""
    if getattr(model, "text_pool_type", "argmax") == "eos":
        return (tokens == model.text_eos_id).int().argmax(dim=-1)
    return tokens.argmax(dim=-1)


@torch.no_grad()
def encode_text_tokens(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Every token's embedding after the final LN and the text projection, `[N, L, E]` (unnormalised).

    The text tower's causal mask makes positions up to EOS independent of what follows, so `tokens` may be cut
    to the longest caption of the batch.
    """
    _check_text_tower(model)
    length = tokens.shape[1]
    cast_dtype = model.transformer.get_cast_dtype() if hasattr(model.transformer, "get_cast_dtype") else None
    x = model.token_embedding(tokens)
    if cast_dtype is not None:
        x = x.to(cast_dtype)
    x = x + model.positional_embedding[:length].to(x.dtype)
    mask = getattr(model, "attn_mask", None)
    x = model.transformer(x, attn_mask=None if mask is None else mask[:length, :length])
    x = model.ln_final(x)
    projection = model.text_projection
    if projection is None:
        return x
    if isinstance(projection, torch.nn.Module):
        return projection(x)
    return x @ projection


def caption_token_embeddings(model: torch.nn.Module, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Normalised token embeddings `t_f` of each caption, SOT..EOS inclusive (EOS last, so `t_c = rows[-1]`)."""
    ends = eos_positions(model, tokens)
    length = int(ends.max()) + 1
    embeddings = F.normalize(encode_text_tokens(model, tokens[:, :length]).float(), dim=-1)
    return [embeddings[row, : int(end) + 1].cpu() for row, end in enumerate(ends)]


# ---------------------------------------------------------------------------------------------------------------
# The scorer
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class CaptionEmbedding:
    """A caption's token ids (SOT..EOS) and their normalised embeddings `[L, E]`."""

    ids: list[int]
    tokens: torch.Tensor
    truncated: bool = False


@dataclass
class VideoScoreResult:
    """Scores of N (video, caption) pairs in input order, with every term of Eqs. 9-14."""

    scores: np.ndarray
    coarse: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    fine: np.ndarray
    video_scores: np.ndarray
    ref_terms: np.ndarray | None = None
    n_truncated: int = 0
    n_empty: int = 0
    w: float = 1.0
    truncated: list[bool] | None = None
    score_kind: str = "cosine"


class VideoScorer:
    """Embeds frames (cached per video) and captions (token by token) with a `Backbone` and scores pairs."""

    def __init__(self, backbone: Backbone, sampling: FrameSampling | None = None, batch_size: int = 64,
                 device: str | None = None, cache_dir: str | os.PathLike | None = None, prompt: str = "",
                 w: float = 1.0, progress: bool = True, score: str = "cosine",
                 long_captions: str = "truncate") -> None:
        self.backbone = backbone
        self.score_kind = check_score_kind(score)
        if check_long_captions(long_captions) != "truncate":
            raise InputError("video scores match every caption token with the frames (PAC-S++ Eqs. 8-12), where "
                             "sentence chunking is not defined: use long_captions= truncate",
                             parameter="long_captions")
        self.long_captions = "truncate"
        self.calibration = calibration(backbone) if self.score_kind == "sigmoid" else None
        self.model = backbone.model
        _check_text_tower(self.model)
        self.sampling = sampling or FrameSampling()
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise InputError(f"batch size must be >= 1 (got {batch_size})")
        self.device = torch.device(resolve_device(device)) if device else next(self.model.parameters()).device
        if next(self.model.parameters()).device != self.device:
            self.model.to(self.device)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.disk_cache = (EmbeddingCache(self.cache_dir / "video-frames", str(getattr(backbone, "fingerprint", "")),
                                          str(getattr(backbone, "name", ""))) if self.cache_dir else None)
        self.prompt = prompt
        self.w = float(w)
        self.progress = progress
        self._frame_cache: dict[str, torch.Tensor] = {}
        self._caption_cache: dict[str, CaptionEmbedding] = {}
        self.stats = {"videos_embedded": 0, "frames_embedded": 0, "video_cache_hits": 0, "disk_cache_hits": 0,
                      "short_videos": 0}
        self.short_videos: list[ShortVideo] = []  # videos with fewer distinct frames than num_frames requested

    # -- frames ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def embed_frames(self, frames: Sequence[Image.Image]) -> torch.Tensor:
        """Normalised embeddings `W_f` `[F, E]` of PIL frames, encoded in batches of `batch_size`."""
        chunks = []
        for start in range(0, len(frames), self.batch_size):
            pixels = torch.stack([self.backbone.preprocess(frame) for frame in frames[start:start + self.batch_size]])
            features = self.model.encode_image(pixels.to(self.device)).float()
            chunks.append(F.normalize(features, dim=-1).cpu())
        return torch.cat(chunks) if chunks else torch.zeros(0, 0)

    def _embed_stream(self, frames: Iterable[Frame], indices: list[int] | None = None) -> torch.Tensor:
        """Embed frames as they are decoded, `batch_size` at a time (only embeddings are kept in memory).

        The frames' positions in the video are appended to `indices` when given.
        """
        chunks, batch = [], []
        for frame in frames:
            batch.append(frame.image)
            if indices is not None:
                indices.append(frame.index)
            if len(batch) == self.batch_size:
                chunks.append(self.embed_frames(batch))
                batch = []
        if batch:
            chunks.append(self.embed_frames(batch))
        self.stats["frames_embedded"] += sum(chunk.shape[0] for chunk in chunks)
        return torch.cat(chunks)

    def embed_video(self, source: str | os.PathLike) -> torch.Tensor:
        """Normalised frame embeddings `[F, E]` of a video file or frame folder (cached by path, then on disk)."""
        source = Path(source)
        memory_key = f"{image_identity(source)}|{self.sampling.key()}"  # resolved path + size + mtime, not an id
        if memory_key in self._frame_cache:
            self.stats["video_cache_hits"] += 1
            return self._frame_cache[memory_key]
        disk_key = f"{source_digest(source)}-{self.sampling.key()}" if self.disk_cache is not None else None
        cached = self.disk_cache.get(disk_key) if disk_key is not None else None
        indices: list[int] | None = None  # positions of the decoded frames (None: read from the disk cache)
        if cached is not None:
            embeddings = torch.from_numpy(cached)
            self.stats["disk_cache_hits"] += 1
        else:
            indices = []
            embeddings = self._embed_stream(iter_frames(source, self.sampling), indices)
            embeddings = embeddings[cap_indices(embeddings.shape[0], self.sampling.max_frames)]
            self.stats["videos_embedded"] += 1
            if disk_key is not None:
                self.disk_cache.put(disk_key, embeddings.numpy())
                if self.sampling.num_frames is not None:  # a count was requested: keep what the video yielded
                    self.disk_cache.put(f"{disk_key}-distinct", np.array([len(set(indices))]))
        self._note_short(source, indices, disk_key)
        self._frame_cache[memory_key] = embeddings
        return embeddings

    def _note_short(self, source: Path, indices: list[int] | None, disk_key: str | None) -> None:
        """Count (and log) a video that yielded fewer distinct frames than `num_frames` requested.

        `indices` are the decoded frames' positions; None for a disk-cache hit, whose distinct-frame count was
        stored next to its embeddings.
        """
        if self.sampling.num_frames is None:
            return
        if indices is None:
            stored = self.disk_cache.get(f"{disk_key}-distinct") if disk_key is not None else None
            if stored is None:
                return
            indices = list(range(int(stored[0])))
        report = short_video(source, self.sampling, indices)
        if report is not None:
            self.short_videos.append(report)
            self.stats["short_videos"] += 1

    # -- captions -------------------------------------------------------------------------------------------
    def tokenize_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids SOT..EOS of each text (the backbone's tokenizer, truncated to its context)."""
        return [ids for ids, _ in self._tokenize(texts)]

    def _tokenize(self, texts: Sequence[str]) -> list[tuple[list[int], bool]]:
        tokenize = self.backbone.tokenize
        if hasattr(tokenize, "encode"):
            batch = tokenize.encode(list(texts))
            return list(zip(batch.ids, batch.truncated))
        tokens = tokenize(list(texts))
        ends = eos_positions(self.model, tokens)
        return [(tokens[row, : int(end) + 1].tolist(), int(end) == tokens.shape[1] - 1)
                for row, end in enumerate(ends)]

    def special_ids(self) -> tuple[int, int]:
        """The SOT and EOS ids of the tokenizer (read from the tokenization of an empty text)."""
        ids = self.tokenize_ids([""])[0]
        return ids[0], ids[-1]

    @torch.no_grad()
    def embed_captions(self, captions: Sequence[str], prompt: bool = True) -> list[CaptionEmbedding]:
        """Token embeddings of captions (the prompt prepended when `prompt`), cached by text."""
        texts = [(self.prompt if prompt else "") + caption for caption in captions]
        todo = sorted({t for t in texts if t not in self._caption_cache}, key=lambda t: (len(t), t))
        starts = range(0, len(todo), self.batch_size)
        for start in tqdm(starts, desc="caption tokens", unit="batch", disable=not self.progress or len(starts) < 8):
            batch = todo[start:start + self.batch_size]
            tokenized = self._tokenize(batch)
            length = max(len(ids) for ids, _ in tokenized)
            tokens = torch.zeros(len(batch), length, dtype=torch.long)
            for row, (ids, _) in enumerate(tokenized):
                tokens[row, : len(ids)] = torch.tensor(ids)
            embeddings = caption_token_embeddings(self.model, tokens.to(self.device))
            for text, (ids, cut), emb in zip(batch, tokenized, embeddings):
                # the text tower pools at the first EOS (a literal "<|endoftext|>" in a caption ends it early)
                self._caption_cache[text] = CaptionEmbedding(ids=list(ids[: emb.shape[0]]), tokens=emb,
                                                             truncated=cut)
        return [self._caption_cache[t] for t in texts]

    # -- IDF ------------------------------------------------------------------------------------------------
    def idf(self, corpus: Sequence[str] | None) -> IdfTable:
        """IDF table of a corpus of sentences (None: uniform weights), cached under `cache_dir` when set."""
        if corpus is None:
            return IdfTable.uniform()
        sot, eot = self.special_ids()
        tokenizer_key = f"{type(self.backbone.tokenize).__name__}-{getattr(self.backbone, 'context_length', '')}"
        return cached_idf(list(corpus), self.tokenize_ids, sot, eot, self.cache_dir, tokenizer_key, self.progress)

    # -- scoring --------------------------------------------------------------------------------------------
    def score(self, videos: Sequence[str | os.PathLike], candidates: Sequence[str],
              references: Sequence[Sequence[str]] | None = None, idf: IdfTable | None = None) -> VideoScoreResult:
        """Score each (video, candidate) pair; with `references`, the reference-based score (Eq. 14)."""
        if len(videos) != len(candidates):
            raise InputError(f"{len(videos)} videos for {len(candidates)} candidates")
        unique = list(dict.fromkeys(Path(video).resolve() for video in videos))
        embedded = {path: self.embed_video(path) for path in
                    tqdm(unique, desc="video frames", unit="video", disable=not self.progress or len(unique) < 4)}
        frame_embs = [embedded[Path(video).resolve()] for video in videos]
        return self.score_embeddings(frame_embs, candidates, references, idf)

    def score_embeddings(self, frame_embs: Sequence[torch.Tensor], candidates: Sequence[str],
                         references: Sequence[Sequence[str]] | None = None,
                         idf: IdfTable | None = None) -> VideoScoreResult:
        """Score candidates against precomputed frame embeddings (`[F, E]` each, normalised)."""
        if len(frame_embs) != len(candidates):
            raise InputError(f"{len(frame_embs)} videos for {len(candidates)} candidates")
        if references is not None and len(references) != len(candidates):
            raise InputError(f"{len(references)} reference lists for {len(candidates)} candidates")
        idf = idf or IdfTable.uniform()
        captions = self.embed_captions(candidates)
        refs = None
        if references is not None:
            for index, group in enumerate(references):
                if not group:
                    raise InputError(f"candidate {index}: no references for a reference-based score")
            flat = sorted({r for group in references for r in group})
            refs = dict(zip(flat, self.embed_captions(flat, prompt=False)))
        weights_cache: dict[tuple[int, ...], torch.Tensor] = {}

        def weights_of(ids: list[int]) -> torch.Tensor:
            key = tuple(ids)
            if key not in weights_cache:
                weights_cache[key] = idf.lookup(ids)
            return weights_cache[key]

        rows = []
        ref_terms = []
        pairs = enumerate(zip(frame_embs, captions))
        for index, (frames, caption) in tqdm(pairs, total=len(captions), desc="video scores", unit="caption",
                                             disable=not self.progress or len(captions) < 2000):
            if frames.numel() == 0:
                raise InputError(f"candidate {index}: its video has no frames")
            weights = weights_of(caption.ids)
            rows.append(video_text_score(frames, caption.tokens, weights))
            if refs is not None:
                text_parts = [text_text_score(caption.tokens, weights, refs[r].tokens, weights_of(refs[r].ids))
                              for r in references[index]]
                ref_terms.append(best_reference_parts(text_parts).score)
        video_scores = np.array([p.score for p in rows], dtype=np.float64)
        if self.calibration is not None:
            video_scores = self.calibration.apply(video_scores).astype(np.float64)
        weight = self.w if self.calibration is None else 1.0
        if refs is not None:
            ref_array = np.array(ref_terms, dtype=np.float64)
            if self.calibration is not None:
                ref_array = self.calibration.apply(ref_array).astype(np.float64)
            final = (video_scores + ref_array) / 2.0
        else:
            ref_array, final = None, video_scores
        n_empty = sum(1 for c in candidates if not c.strip())
        if n_empty:
            logger.warning("%d empty caption(s) scored as the prompt alone", n_empty)
        return VideoScoreResult(
            scores=weight * final, coarse=np.array([p.coarse for p in rows]),
            precision=np.array([p.precision for p in rows]), recall=np.array([p.recall for p in rows]),
            fine=np.array([p.fine for p in rows]), video_scores=video_scores, ref_terms=ref_array,
            n_truncated=sum(c.truncated for c in captions), n_empty=n_empty, w=self.w,
            truncated=[bool(c.truncated) for c in captions], score_kind=self.score_kind)
