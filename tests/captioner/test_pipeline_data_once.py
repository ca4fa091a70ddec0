"""The pipeline reads its data set once: the test set from the same file is taken from it, the rest freed,
with the same outputs as loading it again (real Flickr8k, tiny models); the compact views it keeps."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

import pacs.captioner.data
from pacs.captioner.data import CaptionItem, load_dataset
from pacs.captioner.data.compact_captions import CaptionStore, ImagePaths
from pacs.captioner.entry import run_from_config
from pacs.captioner.orchestration import pipeline, shared_stages
from pacs.captioner.orchestration.training_data import read_training_data
from pacs.metric.common.errors import InputError
from pacs.metric.common.heap import FrozenCopy
from pacs.metric.models.backbones import tiny_clip_config


def _config(run_dir: Path, shared_data: Path) -> dict:
    tiny = {"random_config": tiny_clip_config(), "random_seed": 0}
    flickr = str(shared_data / "flickr8k")
    return {
        "run_dir": str(run_dir),
        "data": {"name": "flickr8k", "path": flickr, "max_train_images": 8, "max_val_images": 2},
        "vocab": {"kind": "word", "min_count": 2, "max_length": 10},
        "features": {"source": tiny, "batch_size": 16, "dtype": "float32"},
        "model": {"d_model": 16, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "ffn_dim": 32},
        "xe": {"max_steps": 2, "batch_size": 20, "micro_batch_size": 20, "eval_every": 0, "val_beam_size": 1,
               "save_every": 2, "trackers": []},
        "scst": {"batch_size": 4, "micro_batch_size": 4, "max_steps": 1, "k": 2, "lr": 5e-6,
                 "save_every": 1, "trackers": []},
        "rewards": ["cider"],
        "reward_models": {"clip": {"backbone": ""}, "pac": {"backbone": ""}},
        "evaluation": {"test_sets": {"flickr8k": {"name": "flickr8k", "path": flickr + "/.", "split": "test"}},
                       "max_images": 3, "beam_size": 1, "text_metrics": ["cider"], "bootstrap": 0},
    }


def _run(tmp_path: Path, name: str, shared_data: Path, monkeypatch) -> tuple[int, dict]:
    """Run the recipe in `tmp_path/name`; the number of data set loads and the evaluation files."""
    loads = []
    original = pacs.captioner.data.load_dataset

    def counting(*args, **kwargs):
        loads.append(args[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(pacs.captioner.data, "load_dataset", counting)  # the test sets read on their own
    monkeypatch.setattr(shared_stages, "load_dataset", counting)  # (RecipeRun.dataset's name for it)
    monkeypatch.setattr(pacs.captioner.data.streaming, "load_dataset", counting)  # the training data (no stream form)
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path / name, shared_data)))
    with torch.random.fork_rng():
        run_from_config(str(config), [])
    evaluation = tmp_path / name / "eval"
    return len(loads), {str(p.relative_to(evaluation)): json.loads(p.read_text())
                        for p in sorted(evaluation.rglob("*.json"))}


@pytest.mark.slow
def test_the_test_set_is_taken_from_the_loaded_data_set_with_the_same_outputs(tmp_path, shared_data, monkeypatch,
                                                                              torch_threads_restored):
    torch.set_num_threads(1)
    loads, outputs = _run(tmp_path, "once", shared_data, monkeypatch)
    assert loads == 1  # the test set names the same folder (another spelling): not read again
    monkeypatch.setattr(shared_stages, "same_file_test_sets", lambda config: {})  # as before: read it again
    loads_again, outputs_again = _run(tmp_path, "twice", shared_data, monkeypatch)
    assert loads_again == 2
    assert set(outputs) == {"xe/flickr8k.json", "xe/flickr8k.results.json", "cider/flickr8k.json",
                            "cider/flickr8k.results.json", "results.json"}
    assert outputs == outputs_again


def test_test_items_come_from_the_loaded_file_only_when_it_is_the_same_one(shared_data, tmp_path):
    dataset = load_dataset("flickr8k", shared_data / "flickr8k", missing_images="keep")
    data = pipeline.DataConfig(name="flickr8k", path=str(shared_data / "flickr8k"), missing_images="keep",
                               max_train_images=5, max_val_images=3)
    same = {"name": "flickr8k", "path": str(shared_data / "flickr8k"), "split": "test", "missing_images": "keep"}
    test_sets = {
        "same": same,
        "whole": {**same, "split": ""},
        "other_policy": {**same, "missing_images": "skip"},  # loads differently: read on its own
        "other_file": {**same, "path": str(shared_data / "pascal50s")},
        "no_such_split": {**same, "split": "restval"},  # left to prepare_test_sets, which reports it
        "bad_settings": {**same, "max_train_images": "many"},  # left to prepare_test_sets, which reports it
    }
    config = SimpleNamespace(data=data, evaluation=SimpleNamespace(test_sets=test_sets, max_images=4))
    same_file = shared_stages.same_file_test_sets(config)
    assert set(same_file) == {"same", "whole", "no_such_split"}
    read = read_training_data(config, tmp_path, same_file)
    assert set(read.test_items) == {"same", "whole"}
    assert read.test_items["same"] == dataset.split("test").items[:4] and read.test_items["whole"] == dataset.items[:4]
    train, val = dataset.split("train").items[:5], dataset.split("val").items[:3]
    assert list(read.store.reference_sets()) == [(i.image_id, i.captions) for i in train]
    assert read.val_references == {i.image_id: i.captions for i in val}
    assert dict(read.image_paths.items()) == {i.image_id: i.image_path for i in train + val}


def _karpathy_file(folder: Path, images: list[dict]) -> Path:
    path = folder / "dataset_coco.json"
    path.write_text(json.dumps({"images": images, "dataset": "coco"}), encoding="utf-8")
    return path


def _karpathy_images(n: int) -> list[dict]:
    splits = ["train", "restval", "val", "test", "train"]
    return [{"cocoid": 1000 + i, "filepath": "val2014", "filename": f"COCO_{i}.jpg", "split": splits[i % 5],
             "sentences": [{"raw": f"Caption {k} of image {i} ünï"} for k in range(1 + i % 3)]} for i in range(n)]


def _karpathy_config(path: Path, **data: object) -> SimpleNamespace:
    data_config = pipeline.DataConfig(name="coco-karpathy", path=str(path), missing_images="keep", **data)
    test_sets = {"coco": {"name": "coco-karpathy", "path": str(path), "split": "test", "missing_images": "keep"}}
    return SimpleNamespace(data=data_config, evaluation=SimpleNamespace(test_sets=test_sets, max_images=0))


def test_a_karpathy_file_is_streamed_into_what_the_loaded_data_set_gives(tmp_path, monkeypatch):
    """The streamed reading (no list of every item) keeps exactly what the loaded data set gives: the first
    training images (restval merged) on disk, the validation references, the test items."""
    path = _karpathy_file(tmp_path, _karpathy_images(60))
    dataset = load_dataset("coco-karpathy", path, missing_images="keep")

    def no_full_load(*args, **kwargs):
        raise AssertionError("the Karpathy file was loaded whole")

    monkeypatch.setattr(pacs.captioner.data.streaming, "load_dataset", no_full_load)
    config = _karpathy_config(path, max_train_images=20, max_val_images=0)
    read = read_training_data(config, tmp_path, shared_stages.same_file_test_sets(config))
    train, val = dataset.split("train").items[:20], dataset.split("val").items
    assert len(train) == 20 and {i.extra["karpathy_split"] for i in train} == {"train", "restval"}
    assert list(read.store.reference_sets()) == [(i.image_id, i.captions) for i in train]
    assert read.val_references == {i.image_id: i.captions for i in val}
    assert list(read.image_paths.items()) == [(i.image_id, i.image_path) for i in train + val]
    assert read.test_items == {"coco": dataset.split("test").items}
    assert [p.name for p in tmp_path.iterdir()] == ["dataset_coco.json"]  # the on-disk data has no file name
    for policy in ("keep", "skip"):
        streamed = pacs.captioner.data.stream_dataset("coco-karpathy", path, missing_images=policy)
        assert list(streamed) == load_dataset("coco-karpathy", path, missing_images=policy).items
        assert streamed.summary() == load_dataset("coco-karpathy", path, missing_images=policy).summary()
        assert streamed.report["missing_images"] == 60


def test_a_streamed_file_gets_the_loaders_errors(tmp_path):
    """A repeated id, missing images under `error` and an unknown split: the messages of `load_dataset`."""
    images = _karpathy_images(12)
    images[9]["cocoid"] = images[4]["cocoid"]
    path = _karpathy_file(tmp_path, images)
    config = _karpathy_config(path)
    with pytest.raises(InputError) as loaded:
        load_dataset("coco-karpathy", path, missing_images="keep")
    with pytest.raises(InputError) as streamed:
        read_training_data(config, tmp_path, {})
    assert str(streamed.value) == str(loaded.value) == f"{path}: image id '1004' occurs twice"
    path = _karpathy_file(tmp_path, _karpathy_images(12))
    config = _karpathy_config(path)
    config.data.missing_images = "error"
    with pytest.raises(InputError) as loaded:
        load_dataset("coco-karpathy", path, missing_images="error")
    with pytest.raises(InputError) as streamed:
        read_training_data(config, tmp_path, {})
    assert str(streamed.value) == str(loaded.value) and "12 of 12 images are missing" in str(loaded.value)
    config = _karpathy_config(path, train_splits=["train", "extra"])
    with pytest.raises(InputError) as loaded:
        load_dataset("coco-karpathy", path, missing_images="keep").split("train", "extra")
    with pytest.raises(InputError) as streamed:
        read_training_data(config, tmp_path, {})
    assert str(streamed.value) == str(loaded.value) == "coco-karpathy: no split 'extra' (splits: test, train, val)"
    skipped = _karpathy_config(path)
    skipped.data.missing_images = "skip"
    with pytest.raises(InputError) as loaded:  # every image missing: skipped, and no training split is left
        load_dataset("coco-karpathy", path, missing_images="skip").split("train")
    with pytest.raises(InputError) as streamed:
        read_training_data(skipped, tmp_path, {})
    assert str(streamed.value) == str(loaded.value) == "coco-karpathy: no split 'train' (splits: )"


def test_image_paths_and_caption_texts_equal_the_dicts_and_lists_they_replace(tmp_path):
    items = [CaptionItem("a", tmp_path / "ä b.jpg", ["Ünïcödé café", "x"], "train"),
             CaptionItem("b", None, ["y"], "train"), CaptionItem("c", Path("rel/c.png"), ["z"], "val")]
    paths = ImagePaths.from_items(items)
    expected = {item.image_id: item.image_path for item in items}
    assert dict(paths) == expected and dict(paths.items()) == expected and list(paths.values()) == [
        tmp_path / "ä b.jpg", None, Path("rel/c.png")]
    assert paths["c"] == Path("rel/c.png") and paths["b"] is None and len(paths) == 3 and "d" not in paths
    repeated = ImagePaths.from_items([*items, CaptionItem("a", Path("last.jpg"), ["w"], "val")])
    assert dict(repeated) == {**expected, "a": Path("last.jpg")} and list(repeated) == ["a", "b", "c"]
    texts = CaptionStore.from_items(items).captions()
    assert list(texts) == ["Ünïcödé café", "x", "y", "z"] and texts[-1] == "z" and texts[1:3] == ["x", "y"]
    assert len(texts) == 4


def test_kept_objects_share_nothing_with_the_loaded_items(tmp_path):
    items = [CaptionItem("img-1", tmp_path / "a.jpg", ["a dog", "ein Hünd"], "test", {"domain": "near", "n": [1]}),
             CaptionItem("img-2", None, ["a cat"], "test")]
    frozen = FrozenCopy(items)
    copies = frozen.thaw()  # what the pipeline keeps of a data set it drops
    assert copies == items  # equal values
    for item, copy in zip(items, copies):
        assert copy is not item and copy.image_id is not item.image_id
        assert all(c is not o for c, o in zip(copy.captions, item.captions)) and copy.extra is not item.extra
    assert copies[0].extra["domain"] is not items[0].extra["domain"]
    with pytest.raises(RuntimeError, match="already called"):
        frozen.thaw()
    store = CaptionStore.from_items(items, folder=tmp_path)  # on disk: what it gives back is made when read
    assert list(store.image_ids) == ["img-1", "img-2"] and store.image_ids[0] is not items[0].image_id
    assert list(store.pairs()) == [("img-1", "a dog"), ("img-1", "ein Hünd"), ("img-2", "a cat")]
    assert store.pairs()[1][1] is not items[0].captions[1]
