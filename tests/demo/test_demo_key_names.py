"""The demo's XE/SCST/metric-stage keys are the recipe trainers' names (issue 40, item 2): `max_steps` for the
training lengths of clip, pacs, xe and scst, xe's `eval_every` and `val_max_images`, scst's `k`. The old names
(`steps`, `val_every`, `val_images`, `beam_size`) still load until 0.8 with one deprecation line per key, and the stages record their
settings under the old names, so a run finished before the rename is reused."""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
import yaml

from pacs.captioner.demo import config as demo_config
from pacs.captioner.demo import hf_captioner
from pacs.captioner.demo.config import DemoConfig
from pacs.captioner.demo.pipeline import (
    REPO_CONFIGS,
    load_demo_config,
    metric_stage_parts,
    scst_stage_settings,
    xe_stage_settings,
)
from pacs.captioner.demo.pooling import run_config
from pacs.metric.common.config import from_dict, load_config
from pacs.metric.common.errors import InputError

SMOKE = REPO_CONFIGS / "demo_smoke.yaml"
# (section, old, new, value): every renamed key, with a value other than demo_smoke's
RENAMES = [("clip", "steps", "max_steps", 9), ("pacs", "steps", "max_steps", 5), ("xe", "steps", "max_steps", 11),
           ("xe", "val_every", "eval_every", 3), ("xe", "val_images", "val_max_images", 4),
           ("scst", "steps", "max_steps", 7), ("scst", "beam_size", "k", 3)]
MARK = "is deprecated (removed in pacs"


def _yaml(path: Path, names: int) -> Path:
    """A demo file deriving from demo_smoke.yaml (new names) that sets every renamed key, in the old (`names`
    1) or the new (2) names."""
    sections: dict[str, list[str]] = {}
    for section, old, new, value in RENAMES:
        sections.setdefault(section, []).append(f"    {old if names == 1 else new}: {value}")
    body = "".join(f"  {section}:\n" + "\n".join(lines) + "\n" for section, lines in sections.items())
    path.write_text(f"_base_: {SMOKE}\ndemo:\n{body}")
    return path


