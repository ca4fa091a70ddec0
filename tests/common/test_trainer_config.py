"""The trainers' shared base configuration (issue 14 item 4): one set of names, deprecated aliases for a release."""
from __future__ import annotations

import dataclasses
import logging
import typing
import warnings
from pathlib import Path

import pytest

from pacs.captioner.modeling.train_scst import SCSTConfig
from pacs.captioner.modeling.train_xe import XEConfig
from pacs.captioner.orchestration.recipe_stages import trainer_settings
from pacs.metric.common.config import dump_yaml, from_dict, load_config, load_yaml
from pacs.metric.common.errors import InputError
from pacs.metric.common.trainer_config import TrainerConfig, is_due, resume_target
from pacs.metric.training.trainer import MetricTrainConfig

TRAINERS = (MetricTrainConfig, XEConfig, SCSTConfig)
SHARED = {"output_dir", "seed", "mixed_precision", "resume", "save_every", "eval_every", "log_every"}


@dataclasses.dataclass
class Run:
    """A config with two trainer sections, as the recipe pipeline has."""

    xe: XEConfig = dataclasses.field(default_factory=XEConfig)
    scst: SCSTConfig = dataclasses.field(default_factory=SCSTConfig)


def test_every_trainer_config_has_the_shared_fields_with_the_same_names_and_types() -> None:
    assert {f.name for f in dataclasses.fields(TrainerConfig)} == SHARED
    base_hints = typing.get_type_hints(TrainerConfig, include_extras=True)
    for cls in TRAINERS:
        assert issubclass(cls, TrainerConfig), cls
        names = {f.name for f in dataclasses.fields(cls)}
        assert SHARED <= names, (cls, SHARED - names)
        assert not names & {"resume_from", "checkpoint_every", "val_every"}, cls
        hints = typing.get_type_hints(cls, include_extras=True)
        for name in SHARED:
            assert hints[name] == base_hints[name], (cls, name, hints[name])


def test_defaults_each_trainer_keeps() -> None:
    # the values each trainer had before the rename (val_every / checkpoint_every / resume_from included)
    assert (XEConfig().eval_every, XEConfig().save_every, XEConfig().log_every, XEConfig().seed) == (1000, 1000, 10, 42)
    assert (SCSTConfig().eval_every, SCSTConfig().save_every, SCSTConfig().log_every) == (0, 100, 1)
    metric = MetricTrainConfig()
    assert (metric.eval_every, metric.save_every, metric.log_every, metric.seed, metric.resume) == (100, 0, 10, 0, None)
    assert (XEConfig().resume, SCSTConfig().output_dir, metric.output_dir) == (None, "runs/scst", "runs/metric")


def test_yaml_with_old_names_loads_as_the_new_names_and_warns(tmp_path: Path, caplog) -> None:
    old = tmp_path / "old.yaml"
    old.write_text("xe:\n  val_every: 7\n  checkpoint_every: 3\n  resume_from: ckpt/step-5\n"
                   "scst:\n  checkpoint_every: 9\n")
    new = tmp_path / "new.yaml"
    new.write_text("xe:\n  eval_every: 7\n  save_every: 3\n  resume: ckpt/step-5\nscst:\n  save_every: 9\n")
    with caplog.at_level(logging.WARNING, logger="pacs.metric.common.config"), pytest.warns(DeprecationWarning) as record:
        loaded = load_config(Run, old)
    assert loaded == load_config(Run, new)
    assert (loaded.xe.eval_every, loaded.xe.save_every, loaded.xe.resume) == (7, 3, "ckpt/step-5")
    assert loaded.scst.save_every == 9
    messages = [str(w.message) for w in record if issubclass(w.category, DeprecationWarning)]
    expected = f"{old}: xe.val_every is deprecated (removed in pacs 0.4): use xe.eval_every"
    assert expected in messages
    assert f"{old}: scst.checkpoint_every is deprecated (removed in pacs 0.4): use scst.save_every" in messages
    assert expected in caplog.messages
    assert len(caplog.messages) == 4  # one per old key


def test_old_and_new_name_together_is_an_error_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "both.yaml"
    path.write_text("xe:\n  val_every: 7\n  eval_every: 8\n")
    with pytest.raises(InputError) as error, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        load_config(Run, path)
    assert str(path) in str(error.value)
    assert "xe.val_every and xe.eval_every" in str(error.value)
    with pytest.raises(InputError, match="checkpoint_every and save_every"):
        from_dict(SCSTConfig, {"checkpoint_every": 1, "save_every": 2})
    with pytest.raises(InputError, match="resume_from and resume"):
        XEConfig(resume_from="a", resume="b")


