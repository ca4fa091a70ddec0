"""The demo world as a data set of the recipe pipeline (`data: {name: demo-world}`): its rendered images, the judge's
columns on its test set, the oracle reward `judge`, and the judge's findings (tiny models, a tiny world)."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from captioner_testkit import tiny_pipeline_recipe

from pacs.captioner.data import load_dataset
from pacs.captioner.demo.judge import judge_caption
from pacs.captioner.demo.world import DemoWorld, WorldConfig
from pacs.captioner.entry import plan_from_config, run_from_config
from pacs.eval.finding_claims import HUMAN_SUBJECT
from pacs.metric.common.errors import InputError

torch.set_num_threads(1)
WORLD = {"seed": 3, "n_train": 16, "n_val": 4, "n_test": 6, "n_references": 3}


def _world_file(tmp_path: Path) -> Path:
    path = tmp_path / "world.yaml"
    path.write_text(yaml.safe_dump({"world": WORLD}), encoding="utf-8")
    return path


def _expected_world():
    """The world's items by id, made here from `DemoWorld` (the data set's loader is not used)."""
    world = DemoWorld(WorldConfig(**{k: v for k, v in WORLD.items() if not k.startswith("n_") or k == "n_references"}))
    sizes = {"train": WORLD["n_train"], "val": WORLD["n_val"], "test": WORLD["n_test"]}
    return world, {item.image_id: item for split, n in sizes.items() for item in world.items(split, n)}


def test_the_world_loads_as_a_caption_data_set_with_its_images_rendered_and_verified(tmp_path):
    import pacs.captioner.demo.world_source  # noqa: F401  (registers demo-world)

    path, root = _world_file(tmp_path), tmp_path / "images"
    world, expected = _expected_world()
    dataset = load_dataset("demo-world", path, root)
    assert {item.image_id: (item.split, item.captions) for item in dataset.items} == {
        image_id: (image_id.split("-")[0], item.references) for image_id, item in expected.items()}
    first = expected["test-000000"]
    buffer = io.BytesIO()
    world.render(first).save(buffer, format="PNG")
    assert (root / "test-000000.png").read_bytes() == buffer.getvalue()
    (root / "test-000000.png").write_bytes(b"not this image")  # a file that is not its rendering is replaced
    (root / "train-000001.png").unlink()
    load_dataset("demo-world", path, root)
    assert (root / "test-000000.png").read_bytes() == buffer.getvalue()
    assert (root / "train-000001.png").is_file()
    with pytest.raises(InputError, match="set image_root"):
        load_dataset("demo-world", path)
    with pytest.raises(InputError, match=r"options \['n_test'\] are not read"):
        load_dataset("demo-world", path, root, n_test=3)


def _world_recipe(tmp_path: Path) -> dict:
    """A recipe on the tiny world: 200 XE steps and 12 SCST steps of cider and of the oracle `judge`."""
    path = _world_file(tmp_path)
    world_set = {"name": "demo-world", "path": str(path), "image_root": str(tmp_path / "images")}
    recipe = tiny_pipeline_recipe(tmp_path / "run", path, bootstrap=50)
    recipe["data"] = {**world_set, "max_train_images": 0, "max_val_images": 0}
    recipe["vocab"]["min_count"] = 1
    recipe["model"].update(d_model=32, n_heads=4, ffn_dim=64)
    recipe["xe"].update(max_steps=200, batch_size=16, micro_batch_size=16, eval_every=200, save_every=200,
                        schedule={"warmup_steps": 10, "constant_until": 150, "decay_until": 200, "peak_lr": 3e-3,
                                  "final_lr": 1e-4})
    recipe["scst"].update(max_steps=12, k=4, lr=3e-3, save_every=12)  # enough to move the captions
    recipe["rewards"] = ["cider", "judge"]
    recipe["evaluation"].update(test_sets={"world": {**world_set, "split": "test"}}, max_images=0,
                                text_metrics=["bleu4", "cider"])
    return recipe


def _write(tmp_path: Path, recipe: dict) -> str:
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return str(config)


@pytest.mark.slow
def test_a_recipe_on_the_world_reports_the_judge_and_trains_the_oracle(tmp_path):
    config = _write(tmp_path, _world_recipe(tmp_path))
    assert _verdicts(plan_from_config(config, [])) == ["run"] * 9  # planned like any data set's run
    result = run_from_config(config, [])
    assert all(verdict == "reuse" for verdict in _verdicts(plan_from_config(config, [])))
    run = tmp_path / "run"
    _, expected = _expected_world()
    per_image, captioned = {}, {}
    for model in ("xe", "cider", "judge"):
        captions = {entry["image_id"]: entry["caption"] for entry in json.loads(
            (run / "eval" / model / "world.results.json").read_text())}
        assert sorted(captions) == [f"test-{k:06d}" for k in range(WORLD["n_test"])]
        record = json.loads((run / "eval" / model / "world.json").read_text())
        ids = record["per_image"]["world"]["image_ids"]
        values = record["per_image"]["world"]["values"]
        verdicts = [judge_caption(captions[i], expected[i].scene) for i in ids]  # the judge on each caption here
        assert values["Judge-acc"] == [100.0 * v.is_correct for v in verdicts]
        assert values["Judge"] == pytest.approx([100.0 * v.score for v in verdicts], abs=1e-12)
        assert values["Halluc."] == [100.0 * (v.hallucinated > 0) for v in verdicts]
        (row,) = record["rows"]
        assert row["Judge"] == pytest.approx(np.mean(values["Judge"]), abs=1e-9)
        per_image[model], captioned[model] = values, captions
    assert captioned["judge"] != captioned["xe"] != captioned["cider"]  # SCST moved the captions
    results = json.loads((run / "eval" / "results.json").read_text())
    assert results["columns"][-3:] == ["Judge-acc", "Judge", "Halluc."]
    assert {r["model"] for r in result["rows"]} == {"xe", "cider", "judge"}
    judge_row = next(r for r in results["rows"] if r["model"] == "judge")
    delta = np.mean(per_image["judge"]["Judge-acc"]) - np.mean(per_image["xe"]["Judge-acc"])
    assert judge_row["delta"]["Judge-acc"] == pytest.approx(delta, abs=1e-9)
    gain = next(g for g in results["reward_gains"] if g["reward"] == "judge")  # the judge reward: Judge / 100
    assert gain["delta"] == pytest.approx((np.mean(per_image["judge"]["Judge"])
                                           - np.mean(per_image["xe"]["Judge"])) / 100, abs=1e-9)
    claims = {(f["subject"], f["claim"]) for f in results["findings"]}
    assert any(subject == "cider" and "judge" in claim.lower() for subject, claim in claims), claims
    assert "| Judge-acc | Judge | Halluc. |" in (run / "eval" / "results.md").read_text()


def _verdicts(plan: str) -> list[str]:
    """The verdict of every stage of a `--dry-run` plan."""
    stages = plan.split("stages, in order:\n", 1)[1].splitlines()
    return [line.split()[0] for line in stages if line.startswith("  ")]


@pytest.mark.slow
def test_world_seeds_in_parallel_processes_know_the_world(tmp_path):
    """Seed processes are spawned: they register the world again (`data_sources.registered_modules`)."""
    recipe = _world_recipe(tmp_path)
    recipe.update(seeds=[0, 1], parallel_seeds=2, rewards=["judge"])
    run_from_config(_write(tmp_path, recipe), [])
    pooled = json.loads((tmp_path / "run" / "seeds" / "results.json").read_text())
    assert {row["model"] for row in pooled["rows"]} == {"xe", "judge"}
    assert all(len(row["per_seed"]["Judge"]) == 2 for row in pooled["rows"])


def test_the_judge_columns_of_a_world_test_set_are_the_judge_on_each_caption(tmp_path):
    """The references as captions (the judge finds most correct, some not): every row and per-image value."""
    from pacs.captioner.demo import world_source
    from pacs.captioner.orchestration.data_sources import judge_of
    from pacs.captioner.orchestration.shared_stages import evaluation_rows

    world_set = {"name": "demo-world", "path": str(_world_file(tmp_path)), "image_root": str(tmp_path / "images")}
    items = world_source.load_world(Path(world_set["path"]), Path(world_set["image_root"])).split("test").items
    _, expected = _expected_world()
    captions = {item.image_id: item.captions[k % 3] + ("" if k % 2 else " a red circle")
                for k, item in enumerate(items)}  # every other caption names one more (maybe absent) object
    ((row, values),) = evaluation_rows("world", captions, items, None, [], per_image=True, judge=judge_of(world_set))
    verdicts = [judge_caption(captions[i], expected[i].scene) for i in values["image_ids"]]
    assert values["image_ids"] == [item.image_id for item in items]
    assert values["values"]["Judge-acc"] == [100.0 * v.is_correct for v in verdicts]
    assert values["values"]["Judge"] == pytest.approx([100.0 * v.score for v in verdicts], abs=1e-12)
    assert values["values"]["Halluc."] == [100.0 * (v.hallucinated > 0) for v in verdicts]
    assert 0 < row["Judge-acc"] < 100 and row["Judge-acc"] == pytest.approx(
        100.0 * np.mean([v.is_correct for v in verdicts]), abs=1e-12)
    assert row["Halluc."] == pytest.approx(100.0 * np.mean([v.hallucinated > 0 for v in verdicts]), abs=1e-12)


def test_the_oracle_reward_needs_a_world(tmp_path, shared_data):
    recipe = tiny_pipeline_recipe(tmp_path / "run", shared_data / "flickr8k", rewards=["judge"])
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    with pytest.raises(InputError, match="a recipe whose data set is demo-world"):
        run_from_config(str(config), [])


METRICS = {"clip": {"max_steps": 20, "eval_every": 10}, "pacs": {"max_steps": 2, "eval_every": 1}}
"""The metric stages at toy sizes, over demo_smoke's."""


