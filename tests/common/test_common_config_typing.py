"""Config values are typed and validated when loaded (issue 11 item 3): every config class, YAML and overrides."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pacs.metric.common.config import PositiveInt, check_batch_split, load_config
from pacs.metric.common.errors import InputError

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "configs" / "coco_vitb32_pac-spp.yaml"


@dataclasses.dataclass
class Inner:
    lr: float = 1e-4
    steps: PositiveInt = 10
    flag: bool = False


@dataclasses.dataclass
class Outer:
    mode: str = "x"
    inner: Inner = dataclasses.field(default_factory=Inner)
    tags: list[str] = dataclasses.field(default_factory=list)
    limit: int | None = 3


def test_exponent_without_dot_is_a_float_in_overrides_and_yaml(tmp_path: Path) -> None:
    from pacs.captioner.orchestration.pipeline import PipelineConfig

    config = load_config(PipelineConfig, RECIPE, ["scst.lr=1e-6"])
    assert type(config.scst.lr) is float and config.scst.lr == 0.000001
    (tmp_path / "run.yaml").write_text(f"_base_: {RECIPE}\nscst:\n  lr: 2e-6\n")
    config = load_config(PipelineConfig, tmp_path / "run.yaml")
    assert type(config.scst.lr) is float and config.scst.lr == 0.000002
    assert config.xe.max_steps == 20000  # the rest still comes from the _base_ chain


def test_values_from_base_files_are_typed_too(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("inner:\n  lr: 5e-3\n  steps: '7'\n")
    (tmp_path / "child.yaml").write_text("_base_: base.yaml\nmode: y\n")
    config = load_config(Outer, tmp_path / "child.yaml")
    assert config.inner == Inner(lr=0.005, steps=7, flag=False) and config.mode == "y"


def test_not_an_int_names_key_value_and_type() -> None:
    from pacs.captioner.orchestration.pipeline import PipelineConfig

    with pytest.raises(InputError) as error:
        load_config(PipelineConfig, RECIPE, ["xe.max_steps=ten"])
    message = str(error.value)
    assert "coco_vitb32_pac-spp.yaml" in message and "xe.max_steps='ten'" in message and "expected int" in message
    with pytest.raises(InputError, match=r"xe\.max_steps=3\.5: expected int"):
        load_config(PipelineConfig, RECIPE, ["xe.max_steps=3.5"])


def test_every_bad_value_is_named_in_one_error() -> None:
    from pacs.captioner.orchestration.pipeline import PipelineConfig

    with pytest.raises(InputError) as error:
        load_config(PipelineConfig, RECIPE, ["scst.lr=abc", "xe.eval_every=often"])
    assert "scst.lr='abc': expected float" in str(error.value)
    assert "xe.eval_every='often': expected int" in str(error.value)


def test_nested_list_optional_and_bool_are_coerced(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("inner:\n  flag: 'false'\n  steps: 4.0\ntags: [1, 2.5]\n")
    config = load_config(Outer, tmp_path / "c.yaml", ["limit=", "mode=no"])
    assert config.inner.flag is False and config.inner.steps == 4 and type(config.inner.steps) is int
    assert config.tags == ["1", "2.5"]
    assert config.limit is None
    assert config.mode == "no"  # YAML 1.2: `no` is a string, not False
    assert load_config(Outer, None, ["limit=12", "inner.flag=true"]).limit == 12
    assert load_config(Outer, None, ["inner.flag=true"]).inner.flag is True


@pytest.mark.parametrize("override, pattern", [
    ("inner.flag=maybe", r"inner\.flag='maybe': expected bool"),
    ("inner.steps=true", r"inner\.steps=True: expected int >= 1, got a bool"),
    ("inner.steps=0", r"inner\.steps=0: expected int >= 1"),
    ("tags=abc", r"tags='abc': expected list of str"),
    ("inner=3", r"inner=3: expected section"),
])
def test_values_that_do_not_fit_are_refused(override: str, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern):
        load_config(Outer, None, [override])


@pytest.mark.parametrize("override, pattern", [
    ("scst.lr=0", r"scst\.lr=0: expected float > 0"),
    ("scst.lr=-1e-6", r"scst\.lr=-1e-06: expected float > 0"),
    ("xe.schedule.peak_lr=0", r"xe\.schedule\.peak_lr=0: expected float > 0"),
    ("xe.batch_size=0", r"xe\.batch_size=0: expected int >= 1"),
    ("scst.micro_batch_size=-4", r"scst\.micro_batch_size=-4: expected int >= 0"),
    ("xe.max_steps=0", r"xe\.max_steps=0: expected int >= 1"),
    ("scst.epochs=0", r"scst\.epochs=0: expected int >= 1"),
    ("scst.k=0", r"scst\.k=0: expected int >= 1"),
    ("model.dropout=1.5", r"model\.dropout=1\.5: expected float >= 0 and < 1"),
    ("model.n_heads=3", r"model: d_model=512 is not divisible by n_heads=3"),
    ("xe.batch_size=100", r"xe: batch_size=100 must be a multiple of micro_batch_size \(128\)"),
    ("scst.baseline=median", r"scst: baseline='median': unknown SCST baseline"),
    ("evaluation.test_sets={coco: {nmae: x}}", r"evaluation: test_sets\.coco: unknown key 'nmae'"),
])
def test_pipeline_rejects_obviously_wrong_values(override: str, pattern: str) -> None:
    from pacs.captioner.orchestration.pipeline import PipelineConfig

    with pytest.raises(InputError, match=pattern):
        load_config(PipelineConfig, RECIPE, [override])


def test_demo_config_is_typed_and_validated() -> None:
    from pacs.captioner.demo.pipeline import load_demo_config

    config = load_demo_config(None, ["scst.lr=3e-5", "demo.clip.max_steps=5.0"])
    assert type(config.scst.lr) is float and config.scst.lr == 0.00003 and type(config.clip.max_steps) is int
    with pytest.raises(InputError, match=r"demo\.yaml:demo: xe\.max_steps='ten': expected int >= 1"):
        load_demo_config(None, ["xe.max_steps=ten"])
    with pytest.raises(InputError, match=r"pacs\.lr=-0\.1: expected float > 0"):
        load_demo_config(None, ["pacs.lr=-0.1"])


def test_metric_training_config_is_typed_and_validated() -> None:
    from pacs.metric.training.trainer import MetricTrainConfig

    config = load_config(MetricTrainConfig, REPO / "recipes" / "configs" / "train_metric.yaml", ["lr=5e-5"])
    assert type(config.lr) is float and config.lr == 0.00005
    with pytest.raises(InputError, match=r"lr=0: expected float > 0"):
        load_config(MetricTrainConfig, None, ["lr=0"])
    with pytest.raises(InputError, match=r"lora\.rank=0: expected int >= 1"):
        load_config(MetricTrainConfig, None, ["lora.rank=0"])
    with pytest.raises(InputError, match=r"batch_size must be >= 2"):  # its validate() now runs at load
        load_config(MetricTrainConfig, None, ["batch_size=1"])


def test_positives_config_is_typed_and_validated() -> None:
    from pacs.metric.training.positives import PositivesConfig

    assert load_config(PositivesConfig, None, ["batch_size='16'"]).batch_size == 16
    with pytest.raises(InputError, match=r"batch_size=0: expected int >= 1"):
        load_config(PositivesConfig, None, ["batch_size=0"])
    with pytest.raises(InputError, match=r"dtype='float8': expected one of float32, float16, bfloat16"):
        load_config(PositivesConfig, None, ["dtype=float8"])


def test_check_batch_split() -> None:
    assert check_batch_split("xe", 64, 16, 2) == 2
    assert check_batch_split("xe", 64, 64) == 1
    with pytest.raises(InputError, match=r"xe: batch_size=64 must be a multiple of micro_batch_size \(16\) × "
                                         r"processes \(3\) = 48"):
        check_batch_split("xe", 64, 16, 3)
    with pytest.raises(InputError, match=r"scst: batch_size=32 must be a multiple of micro_batch_size \(24\)$"):
        check_batch_split("scst", 32, 24)


@pytest.mark.parametrize("config, override", [
    ("demo_smoke.yaml", "xe.max_steps=ten"),
    ("coco_vitb32_pac-spp.yaml", "xe.max_steps=ten"),
])
def test_pacs_train_refuses_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            config: str, override: str) -> None:
    from pacs import cli as pacs_cli
    out = tmp_path / "out"
    place = f"demo.runs_dir={out}" if config.startswith("demo") else f"run_dir={out}"
    status = pacs_cli.main(["train", "--config", str(REPO / "recipes" / "configs" / config), place, override])
    assert status == 2
    err = capsys.readouterr().err
    assert "'ten': expected int >= 1" in err and override.split("=")[0] in err
    assert not out.exists()
