"""Captioning and per-image contrastive scoring of a test set split over the processes, identical to one process.

The test images are cut into chunks of `batch_size` in their original order; process `p` of `N` takes chunks
`p, p + N, p + 2N, ...`, beam-searches each chunk and scores it with the contrastive scorers (one scorer call
per chunk, the scorers' text caches cleared first, so every chunk is computed exactly as on one process). The
chunks are gathered on every process (`accelerate.utils.gather_object`) and put back in the original order;
corpus metrics (BLEU, METEOR, CIDEr-D, SPICE) are then computed once, on the main process, over all captions.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pacs.metric.common.progress import progress as progress_bar

logger = logging.getLogger(__name__)


@dataclass
class CaptionedSet:
    """Captions (original order) and per-image contrastive scores (float32 arrays in the same order)."""

    captions: dict[str, str]
    contrastive: dict[str, np.ndarray]


def chunk_indices(n_items: int, batch_size: int, process_index: int, num_processes: int) -> list[int]:
    """Indices of the `batch_size` chunks that process `process_index` of `num_processes` handles (round robin)."""
    n_chunks = (n_items + batch_size - 1) // batch_size
    return list(range(process_index, n_chunks, num_processes))


def caption_and_score(model: Any, vocab: Any, features: Any, image_ids: Sequence[str],
                      image_paths: Mapping[str, Any], references: Mapping[str, Sequence[str]],
                      scorers: Mapping[str, Any] | None, beam_size: int = 5, batch_size: int = 50,
                      device: Any = "cpu", state: Any = None, progress: bool = True) -> CaptionedSet:
    """Caption `image_ids` and score the captions, split over the processes of `state` (None: one process).

    Every process returns the same, complete result.
    """
    from pacs.captioner.modeling.train_xe import generate_captions
    from pacs.captioner.orchestration.evaluation import contrastive_per_image

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ids = list(image_ids)
    rank, world = (state.process_index, state.num_processes) if state is not None else (0, 1)
    local: list[tuple[int, list[str], list[str], dict[str, list[float]]]] = []
    mine = chunk_indices(len(ids), batch_size, rank, world)
    for index in progress_bar(mine, desc=f"captioning (process {rank}/{world})", disable=not progress or rank != 0):
        chunk = ids[index * batch_size:(index + 1) * batch_size]
        captions = generate_captions(model, vocab, features, chunk, beam_size, batch_size, device)
        scores: dict[str, np.ndarray] = {}
        if scorers:
            for scorer in scorers.values():
                scorer.clear_text_cache()  # a chunk's texts are embedded in the same batches on any process count
            scores = contrastive_per_image(captions, references, image_paths, scorers)
        local.append((index, chunk, [captions[i] for i in chunk],
                      {column: values.tolist() for column, values in scores.items()}))
    gathered = local
    if world > 1:
        from accelerate.utils import gather_object

        gathered = gather_object(local)
    gathered = sorted(gathered, key=lambda entry: entry[0])
    if [entry[0] for entry in gathered] != list(range((len(ids) + batch_size - 1) // batch_size)):
        raise RuntimeError(f"gathered chunks {[entry[0] for entry in gathered]} do not cover the test set")
    captions = {image_id: caption for _, chunk, texts, _ in gathered for image_id, caption in zip(chunk, texts)}
    columns = list(gathered[0][3]) if gathered else []
    contrastive = {column: np.asarray([value for entry in gathered for value in entry[3][column]], dtype=np.float32)
                   for column in columns}
    return CaptionedSet(captions, contrastive)
