"""Decoding in worker processes (issue 43 item 1): the serial path's pixels bit for bit, in order, same errors.

Bit-equality (torch.equal) is the right check: each image goes through the same deterministic PIL decode and
resize and the same torchvision tensor code in whichever process runs it, and the model then sees the same
batches in the same order, so not one float may differ. `MIN_IMAGES` is lowered so that small inputs take the
pool (the default keeps inputs of a few images in the process).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from image_files import decompression_bomb

from pacs.metric.common.errors import InputError
from pacs.metric.models.preprocess import ImagePreprocess, open_image
from pacs.metric.scoring import decode_pool
from pacs.metric.scoring.scorer import Scorer

pytestmark = pytest.mark.skipif(not decode_pool.fork_available(), reason="no fork here: decoding stays in threads")


@pytest.fixture(scope="module")
def flickr_images(shared_data: Path) -> list[Path]:
    """The first 40 shared Flickr8k JPEGs (sorted by name), real photos of varied sizes."""
    paths = sorted((shared_data / "flickr8k" / "images").glob("*.jpg"))[:40]
    if len(paths) < 40:
        pytest.skip("the Flickr8k images are not in the shared data")
    return paths


@pytest.fixture
def pool_for_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode_pool, "MIN_IMAGES", 1)


def _preprocess_path(path: Path) -> torch.Tensor:
    return ImagePreprocess(size=224)(open_image(path))


def test_the_processes_give_the_serial_pixels_bit_for_bit_in_order(flickr_images):
    serial = [_preprocess_path(path) for path in flickr_images]
    pool = decode_pool.DecodePool(_preprocess_path, 2, (3, 224, 224))
    try:
        batches = list(pool.batches(flickr_images, batch_size=16, ahead=2))
    finally:
        pool.close()
    assert [len(batch) for batch in batches] == [16, 16, 8]
    assert batches[0].is_shared()  # written by the workers into shared memory, not copied back
    assert all(torch.equal(a, b) for a, b in zip(torch.cat(batches), serial))


def test_the_scorer_gives_the_same_floats_with_its_processes(flickr_images, tiny_backbone, pool_for_all):
    paths = [str(p) for p in flickr_images[:20] for _ in range(2)]  # each image twice: encoded once
    captions = [f"a photo number {i}" for i in range(len(paths))]
    references = [[f"reference {i}", "a photo"] for i in range(len(paths))]
    serial = Scorer(tiny_backbone, batch_size=8, progress=False, workers=0)
    expected = serial.score(paths, captions, references)
    pooled = Scorer(tiny_backbone, batch_size=8, progress=False, workers=2)
    result = pooled.score(paths, captions, references)
    assert pooled._pool is not None  # the processes did the decoding
    assert torch.equal(torch.from_numpy(result.scores), torch.from_numpy(expected.scores))
    assert torch.equal(pooled.embed_images(paths), serial.embed_images(paths))
    assert pooled.images_encoded == serial.images_encoded == 20
    # the texts embedded while the images decoded: the same texts, in the same cache order, the same floats
    ours, theirs = pooled.cache_state(), serial.cache_state()
    assert ours["texts"] == theirs["texts"] and ours["image_keys"] == theirs["image_keys"]
    assert torch.equal(ours["text_embeddings"], theirs["text_embeddings"])
    pool = pooled._pool
    pooled.clear_caches()
    pooled.embed_images(paths)
    assert pooled._pool is pool  # persistent: started once per scorer
    pooled.close()
    assert pooled._pool is None


def test_the_first_bad_image_in_order_is_reported_as_the_serial_path_does(tmp_path, tiny_backbone, flickr_images,
                                                                           pool_for_all):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")
    bomb = decompression_bomb(tmp_path / "bomb.png")
    good = [str(p) for p in flickr_images[:5]]
    paths = good + [str(broken)] + good[:1] + [str(bomb)]
    names = [f"n{i}" for i in range(len(paths))]
    messages = {}
    for workers in (0, 2):
        scorer = Scorer(tiny_backbone, batch_size=3, progress=False, workers=workers)
        with pytest.raises(InputError) as error:
            scorer.embed_images(paths, names=names)
        with pytest.raises(InputError, match="could be decompression bomb DOS attack") as bomb_error:
            scorer.embed_images([good[0], str(bomb)], names=["a", "d"])
        messages[workers] = (str(error.value), str(bomb_error.value))
        scorer.close()
    assert messages[2] == messages[0]  # the serial path's messages, word for word
    assert messages[2][0].startswith(f"image id 'n5': cannot read image {broken}: ")


def test_ordered_pixels_yields_in_order_up_to_the_failing_item(flickr_images, pool_for_all):
    items = list(flickr_images[:9]) + [Path("/nonexistent/x.jpg")] + list(flickr_images[9:12])
    got = []
    with pytest.raises(InputError, match="/nonexistent/x.jpg"):
        for pixels in decode_pool.ordered_pixels(_preprocess_path, items, 2, lambda: (3, 224, 224), batch_size=4):
            got.append(pixels.clone())
    assert len(got) == 9  # every item before the failing one, none after
    assert all(torch.equal(a, _preprocess_path(path)) for a, path in zip(got, items))


def test_small_inputs_and_one_worker_stay_in_the_process():
    assert not decode_pool.use_pool(decode_pool.MIN_IMAGES - 1, 8)
    assert not decode_pool.use_pool(10_000, 1)
    assert decode_pool.use_pool(decode_pool.MIN_IMAGES, 2)
