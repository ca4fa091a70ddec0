"""The trainers' shared base configuration (issue 14 item 4): one set of names; the 0.3 names are gone (issue 40)."""
from __future__ import annotations

import dataclasses
import typing
import warnings
from pathlib import Path

import pytest

from pacs.captioner.modeling.train_scst import SCSTConfig
from pacs.captioner.modeling.train_xe import XEConfig
from pacs.captioner.orchestration.stage_fingerprints import trainer_settings
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


def test_the_names_before_0_3_are_unknown_keys_in_yaml_and_overrides(tmp_path: Path) -> None:
    # resume_from / checkpoint_every / val_every were aliases until 0.4: now each is an unknown key, one line
    # naming the file (or the override), the section and the key
    old = tmp_path / "old.yaml"
    old.write_text("xe:\n  val_every: 7\n")
    with pytest.raises(InputError) as error, warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        load_config(Run, old)
    message = str(error.value)
    assert message == f"{old}: xe: unknown key 'val_every' (did you mean 'eval_every'?)"
    assert "\n" not in message
    with pytest.raises(InputError, match=r"scst: unknown key 'resume_from' \(did you mean 'resume'\?\)"):
        load_config(Run, None, ["scst.resume_from=latest"])
    with pytest.raises(InputError, match="unknown key 'checkpoint_every'"):
        from_dict(SCSTConfig, {"checkpoint_every": 1})
    (tmp_path / "base.yaml").write_text("xe:\n  eval_every: 1000\n  save_every: 1000\n  max_steps: 40\n")
    (tmp_path / "mine.yaml").write_text("_base_: base.yaml\nxe:\n  checkpoint_every: 20\n")
    with pytest.raises(InputError, match="mine.yaml: xe: unknown key 'checkpoint_every'"):
        load_config(Run, tmp_path / "mine.yaml")


def test_the_names_before_0_3_are_neither_keywords_nor_attributes() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'resume_from'"):
        XEConfig(resume_from="a")
    with pytest.raises(TypeError, match="unexpected keyword argument 'checkpoint_every'"):
        SCSTConfig(checkpoint_every=6)
    config = XEConfig(eval_every=12, save_every=4, resume="r")
    for old in ("val_every", "checkpoint_every", "resume_from"):
        assert not hasattr(config, old), old
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