def test_overrides_take_old_names_with_a_warning(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="pacs.metric.common.config"), pytest.warns(DeprecationWarning) as record:
        config = load_config(Run, None, ["xe.val_every=5", "scst.resume_from=latest"])
    assert (config.xe.eval_every, config.scst.resume) == (5, "latest")
    assert "override: xe.val_every is deprecated (removed in pacs 0.4): use xe.eval_every" in [
        str(w.message) for w in record]
    assert any("override: scst.resume_from" in message for message in caplog.messages)
    # a file in the old names and an override in the new name: the override wins, no conflict
    path = tmp_path / "old.yaml"
    path.write_text("xe:\n  val_every: 7\n")
    with pytest.warns(DeprecationWarning):
        config = load_config(Run, path, ["xe.eval_every=11"])
    assert config.xe.eval_every == 11
    with pytest.raises(InputError, match="xe.val_every and xe.eval_every"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        load_config(Run, None, ["xe.val_every=5", "xe.eval_every=6"])


def test_attribute_and_keyword_access_by_old_names() -> None:
    config = XEConfig(eval_every=12, save_every=4, resume="r")
    with pytest.warns(DeprecationWarning, match="XEConfig.val_every is deprecated"):
        assert config.val_every == 12
    with pytest.warns(DeprecationWarning, match="checkpoint_every"):
        assert config.checkpoint_every == 4
    with pytest.warns(DeprecationWarning, match="resume_from"):
        assert config.resume_from == "r"
    with pytest.warns(DeprecationWarning, match="SCSTConfig.checkpoint_every"):
        scst = SCSTConfig(checkpoint_every=6)
    assert scst.save_every == 6
    with pytest.warns(DeprecationWarning):
        scst.checkpoint_every = 8
    assert scst.save_every == 8 and "checkpoint_every" not in vars(scst)
    with pytest.raises(AttributeError):
        config.no_such_setting  # noqa: B018


def test_saved_configs_use_the_new_names_and_reload_without_warnings(tmp_path: Path) -> None:
    dump_yaml(XEConfig(eval_every=9, save_every=2), tmp_path / "xe.yaml")
    saved = load_yaml(tmp_path / "xe.yaml")
    assert (saved["eval_every"], saved["save_every"], saved["resume"]) == (9, 2, None)
    assert not {"val_every", "checkpoint_every", "resume_from"} & set(saved)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert load_config(XEConfig, tmp_path / "xe.yaml") == XEConfig(eval_every=9, save_every=2)


def test_shared_field_checks_apply_to_every_trainer() -> None:
    for cls in TRAINERS:
        with pytest.raises(InputError, match="mixed_precision must be no, fp16 or bf16, got 'fp8'"):
            from_dict(cls, {"mixed_precision": "fp8", **({"random_init": True} if cls is MetricTrainConfig else {})})
        with pytest.raises(InputError, match=r"save_every=-1: expected int >= 0"):
            from_dict(cls, {"save_every": -1})
    with pytest.raises(InputError, match="SCST does not validate while training"):
        from_dict(SCSTConfig, {"eval_every": 5})
    assert from_dict(XEConfig, {"eval_every": 0, "save_every": 0, "log_every": 0}).eval_every == 0  # 0: off


def test_cadence_rule_and_resume_target() -> None:
    assert [step for step in range(1, 11) if is_due(step, 4)] == [4, 8]
    assert [step for step in range(1, 11) if is_due(step, 0)] == []
    assert [step for step in range(1, 4) if is_due(step, 1)] == [1, 2, 3]
    assert [resume_target(value) for value in (None, "", "latest", "runs/xe/checkpoints/step-00000004")] == [
        None, None, None, "runs/xe/checkpoints/step-00000004"]


def test_xe_and_scst_fingerprints_keep_their_former_setting_names() -> None:
    # a pipeline run before the rename must not re-run XE or SCST: XE's validation cadence is fingerprinted under
    # its former name val_every, SCST's eval_every (always 0, SCST had none) is left out
    xe = trainer_settings(XEConfig(eval_every=250, save_every=5, resume="x"))
    assert xe["val_every"] == 250
    assert not {"eval_every", "save_every", "resume", "checkpoint_every", "resume_from"} & set(xe)
    scst = trainer_settings(SCSTConfig())
    assert not {"eval_every", "val_every", "save_every", "resume"} & set(scst)
    assert scst["seed"] == 42 and scst["mixed_precision"] == "no"


def test_a_file_in_old_names_over_a_base_in_new_names(tmp_path: Path) -> None:
    # each file is renamed on its own, so a user's config in the old names still derives from the updated recipes
    (tmp_path / "base.yaml").write_text("xe:\n  eval_every: 1000\n  save_every: 1000\n  max_steps: 40\n")
    (tmp_path / "mine.yaml").write_text("_base_: base.yaml\nxe:\n  checkpoint_every: 20\n")
    with pytest.warns(DeprecationWarning, match="mine.yaml: xe.checkpoint_every is deprecated"):
        config = load_config(Run, tmp_path / "mine.yaml")
    assert (config.xe.save_every, config.xe.eval_every, config.xe.max_steps) == (20, 1000, 40)