def _reasons(plan: str) -> dict[str, str]:
    """{stage: why} of a `--dry-run` plan (the text after its verdict and name)."""
    stages = plan.split("stages, in order:\n", 1)[1].splitlines()
    return {line.split()[1]: line.split(None, 2)[2] for line in stages if line.startswith("  ")}


def _world_smoke(tmp_path: Path, demo: Path) -> dict:
    """world_smoke.yaml at toy sizes on the world of the demo config `demo`, its metric stages `METRICS`."""
    from pacs.metric.common.config_files import packaged_config

    recipe = yaml.safe_load(packaged_config("world_smoke").read_text(encoding="utf-8"))
    world_set = {"name": "demo-world", "path": str(demo), "image_root": str(tmp_path / "images")}
    recipe.update(run_dir=str(tmp_path / "run"), rewards=["pac-s++"])
    recipe["data"].update(world_set, max_val_images=4)
    for stage, settings in METRICS.items():
        recipe["metric_training"][stage].update(settings)
    recipe["xe"].update(max_steps=4, eval_every=4, save_every=4,
                        schedule={"warmup_steps": 1, "constant_until": 2, "decay_until": 4})
    recipe["scst"].update(max_steps=2, save_every=2, monitor_every=0)
    recipe["evaluation"].update(test_sets={"world": {**world_set, "split": "test"}}, bootstrap=20)
    return recipe


