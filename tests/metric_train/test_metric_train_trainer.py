"""Trainer modes, early stopping, accumulation, correlation hook, resume, and bad input."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from pacs import cli as pacs_cli
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.training.data import TensorPositivesDataset, read_manifest
from pacs.metric.training.trainer import MetricTrainConfig, train_metric

from .metric_train_driver import WORDS, positives

torch.set_num_threads(1)


def _backbone(seed=0, vision=None):
    config = tiny_clip_config(vision_cfg={"image_size": 32, "patch_size": 8, **(vision or {})},
                              text_cfg={"context_length": 16})
    return build_backbone_from_config(config, seed=seed, name="tiny-test")


_data = positives  # `n` random positives from a seed (shared with the equivalence driver)


def _config(tmp_path, name="run", **kwargs):
    values = {"mode": "lora", "random_init": True, "batch_size": 4, "max_steps": 4, "eval_every": 2, "log_every": 0,
              "seed": 0, "output_dir": str(tmp_path / name)}
    values.update(kwargs)
    return MetricTrainConfig(**values)


def _weights(folder):
    return load_file(str(folder / "checkpoint.safetensors"))


def test_projection_mode_trains_only_the_projections(tmp_path):
    base = _backbone()
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    out = train_metric(_config(tmp_path, mode="projection", lr=1e-2), _data(16, 0), _data(8, 1), backbone=base)
    after = _weights(out)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"visual.proj", "text_projection"}
    log = json.loads((out / "train_log.json").read_text())
    assert log["provenance"]["family"] == "pac-s" and "adapter" not in log["files"]


def test_lora_mode_keeps_base_and_logit_scale_frozen_unless_asked(tmp_path):
    base = _backbone()
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    out = train_metric(_config(tmp_path, lr=1e-2), _data(16, 0), _data(8, 1), backbone=base)
    after = _weights(out)
    assert torch.equal(after["logit_scale"], before["logit_scale"])
    assert not torch.equal(after["visual.conv1.weight"], before["visual.conv1.weight"])  # merged LoRA delta
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    adapter_state = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert adapter_state and all("lora_" in key for key in adapter_state)
    scaled = train_metric(_config(tmp_path, "scaled", lr=1e-2, train_logit_scale=True), _data(16, 0), _data(8, 1),
                          backbone=_backbone())
    assert not torch.equal(_weights(scaled)["logit_scale"], before["logit_scale"])


def test_early_stopping_and_gradient_accumulation(tmp_path):
    out = train_metric(_config(tmp_path, lr=0.0, max_steps=100, eval_every=1, patience=3), _data(32, 0), _data(8, 1),
                       backbone=_backbone())
    log = json.loads((out / "train_log.json").read_text())
    assert log["steps"] == 3 and log["best_step"] == 0  # no improvement for 3 iterations: stop
    out = train_metric(_config(tmp_path, "accum", batch_size=8, micro_batch_size=4, max_steps=0, max_epochs=1,
                               eval_every=0), _data(32, 0), _data(8, 1), backbone=_backbone())
    assert json.loads((out / "train_log.json").read_text())["steps"] == 32 // 8


def test_periodic_correlation_hook(tmp_path):
    seen = []

    def correlate(backbone):
        seen.append(backbone.fingerprint)
        return {"tau_c": 0.5 + len(seen)}

    out = train_metric(_config(tmp_path), _data(16, 0), _data(8, 1), backbone=_backbone(), correlation_hook=correlate)
    history = json.loads((out / "train_log.json").read_text())["history"]
    assert [r.get("corr_tau_c") for r in history] == [1.5, 2.5, 3.5]


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    full = train_metric(_config(tmp_path, "full", save_every=2, lr=1e-2), _data(24, 0), _data(8, 1),
                        backbone=_backbone())
    state = full / "state" / "step_00000002"
    assert state.is_dir()
    resumed = train_metric(_config(tmp_path, "resumed", resume=str(state), lr=1e-2), _data(24, 0), _data(8, 1),
                           backbone=_backbone())
    a, b = _weights(full), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    log_a, log_b = (json.loads((p / "train_log.json").read_text()) for p in (full, resumed))
    assert log_a["history"] == log_b["history"]
    # "latest" finds the newest state of the output folder
    latest = train_metric(_config(tmp_path, "full", resume="latest", lr=1e-2, max_steps=6), _data(24, 0),
                          _data(8, 1), backbone=_backbone())
    assert json.loads((latest / "train_log.json").read_text())["steps"] == 6


def test_resume_fails_loudly_when_incomplete_or_from_another_backbone(tmp_path):
    out = train_metric(_config(tmp_path, "src", save_every=2, max_steps=2), _data(16, 0), _data(8, 1),
                       backbone=_backbone())
    state = out / "state" / "step_00000002"
    other = _backbone(vision={"width": 96, "head_width": 32})
    with pytest.raises(InputError, match="does not fit"):
        train_metric(_config(tmp_path, "other", resume=str(state)), _data(16, 0), _data(8, 1), backbone=other)
    broken = tmp_path / "broken"
    shutil.copytree(state, broken)
    (broken / "random_states_0.pkl").unlink()
    with pytest.raises(InputError, match="incomplete.*random_states"):
        train_metric(_config(tmp_path, "again", resume=str(broken)), _data(16, 0), _data(8, 1), backbone=_backbone())


def test_mismatched_counts_and_bad_config():
    with pytest.raises(InputError, match="images=3, captions=2"):
        TensorPositivesDataset(torch.zeros(3, 3, 8, 8), ["a", "b"], torch.zeros(3, 3, 8, 8), ["a", "b", "c"])
    with pytest.raises(InputError, match="mode"):
        MetricTrainConfig(mode="prompt").validate()
    with pytest.raises(InputError, match="micro_batch_size"):
        MetricTrainConfig(batch_size=10, micro_batch_size=4).validate()


def _write_manifest(tmp_path, n=4, missing_line=None):
    from PIL import Image

    (tmp_path / "img").mkdir(exist_ok=True)
    lines = []
    for i in range(n):
        Image.new("RGB", (16, 16), (i * 40, 0, 0)).save(tmp_path / "img" / f"{i}.png")
        Image.new("RGB", (16, 16), (0, i * 40, 0)).save(tmp_path / "img" / f"g{i}.png")
        gen = f"img/missing{i}.png" if missing_line == i + 1 else f"img/g{i}.png"
        lines.append(json.dumps({"image_id": str(i), "caption_id": str(i), "real_image": f"img/{i}.png",
                                 "caption": WORDS[i], "gen_caption": WORDS[i + 1], "gen_image": gen,
                                 "split": "val" if i == n - 1 else "train"}))
    path = tmp_path / "manifest.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_manifest_missing_files_error_with_line_or_counted_skip(tmp_path, capsys):
    path = _write_manifest(tmp_path, n=6, missing_line=3)
    with pytest.raises(InputError, match=r"manifest.jsonl line 3: .*missing2.png"):
        read_manifest(path)
    manifest = read_manifest(path, skip_missing=True)
    assert len(manifest.records) == 5 and len(manifest.skipped) == 1 and "line 3" in manifest.skipped[0]
    status = pacs_cli.main(["train-metric", "--manifest", str(path), "--output-dir", str(tmp_path / "run"),
                            "random_init=true", "batch_size=2", "max_steps=1"])
    err = capsys.readouterr().err
    assert status == 2 and "line 3" in err and "--skip-missing" in err
    assert not (tmp_path / "run" / "checkpoint.safetensors").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().splitlines()[0] + "\n" + json.dumps({"image_id": "x", "caption": "y"}) + "\n")
    with pytest.raises(InputError, match="line 2: missing key"):
        read_manifest(bad)


def test_periodic_correlation_on_an_eval_benchmark(shared_data, tmp_path):
    source = shared_data / "flickr8k"
    data = tmp_path / "flickr8k"
    data.mkdir()
    rows = (source / "ExpertAnnotations.txt").read_text().splitlines()[:24]
    (data / "ExpertAnnotations.txt").write_text("\n".join(rows) + "\n")
    shutil.copy(source / "Flickr8k.token.txt", data / "Flickr8k.token.txt")
    config = _config(tmp_path, max_steps=2, eval_every=2)
    config.correlation.benchmark, config.correlation.every = "flickr8k-expert", 1
    config.correlation.data, config.correlation.images = str(data), str(source / "images")
    from pacs.eval.training_hook import correlation_hook_from_config

    out = train_metric(config, _data(16, 0), _data(8, 1), backbone=_backbone(),
                       correlation_hook=correlation_hook_from_config(config.correlation))
    history = json.loads((out / "train_log.json").read_text())["history"]
    assert len(history) == 2
    for record in history:
        assert -100.0 <= record["corr_tau_c"] <= 100.0 and record["corr_n"] > 0  # Kendall x100


def test_reference_positives_dataset():
    from PIL import Image

    from pacs.metric.common.seeding import seed_everything

    seed_everything(0)
    image = Image.fromarray((torch.arange(48 * 40 * 3) % 251).reshape(40, 48, 3).numpy().astype("uint8"))
    preprocess = _backbone().preprocess
    from pacs.metric.training.data import ReferencePositivesDataset

    dataset = ReferencePositivesDataset([("im1", image, ["a", "b", "c"]), ("im2", image, ["d", "e"])], preprocess)
    assert len(dataset) == 5 and dataset.image_ids == ["im1"] * 3 + ["im2"] * 2
    assert [(dataset[i][1], dataset[i][3]) for i in range(5)] == [("a", "b"), ("b", "c"), ("c", "a"), ("d", "e"),
                                                                    ("e", "d")]
    pixels, _, view, _ = dataset[0]
    assert pixels.shape == view.shape == (3, 32, 32) and not torch.equal(pixels, view)
    with pytest.raises(InputError, match="im3: needs at least two captions"):
        ReferencePositivesDataset([("im3", image, ["only one"])], preprocess)


def test_bf16_mixed_precision_runs_close_to_fp32(tmp_path):
    runs = {}
    for precision in ("bf16", "no"):
        out = train_metric(_config(tmp_path, precision, mixed_precision=precision, lr=1e-2, max_steps=2, eval_every=0),
                           _data(16, 0), _data(8, 1), backbone=_backbone())
        runs[precision] = _weights(out)
    key = "visual.transformer.resblocks.0.mlp.c_fc.weight"
    assert not torch.equal(runs["no"][key], runs["bf16"][key])  # autocast really changed the arithmetic
    assert torch.allclose(runs["no"][key], runs["bf16"][key], atol=5e-2)
    from accelerate import Accelerator

    assert Accelerator().mixed_precision == "no"  # no autocast left behind for later users of accelerate
