"""The Scorer: embeds images and texts in batches with caches and computes CLIP-S / PAC-S / PAC-S++ scores.

- Image embeddings are cached in memory by what the image is — its resolved path with the file's size and
  mtime, or the sha256 of a PIL image's pixels; never by an id alone (ids of different data sets collide) — for
  the scorer's lifetime, and optionally on disk (`cache_dir`, keyed by model fingerprint + image file hash):
  an image is encoded once.
- Texts are deduplicated, sorted by token length and encoded in batches trimmed to the longest sequence of
  each batch, not padded to 77; the standard CLIP text tower also skips every position after a text's EOT
  (exact for CLIP's causal text tower, see `Backbone.encode_text` and `pacs.metric.models.pruned_forward`).
- Results do not depend on the batch size or on the order of the inputs (up to float rounding, <= 1e-5).
- `score` ("cosine" default, or "sigmoid": the model's calibrated `sigmoid(scale·cos + bias)`) and
  `long_captions` ("truncate" default, or "chunk": sentence pieces averaged) are the conventions of
  `pacs.metric.scoring.conventions` and `pacs.metric.scoring.long_captions`; every result records both and marks each
  truncated caption (`ScoreResult.truncated`).
- Images are paths, PIL images, uint8 tensors `[C, H, W]` or preprocessed float tensors `[3, H, W]`
  (`pacs.metric.scoring.image_sources`), cached by content.
- `dtype` ("fp32" default, "bf16", "fp16") runs both towers under `torch.autocast(device, dtype)`: matmuls,
  convolutions and attention in the lower precision, LayerNorm and softmax in fp32, weights unchanged (the
  backbone may be shared) unless `cast_weights` says the scorer alone runs it (`build_scorer` for a model it
  loaded or merged): then its Linear / conv weights are cast once, to the values autocast would give them on
  every call (`pacs.metric.scoring.precision.cast_frozen_weights`, same scores bit for bit); embeddings are
  cast to fp32 before normalising. fp32 runs without autocast (bit-identical to before). The disk cache of a
  non-fp32 scorer is keyed by fingerprint + dtype.
- Images are decoded and preprocessed by `workers` threads (default `auto`: one per CPU core;
  `pacs.metric.common.parallel`) while the model encodes the previous batch; the pixels are those of the serial path,
  bit for bit, in the same order. `decode="gpu"` (opt-in) decodes JPEG files with nvJPEG and resizes on the GPU
  (`pacs.metric.models.tensor_decode`): faster, with a measured deviation from the exact PIL path; its disk cache is
  keyed apart.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from pacs.metric.common.device import check_precision, resolve_device
from pacs.metric.common.errors import InputError
from pacs.metric.common.parallel import ordered_map, resolve_workers
from pacs.metric.models.backbones import Backbone
from pacs.metric.models.pruned_forward import common_prefix_length, prefix_states
from pacs.metric.models.tensor_decode import TensorDecoder, check_decode
from pacs.metric.scoring import decode_pool, image_sources
from pacs.metric.scoring.conventions import calibration, check_long_captions, check_score_kind
from pacs.metric.scoring.embedding_cache import EmbeddingCache, image_identity  # noqa: F401 (re-exported)
from pacs.metric.scoring.finite import check_embeddings, check_scores, image_label
from pacs.metric.scoring.long_captions import mean_of_normalised, pack_pieces
from pacs.metric.scoring.precision import (
    DTYPES,
    cast_frozen_weights,
    check_dtype,
    dtype_fingerprint,
    precision_context,
    weights_dtype,
)
from pacs.metric.scoring.registry import default_w
from pacs.metric.scoring.results import ScoreResult, TextEmbeddings
from pacs.metric.scoring.scores import clip_score, ref_score

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = "A photo depicts "
_FAMILY_METRIC = {"clip": "clip-s", "pac-s": "pac-s", "pac-s++": "pac-s++"}
def is_empty_caption(caption: str) -> bool:
    """True for a caption that is empty after whitespace stripping (scored as the prompt alone)."""
    return not caption.strip()


def _check_texts(texts: Sequence[Any], what: str) -> None:
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"{what} #{index} is not a string: {text!r}")



def _stack_or_empty(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(tensors) if tensors else torch.zeros(0, 0)


@dataclass
class _ImagePlan:
    """The images of one call: every key in order, their labels, what to encode and its pixels as they decode."""

    keys: list[str]
    labels: dict[str, str]
    pending: list[tuple[str, Any]]
    file_hashes: dict[str, str]
    pixels: Iterator[torch.Tensor]


class Scorer:
    """Embeds and scores with one backbone; owns the image-embedding caches.

    The in-memory caches (images by key, texts, the prompt prefix) assume the model's weights do not change:
    call `clear_caches()` (or build a new Scorer) after changing them.

    >>> from PIL import Image
    >>> from pacs.metric import Scorer, load_backbone, ref_score
    >>> scorer = Scorer(load_backbone("tiny-random"))  # w=None: the family's default (CLIP-S: 2.5)
    >>> red = Image.new("RGB", (64, 64), "red")  # or image file paths
    >>> result = scorer.score([red, red], ["a red square", "a dog"], references=[["a red image"]] * 2)
    >>> result.scores.shape, result.w, scorer.images_encoded  # the repeated image is encoded once
    ((2,), 2.5, 1)
    >>> bool((result.scores == ref_score(result.clip_scores, result.ref_terms)).all())  # RefCLIP-S
    True
    >>> result.score_kind, result.truncated  # the convention, and which captions were cut to the context
    ('cosine', [False, False])
    """

    def __init__(self, backbone: Backbone, w: float | None = None, batch_size: int = 64, device: str = "cpu",
                 cache_dir: str | os.PathLike | None = None, prompt: str = DEFAULT_PROMPT,
                 text_cache_size: int = 50_000, progress: bool = True, warn_empty: bool = True,
                 dtype: str | torch.dtype = "fp32", score: str = "cosine", long_captions: str = "truncate",
                 workers: int | str = "auto", decode: str = "cpu", cast_weights: bool = False) -> None:
        if batch_size < 1:
            raise InputError(f"batch size must be >= 1, got {batch_size}")
        self.backbone = backbone
        self.device = torch.device(resolve_device(device))  # auto: the process's device (pacs.metric.common.device)
        if backbone.device != self.device:
            backbone.model.to(self.device)
        self.w = float(w) if w is not None else default_w(_FAMILY_METRIC.get(backbone.family, "clip-s"), backbone)
        self.batch_size = int(batch_size)
        self.prompt = prompt
        self.progress = progress
        self.warn_empty = warn_empty
        self.dtype = check_dtype(dtype)
        check_precision(self.dtype, self.device, "dtype")  # e.g. bf16 on a GPU without bfloat16: one line
        if cast_weights:  # a model only this scorer runs: its Linear / conv weights in the low dtype, once
            cast_frozen_weights(backbone.model, self.dtype)
        _check_weights_dtype(backbone, self.dtype)
        self.score_kind = check_score_kind(score)
        self.long_captions = check_long_captions(long_captions)
        self.workers = resolve_workers(workers)
        self.decode, self._decoder = _decoder(decode, backbone, self.device)
        if self.score_kind == "sigmoid":
            calibration(backbone)  # refused here, once, for a model without a logit bias
        self._pixel_shape: tuple[int, ...] | None = None
        fingerprint = dtype_fingerprint(backbone.fingerprint, self.dtype)
        label = backbone.name if self.dtype == "fp32" else f"{backbone.name} ({self.dtype})"
        if self.decode == "gpu":  # other pixels, other embeddings: never mixed with the exact path's
            fingerprint, label = f"{fingerprint}|decode=gpu", f"{label} (decode gpu)"
        self.disk_cache = EmbeddingCache(cache_dir, fingerprint, label) if cache_dir is not None else None
        self._image_cache: dict[str, torch.Tensor] = {}
        self._text_cache: OrderedDict[str, tuple[torch.Tensor, bool]] = OrderedDict()
        self._text_cache_size = int(text_cache_size)
        self._prefix_cache: dict[tuple[int, ...], list] = {}
        self._pool: decode_pool.DecodePool | None = None
        self._expected_images = 0  # images a caller will embed over many calls (`expect_images`)
        self.images_encoded = 0
        self.texts_encoded = 0
        self.truncated_captions: set[str] = set()  # distinct candidates truncated so far (for run summaries)

    def _precision(self) -> contextlib.AbstractContextManager:
        return precision_context(self.device, self.dtype)

    def cache_state(self) -> dict[str, Any]:
        """The in-memory image and text embeddings (texts in LRU order): what a resumed run restores so that it
        encodes the same texts in the same batches as the run it continues (the floats depend on the batches)."""
        texts = list(self._text_cache)
        return {"image_keys": list(self._image_cache),
                "image_embeddings": _stack_or_empty(list(self._image_cache.values())),
                "texts": texts, "text_embeddings": _stack_or_empty([self._text_cache[t][0] for t in texts]),
                "text_truncated": torch.tensor([bool(self._text_cache[t][1]) for t in texts], dtype=torch.bool)}

    def load_cache_state(self, state: dict[str, Any]) -> None:
        """Replace the in-memory image and text embeddings by `cache_state()`'s (the prompt prefix is recomputed)."""
        self._image_cache = dict(zip(state["image_keys"], state["image_embeddings"]))
        self._text_cache = OrderedDict((text, (embedding, bool(cut))) for text, embedding, cut in
                                       zip(state["texts"], state["text_embeddings"], state["text_truncated"].tolist()))

    def clear_caches(self) -> None:
        """Forget every in-memory embedding (images, texts, prompt prefix); the disk cache is keyed by weights."""
        self._image_cache.clear()
        self._text_cache.clear()
        self._prefix_cache.clear()

    def clear_text_cache(self) -> None:
        """Forget the cached text embeddings only (the next texts are embedded in fresh batches)."""
        self._text_cache.clear()

    # ------------------------------------------------------------------ images
    @staticmethod
    def image_key(image: Any) -> str:
        """The identity of an image: `path:<realpath>|<size>|<mtime_ns>`, `pil:<sha256>`, `tensor:<sha256>`."""
        return image_sources.image_key(image)

    def _expected_pixel_shape(self) -> tuple[int, ...]:
        if self._pixel_shape is None:  # what the backbone's own preprocessing produces
            self._pixel_shape = tuple(self.backbone.preprocess(Image.new("RGB", (8, 8))).shape)
        return self._pixel_shape

    def _load_pixels(self, image: Any) -> torch.Tensor:
        if self._decoder is not None and isinstance(image, (str, os.PathLike)):
            return self._decoder(image)
        return image_sources.load_pixels(image, self.backbone.preprocess, self._expected_pixel_shape)

    def _load_pixels_for(self, key: str, image: Any, names: dict[str, str]) -> torch.Tensor:
        try:
            return self._load_pixels(image)
        except InputError as error:
            self._raise_labelled(key, image, names, error)

    @staticmethod
    def _raise_labelled(key: str, image: Any, names: dict[str, str], error: BaseException) -> NoReturn:
        """Raise an image's decoding error, naming its ids where the message does not already."""
        if not isinstance(error, InputError):
            raise error
        name = names.get(key, key)
        if isinstance(image, (Image.Image, torch.Tensor)) or name == str(image):
            if key in names:
                raise InputError(f"image id {name}: {error}") from None
            raise error
        raise InputError(f"image id {name}: {error}") from None

    @torch.no_grad()
    def embed_images(self, images: Sequence[Any], keys: Sequence[str] | None = None,
                     names: Sequence[str] | None = None) -> torch.Tensor:
        """L2-normalised image embeddings `[N, E]` (CPU, fp32); each distinct image is encoded at most once.

        Images are cached by what they are (`image_key`: resolved path + size + mtime, or pixel hash), so
        equal ids of different data sets never share an embedding. `names` (e.g. image ids) only label the
        images in error messages; `keys` is accepted for compatibility and used as `names` when none are given
        — it no longer decides the cache entry.
        """
        return self._encode_images(self._plan_images(images, keys, names))

    def _plan_images(self, images: Sequence[Any], keys: Sequence[str] | None,
                     names: Sequence[str] | None) -> _ImagePlan:
        """Key the images, take what the caches hold and start decoding the rest (in the pool: already running)."""
        images = list(images)
        if keys is not None:
            keys = [str(k) for k in keys]
            if len(keys) != len(images):
                raise InputError(f"{len(images)} images but {len(keys)} keys")
            names = keys if names is None else names
        keys = image_sources.image_keys(images)  # each repeated path / object keyed once
        named: dict[str, list[str]] = {}
        for key, name in zip(keys, names or ()):
            if name not in named.setdefault(key, []):
                named[key].append(name)
        labels = {key: ", ".join(map(repr, values)) for key, values in named.items()}
        todo: dict[str, Any] = {}
        for key, image in zip(keys, images):
            if key not in self._image_cache and key not in todo:
                todo[key] = image
        file_hashes: dict[str, str] = {}
        if self.disk_cache is not None and todo:
            for key in list(todo):
                image = todo[key]
                if isinstance(image, (Image.Image, torch.Tensor)):
                    continue
                if not Path(image).is_file():
                    raise InputError(f"image file not found: {image}")
                file_hashes[key] = self.disk_cache.file_hash(image)
                cached = self.disk_cache.get(file_hashes[key])
                if cached is not None and np.isfinite(cached).all():  # a non-finite entry is re-encoded
                    self._image_cache[key] = torch.from_numpy(cached)
                    del todo[key]
        pending = list(todo.items())
        return _ImagePlan(keys, labels, pending, file_hashes, self._pixel_batches(pending, labels))

    def _pixel_batches(self, pending: list[tuple[str, Any]], labels: dict[str, str]) -> Iterator[torch.Tensor]:
        """The pixels of `pending`, batch by batch on the CPU: from the decoding processes for a large input (their
        first batches already submitted, `decode_pool.prefetch_batches` of them), else from threads of this
        process, in order, two batches ahead."""
        if self._decoder is None and pending and \
                decode_pool.use_pool(max(len(pending), self._expected_images), self.workers):
            pool = self._decode_pool()
            ahead = decode_pool.prefetch_batches(self.batch_size, pool.shape)  # on through the text phase
            batches = pool.batches([image for _, image in pending], self.batch_size, ahead=ahead)

            def relabelled() -> Iterator[torch.Tensor]:
                try:
                    yield from batches
                except decode_pool.BatchError as failure:
                    key, image = pending[failure.index]
                    self._raise_labelled(key, image, labels, failure.error)
            return relabelled()
        loaded = ordered_map(lambda item: self._load_pixels_for(item[0], item[1], labels), pending, self.workers,
                             ahead=2 * self.batch_size)

        def stacked() -> Iterator[torch.Tensor]:
            try:
                for start in range(0, len(pending), self.batch_size):
                    items = [next(loaded) for _ in pending[start:start + self.batch_size]]
                    yield torch.stack(items) if self._decoder is None else torch.stack([item.to(self.device)
                                                                                        for item in items])
            finally:
                loaded.close()
        return stacked()

    def expect_images(self, n_images: int) -> None:
        """Say that `n_images` images will be embedded over many small calls (e.g. a reward's image cache over an
        SCST run, a batch's images per step): from `decode_pool.MIN_IMAGES` on, every call then decodes in the
        scorer's processes, whose start-up is paid once for them all. The pixels are the same either way."""
        self._expected_images = max(self._expected_images, int(n_images))

    def _decode_pool(self) -> decode_pool.DecodePool:
        """The scorer's decoding processes, started at the first large input and kept for the next calls."""
        if self._pool is None:
            # the function holds the preprocessing and the fixed shape, not the scorer (the pool would keep it alive)
            shape = self._expected_pixel_shape()
            function = functools.partial(image_sources.load_pixels, preprocess=self.backbone.preprocess,
                                         expected_shape=functools.partial(tuple, shape))
            self._pool = decode_pool.DecodePool(function, self.workers, shape)
        return self._pool

    def close(self) -> None:
        """Stop the decoding processes, if any were started (they also stop when the scorer is collected)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _to_device(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda" and not pixels.is_cuda:  # pinned: the copy overlaps the host's next work
            return pixels.pin_memory().to(self.device, non_blocking=True)
        return pixels.to(self.device)

    @torch.no_grad()
    def _encode_images(self, plan: _ImagePlan) -> torch.Tensor:
        """Run the towers on the planned batches as they are decoded; the embeddings of every key, in order."""
        pending, labels, file_hashes = plan.pending, plan.labels, plan.file_hashes
        batches = range(0, len(pending), self.batch_size)
        try:
            for start in tqdm(batches, desc="images", unit="batch", leave=False,
                              disable=not self.progress or len(batches) < 2):
                chunk = pending[start:start + self.batch_size]
                pixels = self._to_device(next(plan.pixels))
                with self._precision():
                    raw = self.backbone.encode_image(pixels)
                embeddings = torch.nn.functional.normalize(raw.float(), dim=-1).cpu()
                check_embeddings(embeddings, lambda i, chunk=chunk: image_label(*chunk[i], labels), self.backbone)
                self.images_encoded += len(chunk)
                for (key, _), embedding in zip(chunk, embeddings):
                    self._image_cache[key] = embedding.clone()
                    if key in file_hashes:
                        self.disk_cache.put(file_hashes[key], embedding.numpy())
        finally:
            plan.pixels.close()
        if not plan.keys:
            return torch.zeros(0, 0)
        return torch.stack([self._image_cache[key] for key in plan.keys])

    # ------------------------------------------------------------------ texts
    def _text_batches(self, lengths: list[int]) -> list[list[int]]:
        """Indices sorted by token length, in chunks of batch_size: each chunk is padded only to its own longest."""
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        return [order[start:start + self.batch_size] for start in range(0, len(order), self.batch_size)]

    def _prefix(self, ids: list[list[int]]) -> tuple[int, list | None]:
        length = common_prefix_length(ids)
        if length == 0:
            return 0, None
        key = tuple(ids[0][:length])
        if key not in self._prefix_cache:
            with self._precision():
                self._prefix_cache[key] = prefix_states(self.backbone.model, key)
        return length, self._prefix_cache[key]

    @torch.no_grad()
    def _embed_text_batch(self, texts: list[str]) -> tuple[torch.Tensor, list[bool]]:
        tokenized = self.backbone.tokenize_batch(texts)
        if not self.backbone.supports_trimmed_text:  # fixed-length fallback (e.g. non-CLIP tokenizers)
            batches = [list(range(i, min(i + self.batch_size, len(texts))))
                       for i in range(0, len(texts), self.batch_size)]
            prefix_length, prefix_kv = 0, None
        else:
            batches = self._text_batches(tokenized.lengths())
            prefix_length, prefix_kv = self._prefix(tokenized.ids)
        output: list[torch.Tensor | None] = [None] * len(texts)
        for index in tqdm(batches, desc="texts", unit="batch", leave=False,
                          disable=not self.progress or len(batches) < 2):
            ids = [tokenized.ids[i] for i in index]
            length = max(len(sequence) for sequence in ids)
            tokens = _pad(ids, length).to(self.device)
            with self._precision():
                raw = self.backbone.encode_text(tokens, prefix_length, prefix_kv)
            embeddings = torch.nn.functional.normalize(raw.float(), dim=-1).cpu()
            for i, embedding in zip(index, embeddings):
                output[i] = embedding
        self.texts_encoded += len(texts)
        return torch.stack(output), tokenized.truncated  # type: ignore[arg-type]

    def embed_texts_detailed(self, texts: Sequence[str], prompt: bool = True,
                             long_captions: str | None = None) -> TextEmbeddings:
        """Like `embed_texts`, also reporting which texts were truncated (and into how many pieces each was cut).

        `long_captions` (None: the scorer's) is "truncate" or "chunk" (`pacs.metric.scoring.long_captions`).
        """
        texts = list(texts)
        _check_texts(texts, "text")
        if check_long_captions(long_captions or self.long_captions) == "chunk":
            return self._embed_chunked(texts, prompt)
        return self._embed_full([(self.prompt + text) if prompt else text for text in texts], prompt)

    def _fits(self, texts: list[str]) -> list[bool]:
        """Whether each (already prompted) text fits the context: cached texts know it, others are tokenized."""
        unknown = list(dict.fromkeys(text for text in texts if text not in self._text_cache))
        truncated = dict(zip(unknown, self.backbone.tokenize_batch(unknown).truncated)) if unknown else {}
        return [not (self._text_cache[text][1] if text in self._text_cache else truncated[text]) for text in texts]

    def _embed_chunked(self, texts: list[str], prompt: bool) -> TextEmbeddings:
        """`long_captions="chunk"`: texts that fit are embedded as they are, longer ones as sentence pieces."""
        prefix = self.prompt if prompt else ""
        fits = self._fits([prefix + text for text in texts])
        pieces = [[text] if fit else pack_pieces(text, lambda piece: self._fits([piece])[0], prefix)
                  for text, fit in zip(texts, fits)]
        flat = [prefix + piece for group in pieces for piece in group]
        embedded = self._embed_full(flat, prompt) if flat else TextEmbeddings(torch.zeros(0, 0), [])
        rows, truncated, start = [], [], 0
        for group in pieces:
            block = embedded.embeddings[start:start + len(group)]
            rows.append(block[0] if len(group) == 1 else mean_of_normalised(block))
            truncated.append(any(embedded.truncated[start:start + len(group)]))
            start += len(group)
        if not rows:
            return TextEmbeddings(torch.zeros(0, 0), [], [])
        return TextEmbeddings(torch.stack(rows), truncated, [len(group) for group in pieces])

    def _embed_full(self, full: list[str], prompt: bool) -> TextEmbeddings:
        """Embeddings of the exact (already prompted) texts, truncated to the context where longer (cached)."""
        missing = list(dict.fromkeys(text for text in full if text not in self._text_cache))
        if missing:
            embeddings, truncated = self._embed_text_batch(missing)
            cut = len(self.prompt) if prompt else 0
            check_embeddings(embeddings, lambda i: f"caption {missing[i][cut:]!r}", self.backbone)
            for text, embedding, cut in zip(missing, embeddings, truncated):
                self._text_cache[text] = (embedding, cut)
        results = []
        for text in full:
            self._text_cache.move_to_end(text)
            results.append(self._text_cache[text])
        while len(self._text_cache) > self._text_cache_size:
            self._text_cache.popitem(last=False)
        if not results:
            return TextEmbeddings(torch.zeros(0, 0), [], [])
        return TextEmbeddings(torch.stack([r[0] for r in results]), [r[1] for r in results], [1] * len(results))

    def embed_texts(self, texts: Sequence[str], prompt: bool = True) -> torch.Tensor:
        """L2-normalised text embeddings `[N, E]` of `prompt + text`, encoded at each batch's longest length."""
        return self.embed_texts_detailed(texts, prompt=prompt).embeddings

    # ------------------------------------------------------------------ scores
    def score_embeddings(self, image_embs: torch.Tensor, candidates: Sequence[str],
                         references: Sequence[Sequence[str]] | None = None, w: float | None = None,
                         score: str | None = None, long_captions: str | None = None) -> ScoreResult:
        """Score candidates against precomputed image embeddings `[N, E]` (and references, one list each).

        `score` and `long_captions` (None: the scorer's own) choose the convention and the long-caption mode;
        references follow the same long-caption mode as the candidates.
        """
        candidates = list(candidates)
        _check_texts(candidates, "candidate")
        w = self.w if w is None else float(w)
        kind = check_score_kind(score or self.score_kind)
        mode = check_long_captions(long_captions or self.long_captions)
        mapping = calibration(self.backbone) if kind == "sigmoid" else None
        image_embs = torch.as_tensor(image_embs).float().cpu()
        if image_embs.shape[0] != len(candidates):
            raise InputError(f"{image_embs.shape[0]} image embeddings but {len(candidates)} candidates")
        check_embeddings(image_embs, lambda i: f"the image of candidate #{i} {candidates[i]!r}", self.backbone)
        image_embs = torch.nn.functional.normalize(image_embs, dim=-1) if len(candidates) else image_embs
        text = self.embed_texts_detailed(candidates, long_captions=mode)
        n_empty = sum(is_empty_caption(c) for c in candidates)
        if not candidates:
            empty = np.zeros(0, dtype=np.float32)
            return ScoreResult(empty, empty, None if references is None else empty, empty, 0, 0, w,
                               score_kind=kind, long_captions=mode)
        cosines = (image_embs * text.embeddings).sum(-1)
        if mapping is None:
            clip = clip_score(image_embs, text.embeddings, w).numpy().astype(np.float32)
        else:
            clip = mapping.apply(cosines).numpy().astype(np.float32)
        ref_terms = None
        n_trunc_refs = 0
        scores = clip
        if references is not None:
            references = [list(refs) for refs in references]
            if len(references) != len(candidates):
                raise InputError(f"{len(candidates)} candidates but {len(references)} reference lists")
            for index, refs in enumerate(references):
                if not refs:
                    raise InputError(f"candidate #{index} has no references")
                _check_texts(refs, f"reference of candidate #{index}:")
            flat = list(dict.fromkeys(ref for refs in references for ref in refs))
            ref_text = self.embed_texts_detailed(flat, long_captions=mode)
            n_trunc_refs = ref_text.n_truncated
            position = {ref: i for i, ref in enumerate(flat)}
            terms = []
            for index, refs in enumerate(references):
                rows = ref_text.embeddings[[position[ref] for ref in refs]]
                terms.append((rows @ text.embeddings[index]).max())
            ref_terms = torch.stack(terms).numpy().astype(np.float32)
            if mapping is not None:  # sigmoid is increasing: the max of the sigmoids is the sigmoid of the max
                ref_terms = mapping.apply(ref_terms)
            scores = ref_score(clip, ref_terms)
        check_scores(np.asarray(scores), candidates, w, self.backbone)
        self.truncated_captions.update(c for c, cut in zip(candidates, text.truncated) if cut)
        if n_empty and self.warn_empty:
            logger.warning("%d empty caption(s) scored as the prompt %r alone", n_empty, self.prompt)
        return ScoreResult(scores=np.asarray(scores, dtype=np.float32), clip_scores=clip, ref_terms=ref_terms,
                           cosines=cosines.numpy().astype(np.float32), n_truncated=text.n_truncated,
                           n_empty=n_empty, w=w, n_truncated_references=n_trunc_refs,
                           truncated=[bool(cut) for cut in text.truncated], score_kind=kind, long_captions=mode,
                           n_chunked=text.n_chunked)

    def score(self, images: Sequence[Any], candidates: Sequence[str],
              references: Sequence[Sequence[str]] | None = None, w: float | None = None,
              keys: Sequence[str] | None = None, names: Sequence[str] | None = None,
              score: str | None = None, long_captions: str | None = None) -> ScoreResult:
        """Score candidate i against image i (paths, PIL images or tensors; repeated images are encoded once).

        `names`/`keys` only label images in error messages (see `embed_images`); `score` and `long_captions`
        as in `score_embeddings`.
        """
        images = list(images)
        if len(images) != len(candidates):
            raise InputError(f"{len(images)} images but {len(candidates)} candidates")
        _check_texts(list(candidates), "candidate")
        plan = self._plan_images(images, keys, names)
        if len(plan.pending) >= decode_pool.MIN_IMAGES:  # the towers embed the texts while the images decode
            try:
                self._embed_texts_early(list(candidates), references, long_captions)
            except BaseException:
                plan.pixels.close()
                raise
        image_embs = self._encode_images(plan)
        return self.score_embeddings(image_embs, candidates, references, w, score=score,
                                     long_captions=long_captions)

    def _embed_texts_early(self, candidates: list[str], references: Sequence[Sequence[str]] | None,
                           long_captions: str | None) -> None:
        """Fill the text cache with what `score_embeddings` will ask for, in the same calls and order (so the same
        batches and floats); references that `score_embeddings` would refuse are left to refuse there."""
        mode = check_long_captions(long_captions or self.long_captions)
        texts = [candidates]
        if references is not None:
            refs = [list(r) for r in references]
            if len(refs) == len(candidates) and all(r and all(isinstance(t, str) for t in r) for r in refs):
                texts.append(list(dict.fromkeys(ref for r in refs for ref in r)))
        if 2 * sum(len(set(group)) for group in texts) > self._text_cache_size:
            return  # a cache that would evict some of them: embedded once, where they are used
        for group in texts:
            self.embed_texts_detailed(group, long_captions=mode)


def _decoder(decode: str, backbone: Backbone, device: torch.device) -> tuple[str, Any]:
    """(`decode`, the GPU decoder or None): `gpu` is refused in one line without CUDA."""

    if check_decode(decode, device, "decode") == "gpu":
        return decode, TensorDecoder(backbone.preprocess, device)
    return decode, None


def _pad(ids: Sequence[Sequence[int]], length: int) -> torch.Tensor:
    tokens = torch.zeros(len(ids), length, dtype=torch.long)
    for row, sequence in enumerate(ids):
        tokens[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
    return tokens


def _check_weights_dtype(backbone: Backbone, dtype: str) -> None:
    """InputError when the model's Linear / conv weights are in a low dtype other than the scorer's (e.g. a model
    another bf16 scorer cast, scored in fp32): its matmuls would fail or change precision silently."""
    found = weights_dtype(backbone.model)
    if found is not None and found != torch.float32 and found != DTYPES[dtype]:
        name = next((key for key, value in DTYPES.items() if value == found), str(found))
        raise InputError(f"{backbone.name}: its weights are {name} (a {name} scorer cast them once); score it with "
                         f"dtype={name!r}, or load the model again for dtype={dtype!r}")