def _metric_demo(tmp_path: Path) -> Path:
    """A demo config on demo_smoke with a `_base_` and a toy world: the recipe reads its merged world."""
    from pacs.metric.common.config_files import packaged_config

    demo = tmp_path / "demo.yaml"
    demo.write_text(yaml.safe_dump({"_base_": str(packaged_config("demo_smoke")), "demo": {
        "run_dir": str(tmp_path / "metrics"), "captioning": False, "world": {"n_train": 64, "n_val": 32, "n_test": 6},
        **METRICS, "correlation": {"n_images": 6, "candidates_per_image": 2, "bootstrap_resamples": 10}}}),
        encoding="utf-8")
    return demo


@pytest.mark.slow
def test_a_recipe_trains_the_worlds_clip_and_pacs_as_the_demo_does_and_reads_them(tmp_path):
    """metric_training (world_smoke.yaml at toy sizes): stages clip and pacs make the models a metric-only demo run
    makes on the same world with the same settings and seed; they are the features' backbone and the CLIP-S and
    PAC-S++ models; a change of the PAC-S++ settings re-runs what reads PAC-S++ and keeps the features and XE."""
    from safetensors.torch import load_file

    from pacs.metric.models.factory import load_backbone
    from pacs.metric.scoring.scorer import Scorer

    demo = _metric_demo(tmp_path)
    run_from_config(str(demo), [])
    config = _write(tmp_path, _world_smoke(tmp_path, demo))
    plan = _reasons(plan_from_config(config, []))
    assert list(plan)[:4] == ["clip", "pacs", "vocab", "features/train"]
    assert plan["pacs"] == "upstream clip re-runs" and "upstream clip" in plan["features/train"]
    run_from_config(config, [])
    run = tmp_path / "run"
    for stage in ("clip", "pacs"):  # the demo's stage of the same name, on one thread in both: the same tensors
        demo_tensors = load_file(tmp_path / "metrics" / stage / "checkpoint.safetensors")
        recipe_tensors = load_file(run / stage / "checkpoint.safetensors")
        assert recipe_tensors.keys() == demo_tensors.keys()
        assert all(torch.equal(recipe_tensors[key], demo_tensors[key]) for key in demo_tensors), stage
        assert (run / stage / "history.csv").read_text().startswith("step,")
    clip, pacs = (run / stage / "checkpoint.safetensors" for stage in ("clip", "pacs"))
    captioner = json.loads((run / "xe" / "best" / "captioner.json").read_text())
    assert captioner["features"]["checkpoint"] == str(clip)
    for model in ("xe", "pac-s++"):
        captions = {e["image_id"]: e["caption"] for e in json.loads(
            (run / "eval" / model / "world.results.json").read_text())}
        record = json.loads((run / "eval" / model / "world.json").read_text())["per_image"]["world"]
        images = [str(tmp_path / "images" / f"{image_id}.png") for image_id in record["image_ids"]]
        texts = [captions[image_id] for image_id in record["image_ids"]]
        for column, checkpoint in (("CLIP-S", clip), ("PAC-S++", pacs)):  # scored here by that checkpoint
            expected = Scorer(load_backbone(checkpoint=str(checkpoint)), device="cpu", progress=False).score(
                images, texts).scores
            assert record["values"][column] == pytest.approx(list(expected), abs=1e-5), (model, column)
        assert "Judge-acc" in record["values"]
    assert set(_reasons(plan_from_config(config, [])).values()) == {("finished with the same fingerprint, its "
                                                                     "outputs verified")}
    changed = _reasons(plan_from_config(config, ["metric_training.pacs.max_steps=3"]))
    kept = [name for name, why in changed.items() if why.startswith("finished")]
    assert kept == ["clip", "vocab", "features/train", "xe", "features/world", "eval/xe/world"] or \
        kept == ["clip", "vocab", "features/train", "xe", "features/world"], changed
    assert changed["pacs"] == "re-running: pacs.max_steps 2 -> 3"
    assert "pacs" in changed["scst-pac-s++"]


