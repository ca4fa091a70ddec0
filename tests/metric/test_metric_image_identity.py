"""Images identified by what they are; one image lookup for every command; `pacs caption --ids`."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from pacs.cli import main
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import save_backbone
from pacs.metric.scoring.image_lookup import ImageFinder, coco_image_id, ids_for_files
from pacs.metric.scoring.scorer import Scorer


@pytest.fixture(scope="module")
def flickr(shared_data) -> list[Path]:
    """Three Flickr8k images of the shared data."""
    return sorted((shared_data / "flickr8k" / "images").glob("*.jpg"))[:3]


def _encode_alone(backbone, path: Path) -> torch.Tensor:
    """The embedding of one image by a fresh scorer (no cache shared with anything)."""
    return Scorer(backbone, progress=False).embed_images([str(path)])[0]


def test_a_file_changed_at_the_same_path_is_encoded_again(tiny_backbone, flickr, tmp_path):
    path = tmp_path / "1.jpg"
    shutil.copy(flickr[0], path)
    scorer = Scorer(tiny_backbone, progress=False)
    first = scorer.embed_images([str(path)])[0]
    shutil.copy(flickr[1], path)  # same path, other image (before: the cached embedding of flickr[0] was returned)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    second = scorer.embed_images([str(path)])[0]
    assert torch.equal(first, _encode_alone(tiny_backbone, flickr[0]))
    assert torch.equal(second, _encode_alone(tiny_backbone, flickr[1]))
    assert scorer.images_encoded == 2


def test_disk_cache_rehashes_a_file_changed_at_the_same_path(tiny_backbone, flickr, tmp_path):
    path = tmp_path / "1.jpg"
    shutil.copy(flickr[0], path)
    scorer = Scorer(tiny_backbone, progress=False, cache_dir=tmp_path / "cache")
    scorer.embed_images([str(path)])
    shutil.copy(flickr[1], path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    # before: the file hash was memoised by path, so the first image's disk entry was returned
    assert torch.equal(scorer.embed_images([str(path)])[0], _encode_alone(tiny_backbone, flickr[1]))
    assert len(scorer.disk_cache) == 2


def test_keys_no_longer_decide_the_cache_entry(tiny_backbone, flickr):
    scorer = Scorer(tiny_backbone, progress=False)
    a = scorer.embed_images([str(flickr[0])], keys=["1"])[0]
    b = scorer.embed_images([str(flickr[1])], keys=["1"])[0]  # COCO id 1, then nocaps id 1: other image
    assert torch.equal(a, _encode_alone(tiny_backbone, flickr[0]))
    assert torch.equal(b, _encode_alone(tiny_backbone, flickr[1]))
    same = scorer.embed_images([str(flickr[0].parent / ".." / "images" / flickr[0].name)])[0]
    assert torch.equal(same, a) and scorer.images_encoded == 2  # another spelling of one file: one entry


def test_finder_extensions_in_any_case_map_first_and_ambiguity(tmp_path, flickr):
    shutil.copy(flickr[0], tmp_path / "COCO_val2014_000000391895.JPG")
    shutil.copy(flickr[1], tmp_path / "42.Jpeg")
    shutil.copy(flickr[2], tmp_path / "7.png")
    shutil.copy(flickr[2], tmp_path / "7.jpg")
    other = tmp_path / "elsewhere.jpg"
    shutil.copy(flickr[1], other)
    finder = ImageFinder(tmp_path, {"99": str(other)})
    assert finder.resolve("COCO_val2014_000000391895") == tmp_path / "COCO_val2014_000000391895.JPG"
    assert finder.resolve("42") == tmp_path / "42.Jpeg"
    assert finder.resolve("42.Jpeg") == tmp_path / "42.Jpeg"
    assert finder.resolve(99) == other  # the id→file map, integer ids as their string
    with pytest.raises(InputError, match=r"image id '7' is ambiguous: .*7\.jpg.*7\.png"):
        finder.resolve("7")
    with pytest.raises(InputError, match="no image file for image id '8'"):
        finder.resolve("8")
    assert finder.find("8") is None


def test_coco_ids_and_id_maps(tmp_path, flickr):
    assert coco_image_id("COCO_val2014_000000391895.jpg") == 391895
    assert coco_image_id("COCO_test2015_000000000001.JPG") == 1
    with pytest.raises(InputError, match="391895.jpg: not a COCO file name"):
        coco_image_id("391895.jpg")
    files = [tmp_path / "a.JPG", tmp_path / "b.png"]
    mapping = tmp_path / "ids.json"
    mapping.write_text(json.dumps({"a.JPG": 5, "b.png": "x7"}))
    assert ids_for_files(files, str(mapping)) == {5: files[0], "x7": files[1]}
    mapping.write_text(json.dumps({"a.JPG": 5}))
    with pytest.raises(InputError, match="no id for 1 image.*'b.png'"):
        ids_for_files(files, str(mapping))
    with pytest.raises(InputError, match="two images get the id 'a'"):
        ids_for_files([tmp_path / "a.JPG", tmp_path / "a.png"], "stem")


def test_pacs_score_finds_upper_case_extensions(aligned_backbone, tmp_path, flickr):
    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(flickr[0], images / "1.JPG")  # before: only DIR/<id>.{jpg,jpeg,png} in lower case were tried
    shutil.copy(flickr[1], images / "2.jpg")
    checkpoint = save_backbone(aligned_backbone, tmp_path / "tiny.safetensors")
    candidates = tmp_path / "cands.json"
    candidates.write_text(json.dumps([{"image_id": 1, "caption": "a dog"}, {"image_id": 2, "caption": "a cat"}]))
    out = tmp_path / "out.json"
    assert main(["score", "--metric", "clip-s", "--checkpoint", str(checkpoint), "--images", str(images),
                 "--candidates", str(candidates), "--out", str(out)]) == 0
    scores = [row["score"] for row in json.loads(out.read_text())["per_instance"]]
    expected = Scorer(aligned_backbone, progress=False).score([str(flickr[0]), str(flickr[1])], ["a dog", "a cat"])
    assert scores == pytest.approx(expected.scores.tolist(), abs=1e-6)


def test_pacs_caption_writes_the_ids_of_the_references(tmp_path, flickr):
    from pacs.captioner.modeling.checkpoints import save_captioner
    from pacs.captioner.modeling.model import Captioner, CaptionerConfig
    from pacs.captioner.modeling.vocab import build_vocab
    from pacs.metric.models.backbones import tiny_clip_config

    vocab = build_vocab("word", ["a dog runs", "a cat sits"], min_count=1, max_length=6)
    config = CaptionerConfig(d_model=32, n_heads=4, encoder_layers=1, decoder_layers=1, ffn_dim=64, dropout=0.0,
                             vocab_size=len(vocab), feature_dim=64, max_length=vocab.max_length)
    torch.manual_seed(0)
    checkpoint = save_captioner(tmp_path / "captioner", Captioner(config), vocab,
                                {"random_config": tiny_clip_config(), "random_seed": 0})
    images = tmp_path / "val2014"
    images.mkdir()
    names = ["COCO_val2014_000000391895.JPG", "COCO_val2014_000000000042.jpg"]
    for name, source in zip(names, flickr):
        shutil.copy(source, images / name)

    def caption(*ids: str) -> list[dict]:
        out = tmp_path / "results.json"
        assert main(["caption", "--checkpoint", str(checkpoint), "--images", str(images), "--out", str(out),
                     "--beam-size", "2", *ids]) == 0
        return json.loads(out.read_text())

    by_stem = caption()
    assert [r["image_id"] for r in by_stem] == ["COCO_val2014_000000000042", "COCO_val2014_000000391895"]
    by_coco = caption("--ids", "coco")
    assert [r["image_id"] for r in by_coco] == [42, 391895]  # integers, as COCO references have them
    assert [r["caption"] for r in by_coco] == [r["caption"] for r in by_stem]
    mapping = tmp_path / "ids.json"
    mapping.write_text(json.dumps({names[0]: "n-1", names[1]: "n-2"}))
    assert [r["image_id"] for r in caption("--ids", str(mapping))] == ["n-2", "n-1"]
    (images / "notes.jpg").write_bytes((images / names[1]).read_bytes())
    assert main(["caption", "--checkpoint", str(checkpoint), "--images", str(images), "--out",
                 str(tmp_path / "bad.json"), "--ids", "coco"]) == 2
    assert not (tmp_path / "bad.json").exists()
