"""End to end on real Flickr8k captions and images with a tiny random CLIP: features -> XE -> SCST for every
reward -> `pacs caption`; a second run skips every finished stage."""
from __future__ import annotations

import csv
import json
import runpy
import time
from pathlib import Path

import pytest
import torch
import yaml
from captioner_testkit import tiny_pipeline_sections
from PIL import Image

from pacs.captioner.entry import run_from_config
from pacs.captioner.modeling.checkpoints import load_captioner
from pacs.captioner.modeling.features import FeatureCache
from pacs.metric.models.backbones import tiny_clip_config

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]
REWARDS = ["cider", "clip-s", "ref-clip-s", "pac-s++", "ref-pac-s++", "cider:1,pac-s++:0.5"]


def _config(tmp_path, shared_data) -> dict:
    tiny = {"random_config": tiny_clip_config(), "random_seed": 0}
    return {
        "run_dir": str(tmp_path / "run"),
        "data": {"name": "flickr8k", "path": str(shared_data / "flickr8k"), "missing_images": "skip",
                 "max_train_images": 16, "max_val_images": 4},
        "vocab": {"kind": "word", "min_count": 2, "max_length": 12},
        "features": {"source": tiny, "batch_size": 16, "dtype": "float32"},
        **tiny_pipeline_sections(40, 20, eval_every=6, save_every=6),
        "scst": {"batch_size": 8, "micro_batch_size": 8, "max_steps": 2, "k": 2, "lr": 1e-4,
                 "save_every": 2, "trackers": []},
        "rewards": REWARDS,
        "reward_models": {"clip": tiny, "pac": {"backbone": "", **tiny, "random_seed": 1}},
        "evaluation": {"test_sets": {"flickr8k": {"name": "flickr8k", "path": str(shared_data / "flickr8k"),
                                                  "split": "test"}},
                       "max_images": 4, "beam_size": 2, "text_metrics": ["bleu4", "cider"]},
    }


