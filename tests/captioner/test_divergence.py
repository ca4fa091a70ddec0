"""A diverging XE / SCST / metric training stops with one TrainingDivergedError and leaves no best/final model."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from captioner_testkit import overlap_reward, tiny_checkpoint, tiny_data, tiny_model_config

from pacs.captioner.modeling.checkpoints import load_captioner, save_captioner
from pacs.captioner.modeling.train_scst import SCSTConfig, train_scst
from pacs.captioner.modeling.train_xe import XEConfig, is_better, train_xe
from pacs.captioner.modeling.training_setup import ScheduleConfig
from pacs.captioner.modeling.vocab import build_vocab
from pacs.metric.common.errors import NonFiniteError, PacsError, TrainingDivergedError
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.training.data import TensorPositivesDataset
from pacs.metric.training.trainer import MetricTrainConfig, train_metric

HERE = Path(__file__).resolve().parent
HUGE_LR = 1e308  # the issue's `xe.lr=1e308`: the first step (from the finite initial model) blows the weights up


def _xe_config(out: Path, **overrides) -> XEConfig:
    values = {"output_dir": str(out), "max_steps": 4, "batch_size": 16, "micro_batch_size": 8,
              "schedule": ScheduleConfig(warmup_steps=0, constant_until=4, decay_until=4, peak_lr=HUGE_LR,
                                         final_lr=1.0),
              "eval_every": 0, "val_beam_size": 1, "val_max_images": 2, "save_every": 0, "log_every": 1,
              "trackers": []}
    values.update(overrides)
    return XEConfig(**values)


def _xe_inputs(tmp_path: Path):
    cache, train, val = tiny_data(tmp_path)
    return build_vocab("word", [c for _, c in train], min_count=1, max_length=8), cache, train, val


def test_xe_with_a_huge_learning_rate_stops_at_the_first_non_finite_loss(tmp_path):
    vocab, cache, train, val = _xe_inputs(tmp_path)
    out = tmp_path / "xe"
    with pytest.raises(TrainingDivergedError) as caught:
        train_xe(_xe_config(out), tiny_model_config(), vocab, cache, train, val)
    message = str(caught.value)
    # step 1 trains the finite initial model (finite loss); its update makes the weights non-finite, so the
    # loss of optimizer step 2 is the first non-finite one and validation/saving never happen (eval/save at 4)
    assert message.startswith("xe: training diverged at optimizer step 2: the training loss is nan")
    assert "Lower the learning rate (schedule.peak_lr=1e+308)" in message and "\n" not in message
    assert isinstance(caught.value, PacsError)
    assert not (out / "best").exists() and not (out / "final").exists()
    assert not (out / "checkpoints").exists()


def test_xe_checks_the_weights_before_validating_and_checkpointing(tmp_path):
    vocab, cache, train, val = _xe_inputs(tmp_path)
    out = tmp_path / "xe"
    with pytest.raises(TrainingDivergedError, match=r"^xe: training diverged at optimizer step 1: weight '.+' is "
                                                    r"not finite after the step"):
        train_xe(_xe_config(out, eval_every=1, save_every=1), tiny_model_config(), vocab, cache, train, val)
    assert not (out / "best").exists() and not (out / "final").exists() and not (out / "checkpoints").exists()


def test_a_non_finite_validation_score_never_makes_the_best_model(tmp_path):
    vocab, cache, train, val = _xe_inputs(tmp_path)
    scores = iter([float("nan"), 5.0, float("inf"), float("nan")])
    config = _xe_config(tmp_path / "xe", eval_every=1, save_every=2,
                        schedule=ScheduleConfig(warmup_steps=0, constant_until=4, decay_until=4, peak_lr=1e-3,
                                                final_lr=1e-3))
    result = train_xe(config, tiny_model_config(), vocab, cache, train, val,
                      validate=lambda captions, references: next(scores))
    assert (result.best_step, result.best_score) == (2, 5.0)  # the only finite score, at step 2
    assert load_captioner(result.best_dir)[2]["provenance"]["step"] == 2
    assert [is_better(math.nan, None), is_better(math.inf, 1.0), is_better(2.0, None), is_better(1.0, 2.0)] == [
        False, False, True, False]


def test_scst_with_a_huge_learning_rate_stops_and_writes_no_final_model(tmp_path):
    cache, train, _ = tiny_data(tmp_path)
    init = tiny_checkpoint(tmp_path, dropout=0.0)
    items = list({image_id: [caption] for image_id, caption in train}.items())
    out = tmp_path / "scst"
    config = SCSTConfig(output_dir=str(out), reward="overlap", lr=HUGE_LR, batch_size=8, micro_batch_size=4,
                        max_steps=3, k=3, save_every=0, trackers=[])
    with pytest.raises(TrainingDivergedError) as caught:
        train_scst(config, init, cache, items, overlap_reward)
    message = str(caught.value)
    assert message.startswith("scst[overlap]: training diverged at optimizer step 2: the training loss is nan")
    assert "Lower the learning rate (lr=1e+308)" in message
    assert not (out / "final").exists() and not (out / "checkpoints").exists()


def test_scst_refuses_an_init_checkpoint_with_non_finite_weights_and_save_refuses_them(tmp_path):
    cache, train, _ = tiny_data(tmp_path)
    init = tiny_checkpoint(tmp_path, dropout=0.0)
    model, vocab, info = load_captioner(init)
    name = next(iter(dict(model.named_parameters())))
    with torch.no_grad():
        dict(model.named_parameters())[name].view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteError, match=rf"refusing to save a captioner with non-finite weights \('{name}'\)"):
        save_captioner(tmp_path / "broken", model, vocab, info["features"])
    assert not (tmp_path / "broken").exists() and not list(tmp_path.glob(".broken*"))
    from safetensors.torch import load_file, save_file  # the same folder with a NaN written behind pacs' back

    weights = load_file(str(init / "model.safetensors"))
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, str(init / "model.safetensors"))
    config = SCSTConfig(output_dir=str(tmp_path / "scst"), reward="overlap", batch_size=8, micro_batch_size=8,
                        max_steps=1, k=2, trackers=[])
    items = list({image_id: [caption] for image_id, caption in train}.items())
    with pytest.raises(NonFiniteError, match=rf"init_checkpoint {init}: weight '{name}' is not finite"):
        train_scst(config, init, cache, items, overlap_reward)


def _positives(n: int, seed: int) -> TensorPositivesDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 32, 32, generator=generator)
    captions = [f"a photo of thing {i % 5}" for i in range(n)]
    return TensorPositivesDataset(images, captions, images + 0.1, [c.upper() for c in captions])


def _metric_backbone():
    config = tiny_clip_config(vision_cfg={"image_size": 32, "patch_size": 8}, text_cfg={"context_length": 16})
    return build_backbone_from_config(config, seed=0, name="tiny-diverge")


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_metric_training_with_a_huge_learning_rate_stops_and_writes_nothing(tmp_path, mode):
    out = tmp_path / "metric"
    config = MetricTrainConfig(mode=mode, random_init=True, batch_size=4, max_steps=4, eval_every=0, log_every=0,
                               lr=HUGE_LR, seed=0, output_dir=str(out))
    with pytest.raises(TrainingDivergedError) as caught:
        train_metric(config, _positives(16, 0), _positives(8, 1), backbone=_metric_backbone())
    message = str(caught.value)
    assert message.startswith(f"metric training ({mode}): training diverged at optimizer step 2: the training loss "
                              "is nan")
    assert "Lower the learning rate (lr=1e+308)" in message
    assert not (out / "checkpoint.safetensors").exists() and not (out / "train_log.json").exists()


def test_metric_training_writes_an_undefined_correlation_as_null(tmp_path):
    out = tmp_path / "metric"
    config = MetricTrainConfig(mode="lora", random_init=True, batch_size=4, max_steps=2, eval_every=1, log_every=0,
                               lr=1e-3, seed=0, output_dir=str(out))
    train_metric(config, _positives(16, 0), _positives(8, 1), backbone=_metric_backbone(),
                 correlation_hook=lambda backbone: {"tau": float("nan"), "n": 8})
    import json

    history = json.loads((out / "train_log.json").read_text(encoding="utf-8"))["history"]
    assert [(record["corr_tau"], record["corr_n"]) for record in history] == [(None, 8.0)] * 3


@pytest.mark.slow
def test_two_processes_stop_together_without_deadlock(tmp_path):
    """XE, SCST and metric training with a huge lr on 2 gloo processes: every rank raises at the same step."""
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(HERE / "divergence_driver.py"), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=400, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("DIVERGED "))
    expected = {"xe": "xe: training diverged at optimizer step 2: the training loss is nan",
                "scst": "scst[overlap]: training diverged at optimizer step 2: the training loss is nan",
                "metric": "metric training (lora): training diverged at optimizer step 2: the training loss is nan"}
    assert [line.split(" ", 3)[1:3] for line in lines] == [[name, f"rank={rank}"] for name in sorted(expected)
                                                          for rank in (0, 1)], done.stdout[-2000:]
    for line in lines:
        assert line.split(" ", 3)[3].startswith(expected[line.split(" ")[1]])
    assert not (tmp_path / "xe" / "best").exists() and not (tmp_path / "scst" / "final").exists()
    assert not (tmp_path / "metric" / "checkpoint.safetensors").exists()
