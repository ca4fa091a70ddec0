"""The positives generator (tiny random BLIP + Stable Diffusion built in code) and the two-command workflow."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from pacs import cli as pacs_cli
from pacs.metric.models.factory import load_backbone
from pacs.metric.scoring.scorer import Scorer
from pacs.metric.training.positives import PositivesConfig, caption_seed, generate_positives

torch.set_num_threads(1)
N_CAPTIONS = 2


@pytest.fixture()
def karpathy_dataset(shared_data, tmp_path):
    """A Karpathy-format split file over three real Flickr8k images (small copies), two captions each."""
    root = shared_data / "flickr8k"
    captions: dict[str, list[str]] = {}
    for line in (root / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines()[:40]:
        key, _, caption = line.partition("\t")
        captions.setdefault(key.split("#")[0], []).append(caption)
    names = sorted(captions)[:3]
    (tmp_path / "images").mkdir()
    entries = []
    for index, name in enumerate(names):
        with Image.open(root / "images" / name) as image:
            image.draft("RGB", (64, 64))
            image.convert("RGB").save(tmp_path / "images" / name)
        entries.append({"filepath": "", "filename": name, "imgid": index, "split": "val" if index == 2 else "restval",
                        "sentences": [{"raw": c, "sentid": index * 10 + k}
                                      for k, c in enumerate(captions[name][:N_CAPTIONS])]})
    path = tmp_path / "dataset_flickr8k.json"
    path.write_text(json.dumps({"images": entries, "dataset": "flickr8k"}), encoding="utf-8")
    return path, tmp_path / "images"


def _generator_options(tiny_blip_dir, tiny_sd_dir):
    return [f"captioner={tiny_blip_dir}", f"text_to_image={tiny_sd_dir}", "num_inference_steps=2", "image_size=32",
            "caption_max_length=8", "caption_num_beams=1", "safety_checker=false", "batch_size=2", "seed=7"]


def test_two_commands_from_dataset_to_checkpoint(karpathy_dataset, tiny_blip_dir, tiny_sd_dir, tmp_path, capsys):
    dataset, images = karpathy_dataset
    out = tmp_path / "positives"
    status = pacs_cli.main(["generate-positives", "--dataset", str(dataset), "--image-root", str(images),
                            "--output-dir", str(out), *_generator_options(tiny_blip_dir, tiny_sd_dir)])
    assert status == 0
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * N_CAPTIONS
    assert set(rows[0]) >= {"image_id", "caption_id", "real_image", "caption", "gen_caption", "gen_image", "seed"}
    assert [r["split"] for r in rows] == ["train"] * 4 + ["val"] * 2  # restval counts as train
    for row in rows:
        assert (out / row["gen_image"]).is_file() and row["gen_caption"]
        assert row["seed"] == caption_seed(7, row["caption_id"])
        with Image.open(out / row["gen_image"]) as generated:
            assert generated.size == (32, 32)
    assert rows[0]["gen_caption"] == rows[1]["gen_caption"]  # one t' per image, shared by its captions
    meta = json.loads((out / "positives_meta.json").read_text())
    assert meta["n_pairs"] == 6 and meta["seed"] == 7 and meta["provenance"]["pacs_version"]
    assert "6 pairs" in capsys.readouterr().out

    run = tmp_path / "run"
    status = pacs_cli.main(["train-metric", "--manifest", str(out / "manifest.jsonl"), "--output-dir", str(run),
                            "backbone=null", "random_init=true", "batch_size=2", "max_steps=2", "eval_every=1",
                            "log_every=0"])
    assert status == 0
    assert "checkpoint" in capsys.readouterr().out
    log = json.loads((run / "train_log.json").read_text())
    assert log["steps"] == 2 and len(log["history"]) == 3 and log["files"]["adapter"] == "adapter"
    adapter = load_backbone(checkpoint=str(run / "adapter"))
    merged = load_backbone(checkpoint=str(run / "checkpoint.safetensors"))
    pictures = [Image.open(images / name).convert("RGB") for name in sorted(p.name for p in images.iterdir())]
    candidates = ["a dog runs", "a child on stairs", "two people"]
    # bit-equal: the adapter folder merges to the checkpoint's weights (the same peft merge of the same tensors) and
    # both score the same inputs in the same batches
    np.testing.assert_array_equal(Scorer(adapter).score(pictures, candidates).scores,
                                  Scorer(merged).score(pictures, candidates).scores)


def test_generation_resumes_and_is_seeded(karpathy_dataset, tmp_path):
    dataset, images = karpathy_dataset
    calls = {"captions": 0, "images": 0}

    def captioner(pictures):
        calls["captions"] += len(pictures)
        return [f"caption of a {p.size[0]}x{p.size[1]} image" for p in pictures]

    def image_generator(prompts, seeds):
        calls["images"] += len(prompts)
        return [Image.fromarray(np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8))
                for seed in seeds]

    config = PositivesConfig(dataset=str(dataset), image_root=str(images), output_dir=str(tmp_path / "out"),
                             batch_size=2)
    manifest = generate_positives(config, captioner, image_generator)
    first = manifest.read_text()
    assert calls == {"captions": 3, "images": 6}
    generate_positives(config, captioner, image_generator)  # everything exists: nothing is generated again
    assert calls == {"captions": 3, "images": 6}
    assert manifest.read_text() == first
    # an interrupted run: one generated image lost, the shard file torn in its last line
    rows = [json.loads(line) for line in first.splitlines()]
    (tmp_path / "out" / rows[-1]["gen_image"]).unlink()
    part = tmp_path / "out" / "manifest.part000.jsonl"
    part.write_text(part.read_text()[:-20])
    generate_positives(config, captioner, image_generator)
    assert calls["images"] == 6 + 1
    assert manifest.read_text() == first  # same rows, same seeds, same order
    regenerated = np.array(Image.open(tmp_path / "out" / rows[-1]["gen_image"]))
    np.testing.assert_array_equal(regenerated, np.random.default_rng(rows[-1]["seed"]).integers(0, 255, (8, 8, 3),
                                                                                                 dtype=np.uint8))


def test_missing_model_names_it_and_the_option(karpathy_dataset, tmp_path, capsys):
    dataset, images = karpathy_dataset
    status = pacs_cli.main(["generate-positives", "--dataset", str(dataset), "--image-root", str(images),
                            "--output-dir", str(tmp_path / "out"), "captioner=Salesforce/blip-image-captioning-large"])
    assert status == 2
    err = capsys.readouterr().err
    assert "Salesforce/blip-image-captioning-large" in err and "captioner=PATH" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "manifest.jsonl").exists()


def test_missing_dataset_image_is_an_error_or_a_counted_skip(karpathy_dataset, tmp_path):
    dataset, images = karpathy_dataset
    victim = min(images.iterdir())
    shutil.move(victim, tmp_path / "elsewhere.jpg")
    config = PositivesConfig(dataset=str(dataset), image_root=str(images), output_dir=str(tmp_path / "out"))
    with pytest.raises(Exception, match=victim.name):
        generate_positives(config, lambda p: ["x"] * len(p), lambda t, s: [Image.new("RGB", (4, 4))] * len(t))
    config.skip_missing = True
    manifest = generate_positives(config, lambda p: ["x"] * len(p), lambda t, s: [Image.new("RGB", (4, 4))] * len(t))
    assert len(manifest.read_text().splitlines()) == 2 * N_CAPTIONS
    assert json.loads((tmp_path / "out" / "positives_meta.json").read_text())["skipped_missing_images"] == 1


def test_blip_captioner_in_bfloat16(tiny_blip_dir):
    from pacs.metric.training.positives import BlipCaptioner

    captioner = BlipCaptioner.load(str(tiny_blip_dir), max_length=6, num_beams=1, dtype="bfloat16")
    assert captioner.model.dtype == torch.bfloat16
    captions = captioner([Image.new("RGB", (40, 30), (200, 10, 10)), Image.new("L", (20, 20), 90)])
    assert len(captions) == 2 and all(isinstance(c, str) for c in captions)
    with pytest.raises(Exception, match="dtype must be one of"):
        BlipCaptioner.load(str(tiny_blip_dir), dtype="int8")


def test_resume_after_a_run_with_two_shards(karpathy_dataset, tmp_path):
    dataset, images = karpathy_dataset
    calls = []

    def captioner(pictures):
        calls.append(len(pictures))
        return ["t prime"] * len(pictures)

    def image_generator(prompts, seeds):
        calls.append(len(prompts))
        return [Image.new("RGB", (4, 4), (seed % 256, 0, 0)) for seed in seeds]

    out = tmp_path / "out"
    config = PositivesConfig(dataset=str(dataset), image_root=str(images), output_dir=str(out))
    first = generate_positives(config, captioner, image_generator).read_text()
    # as if two processes had written one shard each
    lines = (out / "manifest.part000.jsonl").read_text().splitlines(keepends=True)
    (out / "manifest.part000.jsonl").write_text("".join(lines[:2]))
    (out / "manifest.part001.jsonl").write_text("".join(lines[2:]))
    (out / "manifest.jsonl").unlink()
    calls.clear()
    assert generate_positives(config, captioner, image_generator).read_text() == first
    assert calls == []  # everything was found in one shard file or the other
