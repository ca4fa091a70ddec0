"""The demo with a tiny transformers captioner (recipes/configs/demo_hf_smoke.yaml, 2 seeds) end to end into a
temporary run dir, then a second run that reuses every stage; and the `captioner` section's checks."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pacs.captioner.demo.captioning import DEMO_COLUMNS
from pacs.captioner.demo.pipeline import REPO_CONFIGS, load_demo_config, run_demo, stage_names
from pacs.metric.common.errors import InputError

SEEDS = [0, 1]
PER_SEED = ["init", "xe", "scst-pac-s++", "scst-judge", "scst-pac-s++-kl0.1"]
STAGES = {"data", "clip", "pacs", "correlation", "evaluate",
          *(f"seed-{seed}/{name}" for seed in SEEDS for name in PER_SEED)}
MODELS = ["xe", "scst pac-s++", "scst judge", "scst pac-s++ +KL", "human"]
CONFIG = str(REPO_CONFIGS / "demo_hf_smoke.yaml")


def _state_dict(folder: Path) -> dict:
    import transformers

    model = transformers.GitForCausalLM.from_pretrained(folder)  # a plain transformers folder, loaded offline
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _differs(a: dict, b: dict) -> bool:
    assert a.keys() == b.keys()
    return any(not bool((a[name] == b[name]).all()) for name in a)


@pytest.mark.slow
def test_demo_hf_smoke_run_end_to_end_then_cached(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    first = run_demo(CONFIG, [f"runs_dir={tmp_path}"])
    out = capsys.readouterr().out
    run_dir = tmp_path / "demo_hf_smoke"
    assert set(first["ran"]) == STAGES and first["skipped"] == []
    assert not (run_dir / "features").exists()  # the model reads the images: no grid features
    results = json.loads((run_dir / "results.json").read_text())
    assert [row["model"] for row in results["rows"]] == MODELS
    for row in results["rows"]:
        for column in DEMO_COLUMNS:
            if row["model"] == "human" and column == "B-4":
                assert row[column] is None  # left out for humans, as in the papers
                continue
            assert isinstance(row[column], float) and math.isfinite(row[column]), (row["model"], column)
        assert f"| {row['model']} |" in out
    assert results["oracle"] == "scst judge" and results["seeds"] == SEEDS
    # findings records for every reward's row
    subjects = {record["subject"] for record in results["findings"]}
    assert {"scst pac-s++", "scst judge", "scst pac-s++ +KL"} <= subjects
    assert results["guarded"]["choices"]["pac-s++"]["chosen_kl_coef"] == 0.1

    # Judge-acc and Length of every row recomputed from the captions each seed's models wrote
    from pacs.captioner.demo.data import DemoData
    from pacs.captioner.demo.judge import judge_caption

    config = load_demo_config(CONFIG, [f"runs_dir={tmp_path}"])
    data = DemoData.build(config.world, tmp_path / "unused")
    scenes = data.scenes()
    per_seed = [json.loads((run_dir / "evaluate" / f"seed-{seed}" / "captions.json").read_text()) for seed in SEEDS]
    for row in results["rows"]:
        accuracy, length = [], []
        for captions in per_seed:
            texts = captions[row["model"]]
            assert set(texts) == {item.image_id for item in data.splits["test"]}
            accuracy.append(100.0 * sum(judge_caption(c, scenes[i]).is_correct for i, c in texts.items()) / len(texts))
            length.append(sum(len(c.split()) for c in texts.values()) / len(texts))
        assert row["Judge-acc"] == pytest.approx(sum(accuracy) / 2), row["model"]
        assert row["Length"] == pytest.approx(sum(length) / 2), row["model"]

    # stage `init`: a GIT whose tokenizer's vocabulary is the special tokens then the train references' words
    import transformers

    words = sorted({w for item in data.splits["train"] for caption in item.references for w in caption.split()})
    tokenizer = transformers.AutoTokenizer.from_pretrained(run_dir / "seed-0" / "init")
    vocab = sorted(tokenizer.get_vocab(), key=tokenizer.get_vocab().get)
    assert vocab == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    reference = data.splits["test"][0].references[0]  # a caption of the world survives encode + decode as it is
    assert tokenizer.decode(tokenizer(reference, add_special_tokens=False)["input_ids"]) == reference
    record = json.loads((run_dir / "stages" / "seed-0" / "init.json").read_text())
    assert record["settings"]["captioner"]["kind"] == "transformers" and record["settings"]["seed"] == 0
    # the trained folders are plain transformers folders; each SCST model moved away from its seed's XE model
    for seed in SEEDS:
        folder = run_dir / f"seed-{seed}"
        init, xe = _state_dict(folder / "init"), _state_dict(folder / "xe" / "best")
        assert _differs(init, xe)
        for name in ("scst-pac-s++/final", "scst-judge/final", "scst-pac-s++-kl0.1/best"):
            assert _differs(xe, _state_dict(folder / name)), (seed, name)
        scst = json.loads((run_dir / "stages" / f"seed-{seed}" / "scst-judge.json").read_text())
        assert scst["settings"]["captioner"]["family"] == "git" and scst["settings"]["reward"] == "judge"
    # the seeds' init models differ (each seed its own random weights)
    assert _differs(_state_dict(run_dir / "seed-0" / "init"), _state_dict(run_dir / "seed-1" / "init"))
    assert (run_dir / "logs" / "xe.csv").is_file() and (run_dir / "logs" / "scst_val-judge.csv").is_file()

    second = run_demo(CONFIG, [f"runs_dir={tmp_path}"])
    assert second["ran"] == [] and set(second["skipped"]) == STAGES
    assert [row["model"] for row in second["rows"]] == MODELS


def test_main_demo_keeps_pacs_captioner() -> None:
    config = load_demo_config(None, [])
    assert config.captioner.kind == "pacs"
    names = stage_names(config)
    assert "features" in names and not any(name.endswith("init") for name in names)
    hf = load_demo_config(CONFIG, [])
    assert "features" not in stage_names(hf) and "seed-1/init" in stage_names(hf)


@pytest.mark.parametrize(("override", "message"), [
    ("captioner.kind=blip", "captioner.kind='blip': expected one of pacs, transformers"),
    ("captioner.family=blip", "captioner.family='blip': expected one of git"),
    ("captioner.hidden_size=30", "captioner.hidden_size=30: expected a multiple of captioner.heads (4)"),
    ("captioner.patch_size=64", "captioner.patch_size=64: expected <= world.image_size (48)"),
])
def test_captioner_section_checked(override: str, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_demo_config(str(REPO_CONFIGS / "demo_hf.yaml"), [override])


def test_the_transformers_memory_estimate_is_computed_by_hand() -> None:
    """demo_hf_smoke.yaml's XE and SCST steps: ViT and text decoder of 1 layer, width 32, FFN 64, 2 heads; 10 vision
    tokens (48 px / 16, + CLS), captions of 20; XE micro-batch 16, SCST 8 images × 4 samples."""
    from pacs.captioner.demo.budget import stage_estimates

    params = 16 * (2 * (4 * 32**2 + 2 * 32 * 64) + 32 * 32)  # both towers, the projection between them
    vision = 4 * 1 * 10 * (16 * 32 + 2 * 64 + 2 * 2 * 10)  # per sample
    text = 4 * 1 * 30 * (16 * 32 + 2 * 64 + 2 * 2 * 30)
    estimates = stage_estimates(load_demo_config(CONFIG, []))
    assert estimates["xe"][0] == params + 16 * (vision + text) == 2_172_928
    assert estimates["scst"][0] == params + 32 * (vision + text)
    with pytest.raises(InputError, match=r"xe: one training step would hold about .* lower xe.micro_batch_size "
                                         r"\(or batch_size\), captioner.hidden_size"):
        load_demo_config(CONFIG, ["captioner.hidden_size=1024", "captioner.intermediate_size=4096",
                                  "captioner.layers=24", "captioner.heads=16", "xe.batch_size=288"])
