"""The parallel input pipeline: images decoded and preprocessed by worker threads give the serial path's pixels.

Bit-equality (torch.equal) is the right check here: every image goes through the same deterministic PIL decode
and resize and the same torchvision tensor code whichever thread runs it, and the model then sees the same batches
in the same order, so not a single float may differ. Errors keep their one line naming the file, and the first
failing image in input order is the one reported.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from image_files import decompression_bomb

from pacs.metric.common.errors import InputError
from pacs.metric.common.parallel import available_cores, ordered_map, resolve_workers
from pacs.metric.models.preprocess import ImagePreprocess, open_image
from pacs.metric.scoring.scorer import Scorer


@pytest.fixture(scope="module")
def flickr_images(shared_data: Path) -> list[Path]:
    """The first 48 shared Flickr8k JPEGs (sorted by name), real photos of varied sizes."""
    folder = shared_data / "flickr8k" / "images"
    paths = sorted(folder.glob("*.jpg"))[:48]
    if len(paths) < 48:
        pytest.skip(f"the Flickr8k images are not under {folder}")
    return paths


def test_worker_threads_give_the_serial_pixels_bit_for_bit(flickr_images):
    preprocess = ImagePreprocess(size=224)  # the CLIP ViT-B/32 preprocessing (bicubic, shorter side, crop)
    serial = [preprocess(open_image(path)) for path in flickr_images]  # today's single-thread preprocessing
    for workers in (2, 4):
        parallel = list(ordered_map(lambda path: preprocess(open_image(path)), flickr_images, workers, ahead=8))
        assert len(parallel) == len(serial)
        assert all(torch.equal(a, b) for a, b in zip(parallel, serial))


def test_scorer_embeddings_do_not_depend_on_the_workers(flickr_images, tiny_backbone):
    paths = [str(p) for p in flickr_images[:20]]
    one = Scorer(tiny_backbone, batch_size=8, progress=False, workers=0).embed_images(paths)
    for workers in (2, "auto"):
        scorer = Scorer(tiny_backbone, batch_size=8, progress=False, workers=workers)
        assert torch.equal(scorer.embed_images(paths), one)  # same pixels, same batches: the same floats
    assert Scorer(tiny_backbone, progress=False, workers="auto").workers == resolve_workers("auto")


def test_the_first_bad_image_in_order_is_reported_in_one_line(tmp_path, tiny_backbone, flickr_images):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")
    bomb = decompression_bomb(tmp_path / "bomb.png")
    paths = [str(flickr_images[0]), str(broken), str(flickr_images[1]), str(bomb)]
    messages = {}
    for workers in (0, 4):
        scorer = Scorer(tiny_backbone, batch_size=2, progress=False, workers=workers)
        with pytest.raises(InputError) as error:
            scorer.embed_images(paths, names=["a", "b", "c", "d"])
        with pytest.raises(InputError, match="could be decompression bomb DOS attack") as bomb_error:
            scorer.embed_images([str(flickr_images[0]), str(bomb)], names=["a", "d"])
        messages[workers] = (str(error.value), str(bomb_error.value))
    assert messages[4] == messages[0]  # the serial path's messages, word for word
    broken_message, bomb_message = messages[4]
    assert broken_message.startswith(f"image id 'b': cannot read image {broken}: ") and "\n" not in broken_message
    assert bomb_message.startswith(f"image id 'd': cannot read image {bomb}: Image size (900000000 pixels)")


def test_ordered_map_keeps_the_order_and_stops_early():
    import threading
    import time

    seen: list[int] = []
    lock = threading.Lock()

    def slow_square(value: int) -> int:
        time.sleep(0.002 * (value % 3))  # later items finish first
        with lock:
            seen.append(value)
        return value * value

    assert list(ordered_map(slow_square, range(40), workers=3, ahead=6)) == [v * v for v in range(40)]
    seen.clear()
    results = ordered_map(slow_square, range(1000), workers=2, ahead=4)
    assert [next(results) for _ in range(3)] == [0, 1, 4]
    results.close()
    assert len(seen) < 20  # only the items ahead were started, not the whole list


@pytest.mark.parametrize("value, expected", [("auto", None), (None, None), (0, 0), ("3", 3), (1, 1)])
def test_resolve_workers(value, expected, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert resolve_workers(value) == (available_cores() if expected is None else expected)


def test_auto_shares_the_cores_between_the_processes_of_a_launch(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert resolve_workers("auto") == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert resolve_workers("auto") == 1


@pytest.mark.parametrize("value", [-1, "many", 2.5, True, 10_000])
def test_resolve_workers_refuses_bad_values(value):
    with pytest.raises(InputError, match="workers="):
        resolve_workers(value)


def test_decode_gpu_is_refused_in_one_line_without_cuda(tiny_backbone, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match="decode gpu needs a CUDA GPU") as error:
        Scorer(tiny_backbone, progress=False, decode="gpu")
    assert "\n" not in str(error.value) and "decode cpu" in str(error.value)
    with pytest.raises(InputError, match="choose one of cpu, gpu"):
        Scorer(tiny_backbone, progress=False, decode="nvjpeg")


def test_tensor_decoder_follows_the_exact_geometry(flickr_images):
    """The GPU path's algorithm, run on the CPU: same shape, pixels within a few 8-bit steps of PIL's."""
    from pacs.metric.models.tensor_decode import TensorDecoder

    preprocess = ImagePreprocess(size=224)
    decoder = TensorDecoder(preprocess, "cpu")
    std = torch.tensor(preprocess.std).view(3, 1, 1)
    for path in flickr_images[:6]:
        exact, tensor = preprocess(open_image(path)), decoder(path)
        assert tensor.shape == exact.shape == (3, 224, 224)
        steps = ((tensor - exact) * std * 255).abs()  # in 8-bit steps
        assert steps.mean() < 2.0 and steps.max() < 64  # decoder + filter rounding, not another geometry


def test_score_refuses_decode_gpu_and_bad_workers_before_loading_a_model(tmp_path, capsys, monkeypatch):
    import json

    from pacs import cli as pacs_cli
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (tmp_path / "c.json").write_text(json.dumps({"a": "a dog"}))
    from PIL import Image

    Image.new("RGB", (16, 16), "red").save(tmp_path / "a.png")
    common = ["score", "--metric", "clip-s", "--backbone", "no-such-model", "--images", str(tmp_path),
              "--candidates", str(tmp_path / "c.json")]  # the backbone would fail if it were loaded
    assert pacs_cli.main([*common, "--decode", "gpu"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--decode gpu needs a CUDA GPU" in lines[0]
    with pytest.raises(SystemExit) as stop:
        pacs_cli.main([*common, "--workers", "lots"])
    assert stop.value.code == 2 and "--workers='lots': give auto or a number" in capsys.readouterr().err
