"""Training trackers by name (`xe.trackers` / `scst.trackers`, issue 42 item 7): accelerate's `log_with`.

TensorBoard is installed here and tested for real (its event file read back); wandb and mlflow are tested for real
only where installed, else their refusal and the `log_with` value handed to accelerate.
"""
from __future__ import annotations

import importlib.util
import logging

import pytest

from pacs.captioner.modeling import training_setup
from pacs.captioner.modeling.train_scst import SCSTConfig
from pacs.captioner.modeling.train_xe import XEConfig
from pacs.captioner.modeling.training_setup import (
    CSVTracker,
    finish_trackers,
    make_accelerator,
    start_trackers,
    tracker_names,
)
from pacs.captioner.orchestration.stage_fingerprints import trainer_settings
from pacs.metric.common.config import from_dict
from pacs.metric.common.errors import InputError

TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


def test_an_unknown_tracker_is_one_line_with_did_you_mean():
    with pytest.raises(InputError) as error:
        from_dict(XEConfig, {"trackers": ["tensorbord"]}, "recipe.yaml")
    assert str(error.value) == ("recipe.yaml: trackers: unknown tracker 'tensorbord' (did you mean 'tensorboard'? "
                                "known: aim, tensorboard, wandb, trackio, comet_ml, mlflow, clearml, dvclive, swanlab)")
    with pytest.raises(InputError, match=r"unknown tracker 'wandbb' \(did you mean 'wandb'\? known: "):
        from_dict(SCSTConfig, {"trackers": ["wandbb"]}, "recipe.yaml")


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_tracker_not_installed_is_refused_naming_the_package(name):
    if importlib.util.find_spec(name) is not None:
        pytest.skip(f"{name} is installed here")
    with pytest.raises(InputError) as error:
        from_dict(XEConfig, {"trackers": ["tensorboard", name]}, "recipe.yaml")
    assert str(error.value) == f"recipe.yaml: trackers: {name} is not installed (pip install {name})"


def test_the_named_trackers_are_what_accelerate_gets(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(training_setup.importlib.util, "find_spec",  # wandb and mlflow "installed"
                        lambda name, *a: object() if name in ("wandb", "mlflow") else real_find_spec(name, *a))
    seen = {}

    def build_accelerator(device, mixed_precision, **kwargs):
        seen.update(kwargs)

    monkeypatch.setattr(training_setup, "build_accelerator", build_accelerator)
    config = from_dict(SCSTConfig, {"trackers": ["wandb", "mlflow", "wandb"]}, "recipe.yaml")
    assert config.trackers == ["wandb", "mlflow"]
    make_accelerator(tmp_path, "log.csv", ["loss"], trackers=config.trackers)
    csv, *named = seen["log_with"]
    assert isinstance(csv, CSVTracker) and named == ["wandb", "mlflow"]
    assert seen["project_dir"] == str(tmp_path)


def test_the_default_is_tensorboard_when_installed_and_the_bool_key_still_works(caplog):
    assert from_dict(XEConfig, {}, "recipe.yaml").trackers is None
    assert tracker_names(None) == (["tensorboard"] if TENSORBOARD else [])
    with caplog.at_level(logging.WARNING, logger="pacs.captioner.modeling.training_setup"):
        off = from_dict(XEConfig, {"tensorboard": False}, "recipe.yaml")
    assert off.trackers == [] and off.tensorboard is None
    assert caplog.messages == ["xe.tensorboard is deprecated and goes in 0.8: write xe.trackers: []"]
    if TENSORBOARD:
        assert tracker_names([], True, "scst") == ["tensorboard"]


def test_trackers_do_not_enter_a_stage_fingerprint():
    plain = trainer_settings(from_dict(XEConfig, {}, "recipe.yaml"))
    assert trainer_settings(from_dict(XEConfig, {"trackers": []}, "recipe.yaml")) == plain
    assert "trackers" not in plain and "tensorboard" not in plain


@pytest.mark.skipif(not TENSORBOARD, reason="tensorboard is not installed")
def test_tensorboard_receives_the_logged_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accelerator = make_accelerator(tmp_path, "log.csv", ["loss"], trackers=["tensorboard"], device="cpu")
    start_trackers(accelerator, "xe", {"lr": 0.1}, None)
    accelerator.log({"loss": 1.5}, step=1)
    accelerator.log({"loss": 0.25}, step=2)
    finish_trackers(accelerator)
    (events,) = (tmp_path / "xe").glob("events.out.tfevents.*")
    reader = EventAccumulator(str(events))
    reader.Reload()
    assert [(e.step, e.value) for e in reader.Scalars("loss")] == [(1, 1.5), (2, 0.25)]
    assert (tmp_path / "log.csv").read_text().splitlines() == ["step,loss", "1,1.5", "2,0.25"]

    quiet = tmp_path / "quiet"
    accelerator = make_accelerator(quiet, "log.csv", ["loss"], trackers=[], device="cpu")
    start_trackers(accelerator, "xe", {}, None)
    accelerator.log({"loss": 1.5}, step=1)
    finish_trackers(accelerator)
    assert sorted(p.name for p in quiet.iterdir()) == ["log.csv"]
