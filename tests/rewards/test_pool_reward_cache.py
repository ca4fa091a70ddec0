"""The reward's image cache decodes in the scorer's worker processes (issue 43 item 1), bit for bit as in-process."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from pacs.metric.scoring import decode_pool
from pacs.metric.scoring.scorer import Scorer
from pacs.rewards import build_reward

pytestmark = pytest.mark.skipif(not decode_pool.fork_available(), reason="decoding processes need fork")


@pytest.fixture(scope="module")
def image_paths(tmp_path_factory):
    """MIN_IMAGES + 6 small JPEGs of random pixels, by image id."""
    folder = tmp_path_factory.mktemp("reward_images")
    rng = np.random.default_rng(0)
    paths = {}
    for index in range(decode_pool.MIN_IMAGES + 6):
        path = folder / f"{index}.jpg"
        Image.fromarray(rng.integers(0, 256, size=(40 + index % 7, 50, 3), dtype=np.uint8)).save(path)
        paths[str(index)] = path
    return paths


def _run(backbone, image_paths, workers: int) -> tuple[list[torch.Tensor], torch.Tensor, Scorer]:
    """The rewards of SCST-like steps (10 images x 2 captions each, fewer than MIN_IMAGES per call)."""
    scorer = Scorer(backbone, progress=False, workers=workers, batch_size=4)
    reward = build_reward("clip-s", scorer=scorer, image_paths=image_paths)
    ids = list(image_paths)
    values = []
    for start in range(0, len(ids), 10):
        step = ids[start:start + 10]
        values.append(reward(step, [["a photo", f"image {i}"] for i in step], [["x"]] * len(step)))
    return values, reward.fn.images.state_dict()["embeddings"], scorer


def test_the_reward_cache_decodes_in_processes_with_the_serial_results(tiny_backbone, image_paths):
    serial, serial_images, serial_scorer = _run(tiny_backbone, image_paths, workers=0)
    pooled, pooled_images, pooled_scorer = _run(tiny_backbone, image_paths, workers=2)
    assert serial_scorer._pool is None and pooled_scorer._pool is not None  # every step went to the processes
    assert torch.equal(pooled_images, serial_images)
    assert all(torch.equal(a, b) for a, b in zip(pooled, serial))
    pooled_scorer.close()


def test_a_context_of_few_images_stays_in_process(tiny_backbone, image_paths):
    few = dict(list(image_paths.items())[:decode_pool.MIN_IMAGES - 1])
    _, _, scorer = _run(tiny_backbone, few, workers=2)
    assert scorer._pool is None
