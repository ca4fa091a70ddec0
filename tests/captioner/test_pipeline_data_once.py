"""The pipeline reads its data set once: the test set from the same file is taken from it, the rest freed,
with the same outputs as loading it again (real Flickr8k, tiny models); the compact views it keeps."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

import captioner.data
from captioner.data import CaptionItem, load_dataset
from captioner.data.compact_captions import CaptionStore, ImagePaths
from captioner.entry import run_from_config
from captioner.orchestration import pipeline
from metric.common.heap import FrozenCopy
from metric.models.backbones import tiny_clip_config


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
               "save_every": 2, "tensorboard": False},
        "scst": {"batch_size": 4, "micro_batch_size": 4, "max_steps": 1, "k": 2, "lr": 5e-6,
                 "save_every": 1, "tensorboard": False},
        "rewards": ["cider"],
        "reward_models": {"clip": {"backbone": ""}, "pac": {"backbone": ""}},
        "evaluation": {"test_sets": {"flickr8k": {"name": "flickr8k", "path": flickr + "/.", "split": "test"}},
                       "max_images": 3, "beam_size": 1, "text_metrics": ["cider"], "bootstrap": 0},
    }


def _run(tmp_path: Path, name: str, shared_data: Path, monkeypatch) -> tuple[int, dict]:
    """Run the recipe in `tmp_path/name`; the number of data set loads and the evaluation files."""
    loads = []
    original = captioner.data.load_dataset

    def counting(*args, **kwargs):
        loads.append(args[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(captioner.data, "load_dataset", counting)
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
    monkeypatch.setattr(pipeline, "_test_items_from", lambda config, dataset: {})  # as before: read it again
    loads_again, outputs_again = _run(tmp_path, "twice", shared_data, monkeypatch)
    assert loads_again == 2
    assert set(outputs) == {"xe/flickr8k.json", "xe/flickr8k.results.json", "cider/flickr8k.json",
                            "cider/flickr8k.results.json", "results.json"}
    assert outputs == outputs_again


def test_test_items_come_from_the_loaded_file_only_when_it_is_the_same_one(shared_data):
    dataset = load_dataset("flickr8k", shared_data / "flickr8k", missing_images="keep")
    data = pipeline.DataConfig(name="flickr8k", path=str(shared_data / "flickr8k"), missing_images="keep")
    same = {"name": "flickr8k", "path": str(shared_data / "flickr8k"), "split": "test", "missing_images": "keep"}
    test_sets = {
        "same": same,
        "whole": {**same, "split": ""},
        "other_policy": {**same, "missing_images": "skip"},  # loads differently: read on its own
        "other_file": {**same, "path": str(shared_data / "pascal50s")},
        "no_such_split": {**same, "split": "restval"},  # left to prepare_test_sets, which reports it
    }
    config = SimpleNamespace(data=data, evaluation=SimpleNamespace(test_sets=test_sets, max_images=4))
    items = pipeline._test_items_from(config, dataset)
    assert set(items) == {"same", "whole"}
    assert items["same"] == dataset.split("test").items[:4] and items["whole"] == dataset.items[:4]


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