def test_metric_training_needs_a_world_and_no_other_model_for_what_it_trains(tmp_path, shared_data):
    """metric_training is refused, naming the key, on a data set without training data of its own, beside another
    feature backbone, CLIP-S or PAC-S++ model or precomputed features, and with a batch its world cannot fill."""
    demo = _metric_demo(tmp_path)
    recipe = _world_smoke(tmp_path, demo)
    flickr = {"name": "flickr8k", "path": str(shared_data / "flickr8k" / "dataset_flickr8k.json")}
    cases = [({"data": {**recipe["data"], **flickr}}, (r"data set 'flickr8k' does not train its own contrastive "
              r"models \(data sets that do: demo-world\)")),
             ({"features": {**recipe["features"], "source": {"backbone": "ViT-B-16/openai"}}},
              r"metric_training: features.source is stage clip's checkpoint .*remove features.source"),
             ({"reward_models": {**recipe["reward_models"], "pac": {"checkpoint": str(tmp_path / "x.pt")}}},
              r"metric_training: reward_models.pac is stage pacs's checkpoint"),
             ({"features": {**recipe["features"], "cache_dir": str(tmp_path)}},
              r"features.cache_dir=.* names features made elsewhere"),
             ({"metric_training": {**recipe["metric_training"], "clip": {"batch_size": 64}}},
              r"metric_training.clip.batch_size=64: expected <= the 32 world.n_val validation pairs")]
    for change, message in cases:
        with pytest.raises(InputError, match=message):
            run_from_config(_write(tmp_path, {**recipe, **change}), [])
        assert not (tmp_path / "run").exists()


def test_later_seeds_read_the_first_seeds_metric_models(tmp_path):
    """With seeds, the first seed trains clip and pacs; the others plan no metric stage and read its checkpoints
    (not made yet in a dry run: not refused)."""
    from pacs.captioner.orchestration.pipeline_config import PipelineConfig
    from pacs.captioner.orchestration.seed_runs import seed_configs
    from pacs.metric.common.config import config_data, from_dict

    demo = _metric_demo(tmp_path)
    recipe = {**_world_smoke(tmp_path, demo), "seeds": [0, 1]}
    config = _write(tmp_path, recipe)
    plan = plan_from_config(config, [])
    first, second = plan.split("seed 1: ", 1)
    assert "  run     clip " in first and "  run     pacs " in first
    assert " clip " not in second and " pacs " not in second
    loaded = from_dict(PipelineConfig, config_data(PipelineConfig, Path(config), []), config)
    (_, zero), (_, one) = seed_configs(loaded)
    made = {stage: str(tmp_path / "run" / "seed-0" / stage / "checkpoint.safetensors") for stage in ("clip", "pacs")}
    assert zero.metric_training is not None and one.metric_training is None
    assert (one.features.source.checkpoint, one.reward_models.clip.checkpoint, one.reward_models.pac.checkpoint) == (
        made["clip"], made["clip"], made["pacs"])
    assert one.features.cache_dir == str(tmp_path / "run" / "seed-0" / "features")


def test_a_world_is_fingerprinted_by_its_merged_settings_and_a_packaged_name_is_a_world(tmp_path):
    """Changing a world file's `_base_` changes every stage that reads the data set; `path: demo_smoke` works."""
    from pacs.captioner.demo import world_source  # noqa: F401  (registers demo-world)
    from pacs.captioner.orchestration.pipeline_config import DataConfig
    from pacs.captioner.orchestration.stage_fingerprints import data_inputs
    from pacs.metric.common.config_files import packaged_config

    base, child = tmp_path / "base.yaml", tmp_path / "world.yaml"
    base.write_text(yaml.safe_dump({"demo": {"world": {"seed": 1}}}), encoding="utf-8")
    child.write_text(yaml.safe_dump({"_base_": "base.yaml", "demo": {"world": {"n_test": 5}}}), encoding="utf-8")
    before = data_inputs({"name": "demo-world", "path": str(child)})
    assert before["content"]["world"]["seed"] == 1 and before["content"]["world"]["n_test"] == 5
    base.write_text(yaml.safe_dump({"demo": {"world": {"seed": 2}}}), encoding="utf-8")
    after = data_inputs({"name": "demo-world", "path": str(child)})
    assert after["annotations"] == before["annotations"] and after["content"]["world"]["seed"] == 2
    plain = data_inputs(DataConfig(name="flickr8k", path=str(child)))  # a data set of files: the file alone
    assert set(plain) == {"annotations"}
    packaged = DataConfig(name="demo-world", path="demo_smoke", image_root=str(tmp_path / "images"))
    assert packaged.loader_arguments()[1] == packaged_config("demo_smoke")
    assert data_inputs(packaged)["content"]["world"]["n_train"] == 160  # demo_smoke.yaml's world