@pytest.mark.slow
def test_flickr8k_xe_then_scst_for_every_reward_then_caption(tmp_path, shared_data, capsys):
    config_path = tmp_path / "recipe.yaml"
    config_path.write_text(yaml.safe_dump(_config(tmp_path, shared_data)))
    run_from_config(str(config_path), ["scst.k=3"])
    run = tmp_path / "run"
    cache = FeatureCache(run / "features" / "train")
    assert len(cache) == 20 and cache.num_tokens == 17 and cache.feature_dim == 64
    xe_log = (run / "xe" / "log.csv").read_text().splitlines()
    losses = [float(line.split(",")[1]) for line in xe_log[1:]]
    assert len(losses) == 6 and losses[-1] < losses[0]
    for spec in REWARDS:
        from pacs.rewards.slug import reward_slug

        folder = run / f"scst-{reward_slug(spec)}"
        _, _, info = load_captioner(folder / "final")
        assert info["provenance"]["reward"] == spec and info["provenance"]["step"] == 2
        rows = (folder / "log.csv").read_text().splitlines()
        header = rows[0].split(",")
        assert len(rows) == 3 and all(r.split(",")[header.index("reward_mean")] not in ("", "nan") for r in rows[1:])
    table = json.loads((run / "eval" / "results.json").read_text())
    assert [row["model"] for row in table["rows"]] == ["xe", *REWARDS]
    for row in table["rows"]:
        expected = _expected_columns(run, row["model"], shared_data)
        assert {column: row[column] for column in expected} == pytest.approx(expected, abs=1e-4), row["model"]
    assert "| model | test_set | B-4 |" in (run / "eval" / "results.md").read_text()
    # second run, through `pacs train`: every stage is skipped (nothing rewritten)
    from pacs.cli import main

    stamps = {p: p.stat().st_mtime_ns for p in run.rglob("*.safetensors")}
    started = time.monotonic()
    assert main(["train", "--config", str(config_path), "scst.k=3"]) == 0
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*.safetensors")} == stamps
    assert time.monotonic() - started < 60

    # the reward comparison reuses every trained model and writes the Table 9/10 layout
    compare = runpy.run_path(str(REPO / "recipes" / "compare_rewards.py"), run_name="compare_rewards")
    assert compare["main"](["--config", str(config_path), "--reward", "pac-s++", "--reward", "cider",
                            "scst.k=3"]) == 0
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*.safetensors")} == stamps
    with open(run / "compare_rewards" / "results.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert [row["reward"] for row in table] == ["– (XE)", "pac-s++", "cider"]
    assert list(table[0])[:4] == ["test_set", "reward", "B-4", "M"] and "%Incorrect" in table[0]
    assert "| flickr8k | pac-s++ |" in capsys.readouterr().out

    # `pacs caption` re-creates the features from the checkpoint's recorded source: the evaluation's captions
    evaluated = {str(r["image_id"]): r["caption"]
                 for r in json.loads((run / "eval" / "pac-s++" / "flickr8k.results.json").read_text())}
    images = tmp_path / "images"
    images.mkdir()
    for image_id in evaluated:
        (images / f"{image_id}.jpg").symlink_to(shared_data / "flickr8k" / "images" / f"{image_id}.jpg")
    out = tmp_path / "results.json"
    assert main(["caption", "--checkpoint", str(run / "scst-pac-s++" / "final"), "--images", str(images),
                 "--out", str(out), "--beam-size", "2"]) == 0
    results = json.loads(out.read_text())
    assert [r["image_id"] for r in results] == sorted(evaluated)
    assert {r["image_id"]: r["caption"] for r in results} == evaluated


def _expected_columns(run: Path, model: str, shared_data: Path) -> dict[str, float]:
    """One results row recomputed independently from the captions the run wrote for Flickr8k test images:
    B-4 / C by pycocoevalcap, Rep-n / %Incorrect by counting words, and CLIP-S / PAC-S++ (w = 2.5) and their Ref-
    variants through open_clip's plain encoders of the two tiny reward models (seeds 0 and 1)."""
    import re
    from collections import Counter

    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    from pacs.eval.fluency import INCORRECT_END_WORDS
    from pacs.metric.models.backbones import build_backbone_from_config
    from pacs.metric.models.preprocess import open_image
    from pacs.rewards.slug import reward_slug

    written = json.loads((run / "eval" / reward_slug(model) / "flickr8k.results.json").read_text())
    captions = {str(r["image_id"]): r["caption"] for r in written}
    references: dict[str, list[str]] = {}
    for line in (shared_data / "flickr8k" / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, _, caption = line.partition("\t")
        references.setdefault(Path(key.split("#")[0]).stem, []).append(caption.strip())
    ids = list(captions)
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": r} for r in references[i]] for i in ids})
    res = tokenizer.tokenize({i: [{"caption": captions[i]}] for i in ids})
    out = {"B-4": 100 * Bleu(4).compute_score(gts, res, verbose=0)[0][3], "C": 100 * Cider().compute_score(gts, res)[0]}
    words = [re.findall(r"[\w']+", captions[i].lower()) for i in ids]
    for n in (1, 2, 3, 4):
        out[f"Rep-{n}"] = sum(sum(c - 1 for c in Counter(zip(*(w[k:] for k in range(n)))).values())
                              for w in words) / len(ids)
    out["%Incorrect"] = 100 * sum(bool(w) and w[-1] in INCORRECT_END_WORDS for w in words) / len(ids)
    for column, seed in (("CLIP-S", 0), ("PAC-S++", 1)):
        backbone = build_backbone_from_config(tiny_clip_config(), seed=seed)
        with torch.no_grad():
            pixels = torch.stack([backbone.preprocess(open_image(shared_data / "flickr8k" / "images" / f"{i}.jpg"))
                                  for i in ids])
            image = torch.nn.functional.normalize(backbone.model.encode_image(pixels).float(), dim=-1)

            def encode(texts, backbone=backbone):
                tokens = backbone.tokenize(["A photo depicts " + t for t in texts])
                return torch.nn.functional.normalize(backbone.model.encode_text(tokens).float(), dim=-1)

            text = encode([captions[i] for i in ids])
            clip = 2.5 * torch.clamp((image * text).sum(-1), min=0)
            ref = torch.stack([(encode(references[i]) @ text[k]).max() for k, i in enumerate(ids)])
        out[column] = float(clip.mean())
        out[f"Ref{column}"] = float((2 * clip * ref / (clip + ref)).mean())
    return out


def test_pacs_caption_reports_bad_input_in_one_line(tmp_path, capsys):
    from pacs.cli import main

    (tmp_path / "empty").mkdir()
    code = main(["caption", "--checkpoint", str(tmp_path / "nope"), "--images", str(tmp_path / "empty"),
                 "--out", str(tmp_path / "r.json")])
    assert code == 2 and "no .jpg/.jpeg/.png images" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (8, 8)).save(images / "a.png")
    code = main(["caption", "--checkpoint", str(tmp_path / "nope"), "--images", str(images),
                 "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and "is not a captioner checkpoint" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()