def _load(path, overrides=()) -> tuple[DemoConfig, list[str]]:
    """The config and the messages of the deprecation warnings its loading gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load_demo_config(path, list(overrides))
    return config, [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and MARK in str(w.message)]


def test_old_names_in_a_yaml_load_as_the_new_with_one_warning_per_key(tmp_path: Path) -> None:
    old, said = _load(_yaml(tmp_path / "old.yaml", 1))
    new, quiet = _load(_yaml(tmp_path / "new.yaml", 2))
    assert quiet == []
    assert dataclasses.asdict(old) == dataclasses.asdict(new) and old == new
    assert (new.clip.max_steps, new.pacs.max_steps, new.xe.max_steps, new.xe.eval_every, new.xe.val_max_images,
            new.scst.max_steps, new.scst.k) == (9, 5, 11, 3, 4, 7, 3)
    where = f"{(tmp_path / 'old.yaml').resolve()}:demo"
    assert sorted(said) == sorted(f"{where}: {section}.{old_key} is deprecated (removed in pacs 0.8): use "
                                  f"{section}.{new_key}" for section, old_key, new_key, _ in RENAMES)


@pytest.mark.parametrize("prefix", ["", "demo."])
def test_old_names_in_overrides_load_as_the_new(prefix: str) -> None:
    overrides = [f"{prefix}{section}.{old}={value}" for section, old, _, value in RENAMES]
    old, said = _load(SMOKE, overrides)
    new, quiet = _load(SMOKE, [f"{section}.{new}={value}" for section, _, new, value in RENAMES])
    assert quiet == [] and old == new
    assert sorted(said) == sorted(f"override: {section}.{old_key} is deprecated (removed in pacs 0.8): use "
                                  f"{section}.{new_key}" for section, old_key, new_key, _ in RENAMES)


def test_an_old_override_over_a_yaml_in_the_new_names(tmp_path: Path) -> None:
    config, said = _load(_yaml(tmp_path / "new.yaml", 2), ["xe.steps=12"])
    assert config.xe.max_steps == 12
    assert said == ["override: xe.steps is deprecated (removed in pacs 0.8): use xe.max_steps"]


def test_a_recorded_config_in_the_old_names_loads(tmp_path: Path) -> None:
    """The config.yaml of a run finished before the rename (as `pooling.run_config` reads it) still loads."""
    new = load_demo_config(SMOKE, [])
    recorded = dataclasses.asdict(new)
    for section, old, name, _ in RENAMES:
        recorded[section][old] = recorded[section].pop(name)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(recorded, sort_keys=False))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_config(tmp_path) == new
    assert len([w for w in caught if MARK in str(w.message)]) == len(RENAMES)


def test_both_names_are_one_error_naming_both(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text(f"_base_: {SMOKE}\ndemo:\n  xe:\n    steps: 4\n    max_steps: 5\n")
    with pytest.raises(InputError) as error:
        load_demo_config(both, [])
    message = str(error.value)
    assert "xe.steps and xe.max_steps are the same setting" in message and "\n" not in message
    assert str(both.resolve()) in message
    for overrides in (["xe.val_every=4", "xe.eval_every=5"], ["demo.scst.steps=4", "scst.max_steps=5"]):
        with pytest.raises(InputError, match=r"^override: (xe|scst)\.(val_every|steps) and (xe|scst)\."
                                             r"(eval_every|max_steps) are the same setting"):
            load_demo_config(SMOKE, overrides)


def test_the_removal_release_is_the_class_attribute(tmp_path: Path) -> None:
    @dataclasses.dataclass
    class Later:
        DEPRECATED_ALIASES = {"n": "count"}  # noqa: RUF012
        ALIASES_REMOVED_IN = "0.9"
        count: int = 1

    (tmp_path / "c.yaml").write_text("n: 3\n")
    with pytest.warns(DeprecationWarning, match=r"c\.yaml: n is deprecated \(removed in pacs 0\.9\): use count"):
        assert load_config(Later, tmp_path / "c.yaml").count == 3


def test_recorded_names_are_the_old_names_of_the_aliases() -> None:
    """While the old names load, the names the stages record are exactly the renamed ones, reversed (scst: its
    aliases and its monitors' renames, `SCST_MONITOR_RENAMES`)."""
    for cls, names in demo_config.RECORDED_NAMES.items():
        renamed = {**cls.DEPRECATED_ALIASES, **(demo_config.SCST_MONITOR_RENAMES
                                                if cls is demo_config.ScstStageConfig else {})}
        assert {new: old for old, new in renamed.items()} == names, cls


# 0.6's scst monitor keys -> 0.7's: the hacking monitor takes a recipe's names, the judge's curves `judge_monitor_*`
OLD_MONITORS = {"monitor_every": 4, "monitor_images": 6, "hacking_monitor_every": 3, "hacking_monitor_images": 5}
NEW_MONITORS = {"judge_monitor_every": 4, "judge_monitor_images": 6, "monitor_every": 3, "monitor_images": 5}


def test_a_06_scst_section_loads_its_monitors_under_their_new_names_with_one_line_per_key(tmp_path: Path) -> None:
    old_file, new_file = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old_file.write_text(yaml.safe_dump({"_base_": str(SMOKE), "demo": {"scst": OLD_MONITORS}}))
    new_file.write_text(yaml.safe_dump({"_base_": str(SMOKE), "demo": {"scst": NEW_MONITORS}}))
    with pytest.warns(DeprecationWarning) as caught:
        old = load_demo_config(old_file, [])
    said = sorted(str(w.message) for w in caught if MARK in str(w.message))
    assert said == sorted(f"{old_file}:demo: scst.{key} {MARK} 0.8): use scst.{new} (0.7 gives the hacking "
                          "monitor a recipe's names)" for key, new in demo_config.SCST_MONITOR_RENAMES.items())
    new, quiet = _load(new_file)
    assert quiet == [] and old == new
    assert (new.scst.monitor_every, new.scst.monitor_images, new.scst.judge_monitor_every,
            new.scst.judge_monitor_images) == (3, 5, 4, 6)
    # the stage records them under 0.6's names: a run finished before the rename is reused
    assert scst_stage_settings(new, 1, "cider", {})["scst"] | OLD_MONITORS == scst_stage_settings(new, 1, "cider", {})[
        "scst"]
    record = tmp_path / "run"  # a 0.6 run folder's config.yaml (pooling reads it)
    record.mkdir()
    (record / "config.yaml").write_text(yaml.safe_dump({"scst": OLD_MONITORS}))
    assert run_config(record).scst == from_dict(DemoConfig, {"scst": NEW_MONITORS}).scst


def test_both_layouts_in_one_scst_section_are_refused_and_a_moved_key_is_said(tmp_path: Path, caplog) -> None:
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(yaml.safe_dump({"_base_": str(SMOKE), "demo": {"scst": {"hacking_monitor_every": 3,
                                                                             "judge_monitor_every": 4}}}))
    with pytest.raises(InputError, match=r"scst.hacking_monitor_every \(0.6's name of the hacking monitor\) and "
                                         r"scst.judge_monitor_every \(0.7's names\) in one section"):
        load_demo_config(mixed, [])
    with caplog.at_level("WARNING"):
        config = load_demo_config(SMOKE, ["scst.monitor_every=2"])
    assert config.scst.monitor_every == 2
    assert "override: scst.monitor_every is the hacking monitor since 0.7" in caplog.text


# The settings of the stages (what their fingerprints hash), written out by hand in the names of 0.6.
EXPECTED_CLIP = {"seed": 0, "prompt": "A photo depicts ", "clip": {
    "embed_dim": 64, "vision_width": 96, "vision_layers": 3, "patch_size": 8, "text_width": 64, "text_layers": 2,
    "context_length": 32, "steps": 9, "batch_size": 128, "lr": 1e-3, "weight_decay": 0.1, "eval_every": 50,
    "loss": "infonce"}}
EXPECTED_PACS = {"seed": 0, "prompt": "A photo depicts ", "pacs": {
    "rank": 4, "alpha": 4.0, "steps": 5, "batch_size": 64, "lr": 2e-3, "lambda_v": 0.1, "lambda_t": 0.001,
    "eval_every": 50}}
EXPECTED_XE_SECTION = {"d_model": 128, "n_heads": 4, "encoder_layers": 2, "decoder_layers": 2, "ffn_dim": 256,
                       "dropout": 0.1, "max_length": 20, "steps": 11, "batch_size": 64, "lr": 1e-3,
                       "warmup_steps": 50, "val_every": 3, "val_images": 4}
EXPECTED_SCST = {"seed": 1, "reward": "cider", "scst": {
    "steps": 7, "batch_size": 32, "beam_size": 3, "lr": 5e-5, "samples": "beam", "baseline": "mean",
    "monitor_every": 10, "monitor_images": 100, "hacking_monitor_every": 10, "hacking_monitor_images": 300}}


def test_stage_settings_keep_the_old_names() -> None:
    config = from_dict(DemoConfig, {section: {new: value for s, _, new, value in RENAMES if s == section}
                                    for section in ("clip", "pacs", "xe", "scst")})
    parts = metric_stage_parts(config)
    assert parts["clip"][0] == EXPECTED_CLIP
    assert parts["pacs"][0] == EXPECTED_PACS
    assert xe_stage_settings(config, 0) == {"seed": 0, "xe": EXPECTED_XE_SECTION}
    assert scst_stage_settings(config, 1, "cider", {}) == EXPECTED_SCST
    dropped = {"d_model", "n_heads", "encoder_layers", "decoder_layers", "ffn_dim", "dropout"}
    assert hf_captioner.xe_settings(config) == {key: value for key, value in EXPECTED_XE_SECTION.items()
                                                if key not in dropped}


# the captioner's sizes and the learning rate of 0.6's `xe` section, with values other than demo_smoke's
OLD_XE = {"d_model": 48, "n_heads": 3, "encoder_layers": 2, "decoder_layers": 3, "ffn_dim": 96, "dropout": 0.2,
          "max_length": 18, "lr": 0.004, "warmup_steps": 3}


def test_a_06_xe_section_loads_its_sizes_into_model_and_its_rate_into_the_schedule(tmp_path: Path) -> None:
    """0.6's `xe.d_model` ... `xe.max_length` are 0.7's `model.*` (a recipe's keys), `xe.lr` / `xe.warmup_steps`
    `xe.schedule.peak_lr` / `.warmup_steps`: a file, an override and a recorded run config.yaml load moved, one
    deprecation line per key, and the XE stage records the same settings as before (a finished run is reused)."""
    old_file = tmp_path / "old.yaml"
    old_file.write_text(yaml.safe_dump({"_base_": str(SMOKE), "demo": {"xe": OLD_XE}}))
    old, said = _load(old_file)
    assert sorted(said) == sorted(
        f"{old_file}:demo: xe.{key} {MARK} 0.8): use {place}.{name} (a recipe's key)"
        for key, (place, name) in demo_config.XE_MOVES.items())
    sizes = {key: value for key, value in OLD_XE.items() if key not in ("lr", "warmup_steps")}
    assert dataclasses.asdict(old.model) == sizes
    assert (old.xe.schedule.peak_lr, old.xe.schedule.warmup_steps) == (0.004, 3)
    new_file = tmp_path / "new.yaml"
    new_file.write_text(yaml.safe_dump({"_base_": str(SMOKE), "demo": {
        "model": sizes, "xe": {"schedule": {"peak_lr": 0.004, "warmup_steps": 3}}}}))
    new, quiet = _load(new_file)
    assert quiet == [] and new == old
    by_override, said = _load(SMOKE, [f"xe.{key}={value}" for key, value in OLD_XE.items()])
    assert by_override == old and len(said) == len(OLD_XE)
    # written out by hand: the XE stage's settings in 0.6's flat layout, as a 0.6 run recorded them
    recorded = {**OLD_XE, "steps": old.xe.max_steps, "batch_size": old.xe.batch_size, "val_every": old.xe.eval_every,
                "val_images": old.xe.val_max_images}
    assert xe_stage_settings(new, 0) == {"seed": 0, "xe": recorded}
    run = tmp_path / "run"  # a 0.6 run folder's config.yaml (pooling reads it)
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"xe": OLD_XE}))
    pooled = run_config(run)
    assert (pooled.model, pooled.xe.schedule) == (new.model, new.xe.schedule)


def test_an_xe_key_in_both_places_is_one_error_naming_both(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(yaml.safe_dump({"_base_": str(SMOKE), "demo": {"xe": {"lr": 0.004,
                                                                           "schedule": {"peak_lr": 0.002}}}}))
    with pytest.raises(InputError, match=r"xe.lr \(0.6's name\) and xe.schedule.peak_lr \(0.7's\) in one config"):
        load_demo_config(mixed, [])