@pytest.mark.slow
def test_the_human_row_holds_one_reference_out_of_each_image_with_the_runs_seed(tmp_path):
    """`evaluation.human_baseline`: row `human`, its captions the references drawn here with the run's seed, the
    judge on them, its interval against XE, the comparison of the best model with it; a re-run reuses it."""
    recipe = _world_recipe(tmp_path)
    recipe.update(seed=5, rewards=["judge"])
    recipe["evaluation"]["human_baseline"] = True
    config = _write(tmp_path, recipe)
    run_from_config(config, [])
    run = tmp_path / "run"
    _, expected = _expected_world()
    ids = [f"test-{k:06d}" for k in range(WORLD["n_test"])]
    rng = np.random.default_rng(5)  # one draw per image, in the test set's order (PAC-S Table 7's human row)
    held = {image_id: int(rng.integers(WORLD["n_references"])) for image_id in ids}
    human = {e["image_id"]: e["caption"] for e in json.loads((run / "eval" / "human" / "world.results.json").read_text())}
    assert human == {image_id: expected[image_id].references[held[image_id]] for image_id in ids}
    record = json.loads((run / "eval" / "human" / "world.json").read_text())["per_image"]["world"]
    assert record["image_ids"] == ids
    assert record["values"]["Judge-acc"] == [100.0 * judge_caption(human[i], expected[i].scene).is_correct for i in ids]
    results = json.loads((run / "eval" / "results.json").read_text())
    human_row = next(row for row in results["rows"] if row["model"] == "human")
    xe = json.loads((run / "eval" / "xe" / "world.json").read_text())["per_image"]["world"]["values"]
    assert human_row["delta"]["Judge"] == pytest.approx(np.mean(record["values"]["Judge"]) - np.mean(xe["Judge"]),
                                                        abs=1e-9)
    versus = [f for f in results["findings"] if f["subject"] == HUMAN_SUBJECT]  # the only SCST row: judge
    assert versus and all(f["model"] == "judge" for f in versus), results["findings"]
    assert "| human | world |" in (run / "eval" / "results.md").read_text()
    assert all(verdict == "reuse" for verdict in _verdicts(plan_from_config(config, [])))
    assert "eval/human/world" in plan_from_config(config, [])


def test_a_test_set_with_an_image_of_one_reference_cannot_give_a_human_row_and_nothing_trains(tmp_path):
    """The refusal names the test set and the image, and comes before the vocabulary or any training."""
    import pacs.captioner.demo.world_source  # noqa: F401  (registers demo-world)

    recipe = _world_recipe(tmp_path)
    load_dataset("demo-world", _world_file(tmp_path), tmp_path / "images")  # the world's images, on disk
    _, expected = _expected_world()
    entries = [{"filename": f"{image_id}.png", "split": "test",
                "sentences": [{"raw": c} for c in expected[image_id].references[:1 if k == 1 else 3]]}
               for k, image_id in enumerate(f"test-{k:06d}" for k in range(3))]
    split_file = tmp_path / "dataset_world.json"
    split_file.write_text(json.dumps({"images": entries}), encoding="utf-8")
    recipe["evaluation"]["test_sets"] = {"karpathy": {"name": "flickr8k-karpathy", "path": str(split_file),
                                                      "image_root": str(tmp_path / "images"), "split": "test"}}
    recipe["evaluation"]["human_baseline"] = True
    with pytest.raises(InputError, match=r"evaluation.test_sets.karpathy: the human baseline needs at least 2 "
                                         r"references per image; image id\(s\) 'test-000001'"):
        run_from_config(_write(tmp_path, recipe), [])
    assert not (tmp_path / "run" / "xe").exists() and not (tmp_path / "run" / "vocab.json").exists()


def _plan_of(plan: str) -> dict[str, str]:
    """{stage: verdict} of a `--dry-run` plan."""
    stages = plan.split("stages, in order:\n", 1)[1].splitlines()
    return {line.split()[1]: line.split()[0] for line in stages if line.startswith("  ")}


@pytest.mark.slow
def test_a_recipe_on_the_world_correlates_every_metric_with_the_judge(tmp_path):
    """`evaluation.correlation`: stage correlation/<set> on the world's test images, the demo's candidates drawn
    with the run's seed (made here from the candidate generator and the judge), Kendall tau of each metric's
    scores against the judge (scipy here), in results.json / .md; a changed setting re-runs that stage alone."""
    from scipy import stats

    from pacs.captioner.demo.candidates import candidates_for

    recipe = _world_recipe(tmp_path)
    recipe.update(seed=9, rewards=["judge"])
    recipe["evaluation"]["correlation"] = {"n_images": 4, "candidates_per_image": 4, "long_captions": False,
                                           "bootstrap_resamples": 30}
    config = _write(tmp_path, recipe)
    assert _plan_of(plan_from_config(config, []))["correlation/world"] == "run"
    run_from_config(config, [])
    folder = tmp_path / "run" / "correlation" / "world"
    _, expected = _expected_world()
    items = [expected[f"test-{k:06d}"] for k in range(4)]
    rng = np.random.default_rng([9, 7])
    wanted = [(item.image_id, kind, caption, judge_caption(caption, item.scene).score)
              for item in items for kind, caption in candidates_for(item, items, rng, 4)]
    with (folder / "scores.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["image_id"], r["kind"], r["caption"], float(r["judge"])) for r in rows] == wanted  # repr: exact
    judge = np.asarray([float(r["judge"]) for r in rows])
    summary = json.loads((folder / "correlation.json").read_text())
    assert set(summary) == {"clip-s", "ref-clip-s", "bleu4", "cider", "length"}  # the tiny recipe has no PAC-S++
    for name in ("clip-s", "cider", "length"):
        values = np.asarray([float(r[name]) for r in rows])  # rounded to 1e-6 in the file: tau on ranks, unchanged
        assert summary[name]["tau_b"] == pytest.approx(100 * stats.kendalltau(values, judge).statistic, abs=1e-6)
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    assert results["correlation"]["world"]["correlation"] == summary
    assert "(`correlation/world/correlation.json`)" in (tmp_path / "run" / "eval" / "results.md").read_text()
    changed = _plan_of(plan_from_config(config, ["evaluation.correlation.n_images=3"]))
    assert {name for name, verdict in changed.items() if verdict != "reuse"} == {"correlation/world"}


def test_correlation_needs_a_test_set_whose_data_set_makes_candidates(tmp_path, shared_data):
    recipe = tiny_pipeline_recipe(tmp_path / "run", shared_data / "flickr8k")
    recipe["evaluation"]["correlation"] = {}
    with pytest.raises(InputError, match=r"evaluation.correlation: no test set's data set makes candidates with a "
                                         r"judge \(test sets: flickr8k \(flickr8k\); data set demo-world does\)"):
        plan_from_config(_write(tmp_path, recipe), [])
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_normalised_rewards_train_beside_the_weighted_sum_and_are_compared_on_the_judge(tmp_path):
    """`normalised_rewards`: stage scst-<reward>-norm trains the mix with each component normalised within the k
    samples, row `<reward> norm`; its gain like any reward's, and (normalised − weighted sum) of Judge-acc paired
    over the test images in results.json `mix_normalisation`, equal to the difference of the per-image means."""
    mix = "cider:1,judge:1"
    recipe = _world_recipe(tmp_path)
    recipe.update(rewards=[mix], normalised_rewards=[mix])
    recipe["scst"]["max_steps"] = 6
    config = _write(tmp_path, recipe)
    plan = _plan_of(plan_from_config(config, []))
    assert "scst-cider_1_judge_1-norm" in plan and "eval/cider_1_judge_1_norm/world" in plan
    run_from_config(config, [])
    run = tmp_path / "run"
    weighted, normalised = (json.loads((run / "stages" / f"{name}.json").read_text())["settings"]["scst"]
                            for name in ("scst-cider_1_judge_1", "scst-cider_1_judge_1-norm"))
    # the default is left out of a stage's settings (runs made before the key existed stay done)
    assert "mix_normalisation" not in weighted and normalised["mix_normalisation"] == "normalize_then_sum"
    assert weighted == {key: value for key, value in normalised.items() if key != "mix_normalisation"}
    values = {row: json.loads((run / "eval" / folder / "world.json").read_text())["per_image"]["world"]
              for row, folder in ((mix, "cider_1_judge_1"), (f"{mix} norm", "cider_1_judge_1_norm"))}
    assert values[mix]["image_ids"] == values[f"{mix} norm"]["image_ids"]
    results = json.loads((run / "eval" / "results.json").read_text())
    (comparison,) = results["mix_normalisation"]
    assert (comparison["model"], comparison["versus"], comparison["column"], comparison["test_set"]) == (
        f"{mix} norm", mix, "Judge-acc", "world")
    expected = np.mean(values[f"{mix} norm"]["values"]["Judge-acc"]) - np.mean(values[mix]["values"]["Judge-acc"])
    assert comparison["delta"] == pytest.approx(expected, abs=1e-9)
    assert comparison["ci"][0] <= comparison["delta"] <= comparison["ci"][1]
    assert {gain["model"] for gain in results["reward_gains"]} == {mix, f"{mix} norm"}
    assert f"`{mix} norm` − `{mix}` on world (Judge-acc" in (run / "eval" / "results.md").read_text()
    assert set(_plan_of(plan_from_config(config, [])).values()) == {"reuse"}


def test_normalised_rewards_are_refused_where_the_comparison_cannot_hold(tmp_path):
    """A greedy baseline (not among the k samples), a recipe already normalising every run, a reward listed twice."""
    recipe = _world_recipe(tmp_path)
    cases = [({"normalised_rewards": ["cider"], "scst": {**recipe["scst"], "baseline": "greedy"}},
              "normalize_then_sum needs a baseline over the k samples"),
             ({"normalised_rewards": ["cider"], "scst": {**recipe["scst"], "mix_normalisation": "normalize_then_sum"}},
              "scst.mix_normalisation is already normalize_then_sum"),
             ({"normalised_rewards": ["cider", "cider"]}, "a reward is listed twice")]
    for change, message in cases:
        with pytest.raises(InputError, match=message):
            run_from_config(_write(tmp_path, {**recipe, **change}), [])
        assert not (tmp_path / "run").exists()


def _greedy_row(model_folder: Path, run: Path, ids: list[str], expected: dict, clip: dict, image_root: Path) -> dict:
    """The judge's row of a captioner folder's greedy captions of `ids`, computed here: its decoding over the run's
    training features, the judge on each caption, CIDEr-D of the lower-cased words, CLIP-S of the recipe's CLIP."""
    from pacs.captioner.modeling.checkpoints import load_captioner
    from pacs.captioner.modeling.decoding import decode_texts, greedy
    from pacs.captioner.modeling.features import FeatureCache
    from pacs.captioner.orchestration.backbone_source import BackboneSource
    from pacs.captioner.orchestration.pipeline_rewards import load_source_backbone
    from pacs.eval.cider import cider_d
    from pacs.metric.common.config import from_dict
    from pacs.metric.scoring.scorer import Scorer

    model, vocab, _ = load_captioner(model_folder)
    model.eval()
    with torch.no_grad():
        tokens = greedy(model, FeatureCache(run / "features" / "train").get(ids), model.config.max_length).tokens
    captions = [rows[0] for rows in decode_texts(vocab, tokens)]
    verdicts = [judge_caption(caption, expected[i].scene) for caption, i in zip(captions, ids)]
    cider = cider_d([" ".join(c.lower().split()) for c in captions],
                    [[" ".join(r.lower().split()) for r in expected[i].references] for i in ids], tokenized=True)
    scorer = Scorer(load_source_backbone(from_dict(BackboneSource, clip, "clip"), "cpu"), device="cpu",
                    progress=False)
    clip_s = scorer.score([str(image_root / f"{i}.png") for i in ids], captions).scores
    return {"Judge-acc": 100.0 * np.mean([v.is_correct for v in verdicts]), "C": 100.0 * float(np.mean(cider)),
            "CLIP-S": float(np.mean(clip_s)), "Length": float(np.mean([len(c.split()) for c in captions]))}


@pytest.mark.slow
def test_a_recipe_draws_the_judges_curve_of_each_scst_run_from_the_start_to_its_last_step(tmp_path):
    """`scst.judge_monitor_every` (the demo's key): <stage>/judge_monitor.csv holds, at step 0, every N steps and at
    the run's last step (10 here: 3 epochs of 4 batches capped by max_steps, not a multiple of 4), the judge's row
    of greedy captions of the first `judge_monitor_images` validation images; step 0's is the XE model's and the
    last the final model's, each recomputed here. The columns are those the recipe can compute (no PAC-S++ model:
    no PAC-S++ curve); the report draws them; the keys enter the stage's settings only when on."""
    recipe = _world_recipe(tmp_path)
    recipe["rewards"] = ["cider"]
    recipe["scst"].update(max_steps=10, epochs=3, save_every=10, judge_monitor_every=4, judge_monitor_images=3)
    run_from_config(_write(tmp_path, recipe), [])
    run = tmp_path / "run"
    record = json.loads((run / "stages" / "scst-cider.json").read_text())
    assert record["summary"]["steps"] == 10
    assert (record["settings"]["scst"]["judge_monitor_every"], record["settings"]["scst"]["judge_monitor_images"]) \
        == (4, 3)
    rows = list(csv.DictReader(io.StringIO((run / "scst-cider" / "judge_monitor.csv").read_text())))
    assert [int(float(row["step"])) for row in rows] == [0, 4, 8, 10]
    assert list(rows[0]) == ["step", "Judge-acc", "C", "CLIP-S", "Length"]
    _, expected = _expected_world()
    ids = [f"val-{k:06d}" for k in range(3)]
    for row, folder in ((rows[0], run / "xe" / "best"), (rows[-1], run / "scst-cider" / "final")):
        want = _greedy_row(folder, run, ids, expected, recipe["reward_models"]["clip"], tmp_path / "images")
        for column, value in want.items():  # the CSV keeps 6 significant digits
            assert float(row[column]) == pytest.approx(value, rel=1e-5, abs=1e-9), column
    assert "scst_val" in (run / "report.html").read_text()


def test_the_judges_curve_needs_a_data_set_with_a_judge(tmp_path, shared_data):
    """On Flickr8k (no judge) `scst.judge_monitor_every` is refused when the recipe loads, naming the key; nothing
    is made."""
    recipe = tiny_pipeline_recipe(tmp_path / "run", shared_data / "flickr8k")
    recipe["scst"]["judge_monitor_every"] = 2
    with pytest.raises(InputError, match="scst.judge_monitor_every=2: data set 'flickr8k' has no judge"):
        run_from_config(_write(tmp_path, recipe), [])
    assert not (tmp_path / "run").exists()


def test_a_recipe_on_the_world_loads_without_the_command_line_layer():
    """The data set demo-world registers itself when a config first names it (`data_sources.BUILT_IN`): a fresh
    process loads world_smoke.yaml with its metric_training (which asks the data set) without importing
    `pacs.captioner.entry`, whose import used to be what registered it."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from pacs.captioner.orchestration.pipeline_config import PipelineConfig\n"
            "from pacs.metric.common.config import load_config\n"
            "from pacs.metric.common.config_files import packaged_config\n"
            "config = load_config(PipelineConfig, packaged_config('world_smoke'))\n"
            "assert 'pacs.captioner.entry' not in sys.modules\n"
            "print(config.data.name, sorted(config.metric_training))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["demo-world", "['clip',", "'pacs',", "'prompt']"]


HF_SIZES = {"hidden_size": 32, "layers": 1, "heads": 2, "intermediate_size": 64, "vision_hidden_size": 32,
            "vision_layers": 1, "vision_heads": 2, "vision_intermediate_size": 64, "patch_size": 16}
"""demo_hf_smoke's transformers captioner sizes."""


@pytest.mark.slow
def test_a_recipe_builds_a_transformers_captioner_from_random_weights_as_the_demo_does(tmp_path):
    """`captioner: {kind: transformers, init: {...}}`: stage `init` builds the random-weight GIT captioner over the
    training captions' words, holding exactly the tensors and vocabulary the demo's `init` stage builds on the same
    world with the same sizes, seed and length; XE and SCST train it and its rows are evaluated; the dry run plans
    init first and a second run reuses every stage; a changed size re-plans init and everything after it."""
    from types import SimpleNamespace

    from safetensors.torch import load_file

    from pacs.captioner.demo.config import DemoCaptionerConfig, DemoWorldConfig
    from pacs.captioner.demo.data import DemoData
    from pacs.captioner.demo.hf_captioner import build_model

    recipe = _world_recipe(tmp_path)
    world_config = DemoWorldConfig(**WORLD)
    recipe["captioner"] = {"kind": "transformers", "init": {**HF_SIZES, "image_size": world_config.image_size},
                           "train_vision": True}
    recipe["rewards"] = ["cider"]
    recipe["xe"].update(max_steps=4, eval_every=4, save_every=4)
    recipe["scst"].update(max_steps=2, save_every=2)
    config = _write(tmp_path, recipe)
    plan = _plan_of(plan_from_config(config, []))
    assert list(plan)[:2] == ["init", "xe"] and set(plan.values()) == {"run"}
    run_from_config(config, [])
    run = tmp_path / "run"
    # the demo's init stage on the same world (its train split's references are the recipe's training captions)
    max_length = json.loads((run / "stages" / "init.json").read_text())["settings"]["max_length"]
    demo = SimpleNamespace(captioner=DemoCaptionerConfig(kind="transformers", **HF_SIZES), world=world_config,
                           model=SimpleNamespace(max_length=max_length))
    build_model(demo, DemoData.build(world_config, tmp_path / "demo_images"), tmp_path / "demo_init",
                seed=recipe.get("seed", 42))
    ours, theirs = (load_file(str(folder / "model.safetensors")) for folder in (run / "init", tmp_path / "demo_init"))
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[key], theirs[key]) for key in ours)
    assert (run / "init" / "tokenizer.json").read_text() == (tmp_path / "demo_init" / "tokenizer.json").read_text()
    _, expected = _expected_world()  # the vocabulary: the words of the world's train references, from the world here
    words = {w for item in expected.values() if item.image_id.startswith("train-") for r in item.references
             for w in r.split()}
    vocab = json.loads((run / "init" / "tokenizer.json").read_text())["model"]["vocab"]
    assert set(vocab) == words | {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    assert json.loads((run / "stages" / "init.json").read_text())["settings"]["init"]["hidden_size"] == 32
    results = json.loads((run / "eval" / "results.json").read_text())
    assert {row["model"] for row in results["rows"]} == {"xe", "cider"}
    assert set(_plan_of(plan_from_config(config, [])).values()) == {"reuse"}
    changed = _plan_of(plan_from_config(config, ["captioner.init.intermediate_size=32"]))
    assert changed["init"] == "run" and changed["xe"] == "run" and changed["eval/cider/world"] == "run"


def test_a_random_weight_captioner_is_refused_where_it_cannot_be_the_one_starting_model(tmp_path):
    """`captioner.init` beside `captioner.checkpoint`, for pacs' captioner, or with patches larger than the images:
    one error naming the key, nothing made."""
    recipe = _world_recipe(tmp_path)
    init = {**HF_SIZES, "image_size": 48}
    cases = [({"kind": "transformers", "init": init, "checkpoint": str(tmp_path)}, "both name the starting model"),
             ({"kind": "pacs", "init": init}, r"captioner.init is for captioner.kind=transformers"),
             ({"kind": "transformers", "init": {**init, "patch_size": 64}},
              r"captioner.init.patch_size=64: expected <= captioner.init.image_size \(48\)"),
             ({"kind": "transformers"}, "or captioner.init")]
    for captioner, message in cases:
        with pytest.raises(InputError, match=message):
            run_from_config(_write(tmp_path, {**recipe, "captioner": captioner}), [])
        assert not (tmp_path / "run").exists()
