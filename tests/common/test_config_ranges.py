"""Every config key has a range, checked at load (issue 21, item A): one bad value per key, the boundaries that pass.

The four configs that `--config` files describe (`DemoConfig`, `PipelineConfig`, `MetricTrainConfig`,
`PositivesConfig`) are walked field by field: a number without a range fails `test_every_number_has_a_range`,
and every numeric key has a row below with a value outside its range, refused at load with one error that names
the file, the key and the range. `pacs train --config demo_smoke KEY=BAD` fails the same way before any work.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pacs import cli as pacs_cli
from pacs.captioner.demo.config import DemoConfig
from pacs.captioner.demo.pipeline import load_demo_config
from pacs.captioner.orchestration.pipeline_config import PipelineConfig
from pacs.metric.common.config import _hints, _strip, load_config
from pacs.metric.common.errors import InputError
from pacs.metric.training.config import MetricTrainConfig
from pacs.metric.training.positives import PositivesConfig

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "configs" / "coco_vitb32_pac-spp.yaml"
SMOKE = REPO / "recipes" / "configs" / "demo_smoke.yaml"

# (key, a value outside its range); the demo's through recipes/configs/demo_smoke.yaml
DEMO_BAD = [
    ("correlation.bootstrap_resamples", 0), ("guarded.rep_penalty", -0.1), ("guarded.length_penalty", -0.1),
    ("scst.monitor_every", -1), ("scst.monitor_images", -1), ("guarded.monitor_every", -1),
    ("guarded.monitor_images", -1),
    ("seed", -1), ("seed", 2**32), ("threads", 0), ("threads", -2), ("parallel_seeds", 0),
    ("world.seed", -1), ("world.image_size", 0), ("world.max_objects", 0), ("world.max_objects", 4),
    ("world.n_references", 1), ("world.relation_prob", -0.1), ("world.relation_prob", 1.5),
    ("world.noise_max", -1.0), ("world.web_distractor_prob", 1.0), ("world.web_distractor_prob", -0.2),
    ("world.web_noise_word_prob", 1.01), ("world.n_train", 0), ("world.n_val", 0), ("world.n_test", 0),
    ("world.web_captions_per_image", 0),
    ("clip.embed_dim", 0), ("clip.vision_width", 31), ("clip.vision_layers", 0), ("clip.patch_size", 0),
    ("clip.text_width", 1), ("clip.text_layers", 0), ("clip.context_length", 0), ("clip.max_steps", 0),
    ("clip.batch_size", 1), ("clip.micro_batch_size", -1), ("clip.lr", 0.0), ("clip.lr", -1e-3),
    ("clip.weight_decay", -0.1), ("clip.eval_every", -1),
    ("pacs.rank", 0), ("pacs.alpha", 0.0), ("pacs.max_steps", 0), ("pacs.batch_size", 1), ("pacs.micro_batch_size", -1),
    ("pacs.lr", 0.0), ("pacs.lambda_v", -0.1), ("pacs.lambda_t", -0.001), ("pacs.eval_every", -1),
    ("correlation.n_images", 0), ("correlation.candidates_per_image", 1),
    ("model.d_model", 0), ("model.n_heads", 0), ("model.encoder_layers", 0), ("model.decoder_layers", 0),
    ("model.ffn_dim", 0), ("model.dropout", 1.5), ("model.dropout", 1.0), ("model.dropout", -0.1),
    ("model.max_length", 0), ("xe.max_steps", 0),
    ("xe.batch_size", 0), ("xe.micro_batch_size", -1), ("xe.schedule.peak_lr", 0.0), ("xe.schedule.warmup_steps", -1),
    ("xe.log_every", 0), ("xe.eval_every", 0), ("xe.val_max_images", -1),
    ("scst.max_steps", 0), ("scst.batch_size", 0), ("scst.micro_batch_size", -1), ("scst.k", 0),
    ("scst.lr", 0.0), ("scst.log_every", 0), ("scst.judge_monitor_every", -1), ("scst.judge_monitor_images", -1),
    ("evaluate.beam_size", 0), ("evaluate.gallery_size", -1), ("evaluate.bootstrap_resamples", 0),
    ("captioner.hidden_size", 1), ("captioner.layers", 0), ("captioner.heads", 0), ("captioner.intermediate_size", 0),
    ("captioner.vision_hidden_size", 1), ("captioner.vision_layers", 0), ("captioner.vision_heads", 0),
    ("captioner.vision_intermediate_size", 0), ("captioner.patch_size", 0), ("captioner.initializer_range", 0.0),
    ("captioner.lora_r", 0), ("captioner.lora_alpha", 0.0),
]
PIPELINE_BAD = [
    ("parallel_seeds", 0), ("parallel_seeds", 65), ("guarded.rep_penalty", -0.1), ("guarded.length_penalty", -0.1),
    ("scst.kl_coef", -0.1), ("scst.monitor_every", -1), ("scst.monitor_images", -1),
    ("scst.judge_monitor_every", -1), ("scst.judge_monitor_images", 0),
    ("captioner.init.hidden_size", 1), ("captioner.init.layers", 0), ("captioner.init.heads", 0),
    ("captioner.init.intermediate_size", 0), ("captioner.init.vision_hidden_size", 1),
    ("captioner.init.vision_layers", 0), ("captioner.init.vision_heads", 0),
    ("captioner.init.vision_intermediate_size", 0), ("captioner.init.patch_size", 0),
    ("captioner.init.initializer_range", 0.0), ("captioner.init.image_size", 0),
    ("scst.monitor_reward_rise", -0.1), ("scst.monitor_rep_rise", -0.5), ("scst.monitor_length_rise", -0.2),
    ("scst.monitor_distinct_drop", -0.1), ("scst.monitor_incorrect_rise", -1.0), ("scst.monitor_cider_drop", -0.2),
    ("reward_guards.rep_n", 0), ("reward_guards.length_percentile", 0.0), ("reward_guards.length_percentile", 101.0),
    ("data.max_train_images", -1), ("data.max_val_images", -1), ("vocab.min_count", 0), ("vocab.vocab_size", 0),
    ("vocab.max_length", 0), ("features.source.random_seed", -1), ("features.batch_size", 0),
    ("features.shard_size", 0), ("model.vocab_size", -1), ("model.feature_dim", -1), ("model.d_model", 0),
    ("model.n_heads", 0), ("model.encoder_layers", 0), ("model.decoder_layers", 0), ("model.ffn_dim", 0),
    ("model.dropout", 1.0), ("model.max_length", 0),
    ("xe.seed", -1), ("xe.save_every", -1), ("xe.eval_every", -1), ("xe.log_every", -1), ("xe.max_steps", 0),
    ("xe.batch_size", 0), ("xe.micro_batch_size", -1), ("xe.schedule.warmup_steps", -1),
    ("xe.schedule.constant_until", -1), ("xe.schedule.decay_until", -1), ("xe.schedule.peak_lr", 0.0),
    ("xe.schedule.final_lr", -1e-5), ("xe.schedule.decay_power", 0.0), ("xe.weight_decay", -0.1),
    ("xe.grad_clip", -1.0), ("xe.label_smoothing", 1.0), ("xe.val_beam_size", 0), ("xe.val_batch_size", 0),
    ("xe.val_max_images", -1), ("xe.keep_checkpoints", -1),
    ("scst.seed", -1), ("scst.save_every", -1), ("scst.eval_every", -1), ("scst.log_every", -1), ("scst.lr", 0.0),
    ("scst.batch_size", 0), ("scst.micro_batch_size", -1), ("scst.epochs", 0), ("scst.max_steps", -1),
    ("scst.k", 0), ("scst.temperature", 0.0), ("scst.top_k", -1), ("scst.max_length", 0), ("scst.grad_clip", -1.0),
    ("scst.nonfinite_patience", 0), ("scst.keep_checkpoints", -1), ("scst.length_mask_slack", -1),
    ("scst.cider_anchor", -0.5),
    ("reward_models.clip.random_seed", -1), ("reward_models.pac.random_seed", -1),
    ("reward_models.pacs.random_seed", 2**32), ("evaluation.beam_size", 0), ("evaluation.batch_size", 0),
    ("captioner.lora_r", 0), ("captioner.lora_alpha", 0.0), ("scst.degenerate_window", 0),
    ("scst.degenerate_fraction", 1.5),
    ("evaluation.max_images", -1), ("evaluation.bootstrap", -1), ("seed", -1),
    ("evaluation.correlation.n_images", 0), ("evaluation.correlation.candidates_per_image", 1),
    ("evaluation.correlation.bootstrap_resamples", 0),
]
METRIC_BAD = [
    ("seed", -1), ("save_every", -1), ("eval_every", -1), ("log_every", -1), ("lora.rank", 0), ("lora.alpha", 0.0),
    ("lora.dropout", 1.0), ("loss.lambda_v", -0.1), ("loss.lambda_t", -0.1), ("loss.relative_weight", -1.0),
    ("loss.margin_weight", -1.0), ("loss.margin", -0.2), ("data.num_workers", -1), ("data.max_val_pairs", 0),
    ("correlation.every", -1), ("lr", 0.0), ("weight_decay", -0.1), ("batch_size", 1), ("micro_batch_size", -1),
    ("max_steps", -1), ("max_epochs", 0), ("patience", 0),
]
POSITIVES_BAD = [
    ("seed", -1), ("caption_max_length", 0), ("caption_num_beams", 0), ("num_inference_steps", 0),
    ("guidance_scale", -1.0), ("image_size", 0), ("batch_size", 0), ("limit", -1),
]
# numbers whose range a validate() checks (the field's type is shared with classes that cannot be changed here)
CHECKED_IN_VALIDATE = {PipelineConfig: {"xe.seed", "scst.seed"}, MetricTrainConfig: {"seed", "batch_size"}}
FREE = {PipelineConfig: {"scst.length_penalty"}}  # any finite float (< 0 favours short captions, > 0 long ones)
TABLES = {DemoConfig: DEMO_BAD, PipelineConfig: PIPELINE_BAD, MetricTrainConfig: METRIC_BAD,
          PositivesConfig: POSITIVES_BAD}


def numeric_fields(cls: type, prefix: str = "") -> dict[str, tuple]:
    """{dotted key: Annotated metadata} of every int / float field of `cls` and its sections."""
    found = {}
    for field in dataclasses.fields(cls):
        base, _, metadata = _strip(_hints(cls)[field.name])
        if dataclasses.is_dataclass(base):
            found.update(numeric_fields(base, f"{prefix}{field.name}."))
        elif base in (int, float):
            found[prefix + field.name] = metadata
    return found


@pytest.mark.parametrize("cls", list(TABLES), ids=lambda cls: cls.__name__)
def test_every_number_has_a_range_and_a_bad_value_row(cls: type) -> None:
    fields = numeric_fields(cls)
    unbounded = {key for key, metadata in fields.items() if not metadata}
    assert unbounded == CHECKED_IN_VALIDATE.get(cls, set()) | FREE.get(cls, set())
    assert {key for key, _ in TABLES[cls]} == set(fields) - FREE.get(cls, set())


# ints whose upper bound a validate() checks (with the lower one, see CHECKED_IN_VALIDATE)
UPPER_IN_VALIDATE = {PipelineConfig: {"xe.seed", "scst.seed"}, MetricTrainConfig: {"seed", "batch_size"}}


def _upper(metadata: tuple) -> int | None:
    """The inclusive upper bound an Annotated range declares (None: no upper bound)."""
    bounds = [item.le for item in metadata if getattr(item, "le", None) is not None]
    bounds += [item.lt - 1 for item in metadata if getattr(item, "lt", None) is not None]
    return min(bounds) if bounds else None


def int_fields(cls: type, prefix: str = "") -> dict[str, tuple]:
    """{dotted key: Annotated metadata} of every int field of `cls` and its sections."""
    found = {}
    for field in dataclasses.fields(cls):
        base, _, metadata = _strip(_hints(cls)[field.name])
        if dataclasses.is_dataclass(base):
            found.update(int_fields(base, f"{prefix}{field.name}."))
        elif base is int:
            found[prefix + field.name] = metadata
    return found


@pytest.mark.parametrize("cls", list(TABLES), ids=lambda cls: cls.__name__)
def test_every_size_count_and_step_has_an_upper_bound(cls: type) -> None:
    """Issue 31: no int key is unbounded above (a typo must not run for ever or fill the memory)."""
    unbounded = {key for key, metadata in int_fields(cls).items() if _upper(metadata) is None}
    assert unbounded == UPPER_IN_VALIDATE.get(cls, set())


TOO_BIG = [(cls, key, _upper(metadata)) for cls in TABLES for key, metadata in int_fields(cls).items()
           if _upper(metadata) is not None]


@pytest.mark.parametrize("cls, key, bound", TOO_BIG, ids=[f"{c.__name__}:{k}" for c, k, _ in TOO_BIG])
def test_one_past_the_upper_bound_is_refused_at_load(cls: type, key: str, bound: int) -> None:
    with pytest.raises(InputError) as error:
        _load(cls, f"{key}={bound + 1}")
    message = str(error.value)
    assert f"{key}={bound + 1}: expected int" in message and f"<= {bound} " in message, message
    assert "\n" not in message


@pytest.mark.parametrize("override, message", [
    ("threads=100000", "threads=100000: expected int >= 1 and <= 256"),
    ("world.image_size=100000", "world.image_size=100000: expected int >= 1 and <= 512"),
    ("scst.max_steps=99999999999999999999", "scst.max_steps=99999999999999999999: expected int >= 1 and <= 100000"),
    ("world.n_train=1000000000", "world.n_train=1000000000: expected int >= 1 and <= 100000"),
    ("clip.patch_size=1", ("clip.patch_size=1: expected (world.image_size // clip.patch_size)² <= 1024 vision "
                           "tokens, got 2304")),
])
def test_the_issue_31_sizes_are_refused_by_the_demo(override: str, message: str) -> None:
    with pytest.raises(InputError) as error:
        load_demo_config(SMOKE, [override])
    assert message in str(error.value) and "demo_smoke.yaml" in str(error.value)


def test_metric_batch_size_upper_bound_is_checked_in_validate() -> None:
    with pytest.raises(InputError, match=r"^config: batch_size=65537: expected int <= 65536$"):
        load_config(MetricTrainConfig, None, ["batch_size=65537"])
    assert load_config(MetricTrainConfig, None, ["batch_size=65536"]).batch_size == 65536


def test_the_demo_memory_estimate_is_computed_as_documented() -> None:
    """The smoke preset's XE step by hand: 1+1 layers, d_model 32, ffn 64, 2 heads, 10 vision tokens (48 px / 16,
    + CLS), max_length 20, micro-batch 16."""
    from pacs.captioner.demo.budget import stage_estimates

    params = 16 * (1 * (4 * 32**2 + 2 * 32 * 64) + 1 * (8 * 32**2 + 2 * 32 * 64))
    encoder = 4 * 16 * 1 * 10 * (16 * 32 + 2 * 64 + 2 * 2 * 10)
    decoder = 4 * 16 * 1 * 30 * (16 * 32 + 2 * 64 + 2 * 2 * 30)
    estimates = stage_estimates(load_demo_config(SMOKE, []))
    assert estimates["xe"][0] == params + encoder + decoder == 2_222_080
    decoder_scst = 4 * 8 * 1 * 30 * (16 * 32 + 2 * 64 + 2 * 2 * 30)  # micro 4 × beam 2 samples
    assert estimates["scst"][0] == params + encoder // 2 + decoder_scst


@pytest.mark.parametrize("overrides, stage", [
    (["model.d_model=1024", "model.ffn_dim=4096", "model.encoder_layers=24", "model.decoder_layers=24", "model.n_heads=16",
      "xe.micro_batch_size=0", "xe.batch_size=64"], "xe"),
    (["world.image_size=512", "clip.patch_size=16", "clip.vision_width=1024", "clip.vision_layers=24"], "clip"),
])
def test_sizes_within_their_bounds_that_do_not_fit_together_are_refused(overrides: list[str], stage: str) -> None:
    with pytest.raises(InputError) as error:
        load_demo_config(SMOKE, overrides)
    message = str(error.value)
    assert f"{stage}: one training step would hold about " in message and "more than the 16.0 GiB" in message
    assert f"lower {stage}.micro_batch_size (or batch_size)" in message and "\n" not in message


PRESETS = sorted((REPO / "recipes" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda path: path.name)
def test_the_upper_bounds_accept_every_shipped_preset(preset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACS_SHARED", str(REPO))  # presets may read ${PACS_SHARED}; only the values matter here
    name = preset.name
    if name.startswith("demo"):
        load_demo_config(preset, [])
    elif name.startswith("train_metric"):
        load_config(MetricTrainConfig, preset)
    elif name.startswith("generate_positives"):
        load_config(PositivesConfig, preset)
    else:
        load_config(PipelineConfig, preset)


def _load(cls: type, override: str) -> object:
    if cls is DemoConfig:
        return load_demo_config(SMOKE, [override])
    return load_config(cls, RECIPE if cls is PipelineConfig else None, [override])


def _names_key(message: str, key: str, value: object) -> bool:
    """The error names `key` with its value: `a.b=v`, `a: b=v` (a section's own check) or `key must be ..., got v`."""
    section, _, leaf = key.rpartition(".")
    return (f"{key}={value!r}" in message or (section != "" and f"{section}: {leaf}={value!r}" in message)
            or (f": {key} must be >=" in message and message.endswith(f"got {value!r}")))


ROWS = [(cls, key, value) for cls, rows in TABLES.items() for key, value in rows]


@pytest.mark.parametrize("cls, key, value", ROWS, ids=[f"{c.__name__}:{k}={v}" for c, k, v in ROWS])
def test_a_value_outside_the_range_is_refused_at_load(cls: type, key: str, value: object) -> None:
    with pytest.raises(InputError) as error:
        _load(cls, f"{key}={value}")
    message = str(error.value)
    assert _names_key(message, key, value), message
    assert ("expected" in message or "must be >=" in message) and "\n" not in message, message
    if cls is DemoConfig:
        assert "demo_smoke.yaml" in message
    elif cls is PipelineConfig:
        assert RECIPE.name in message


DEMO_BOUNDARIES = [
    "seed=0", "seed=4294967295", "threads=1", "world.max_objects=1", "world.max_objects=3", "world.n_references=2",
    "world.relation_prob=0", "world.relation_prob=1", "world.web_distractor_prob=0", "world.web_distractor_prob=0.99",
    "world.web_noise_word_prob=1", "world.noise_max=0", "world.n_test=1", "world.n_train=160",
    "clip.vision_width=32", "clip.text_width=2", "clip.patch_size=48", "clip.eval_every=0", "clip.weight_decay=0",
    "clip.micro_batch_size=0", "clip.batch_size=2 clip.micro_batch_size=1", "pacs.batch_size=64", "pacs.lambda_v=0", "pacs.alpha=1e-3",
    "correlation.candidates_per_image=2", "correlation.n_images=1", "model.dropout=0", "model.dropout=0.999",
    "xe.schedule.warmup_steps=0", "xe.val_max_images=0", "xe.batch_size=480", "xe.micro_batch_size=0", "scst.batch_size=160",
    "scst.judge_monitor_every=0", "scst.judge_monitor_images=0", "evaluate.gallery_size=0", "evaluate.gallery_size=100",
    "name=my-run_2.b", "runs_dir=/tmp/elsewhere",
]


@pytest.mark.parametrize("overrides", DEMO_BOUNDARIES)
def test_boundary_values_are_accepted(overrides: str) -> None:
    config = load_demo_config(SMOKE, overrides.split())
    for override in overrides.split():
        key, _, text = override.partition("=")
        *sections, leaf = key.split(".")
        section = config
        for part in sections:
            section = getattr(section, part)
        value = getattr(section, leaf)
        assert value == type(value)(text), override


@pytest.mark.parametrize("override, expected", [
    ("xe.batch_size=496", "xe.batch_size=496: expected <= the 480 world.n_train × world.n_references"),
    ("scst.batch_size=164", "scst.batch_size=164: expected <= the 160 world.n_train training images"),
    ("pacs.batch_size=80", "pacs.batch_size=80: expected <= the 64 world.n_val validation pairs"),
    ("clip.batch_size=96", "clip.batch_size=96: expected <= the 64 world.n_val validation pairs"),
    ("clip.patch_size=49", "clip.patch_size=49: expected <= world.image_size (48)"),
    ("clip.text_width=33", "clip: clip.text_width=33: expected an even int"),
    ("model.n_heads=3", "model: model.d_model=32: expected a multiple of model.n_heads (3)"),
    ("clip.micro_batch_size=5", "clip: batch_size=32 must be a multiple of micro_batch_size (5)"),
    ("scst.baseline=loo", None), ("scst.rewards=[bogus]", "unknown reward 'bogus'"),
    ("scst.rewards=[pac-s]", "'pac-s' needs a pac-s model; the demo trains only clip and pac-s++"),
])
def test_cross_field_checks_of_the_demo(override: str, expected: str | None) -> None:
    if expected is None:  # loo with the smoke preset's 2 samples per image is fine; with 1 it is not
        load_demo_config(SMOKE, [override])
        with pytest.raises(InputError, match="leave-one-out baseline needs >= 2 samples"):
            load_demo_config(SMOKE, [override, "scst.k=1"])
        return
    with pytest.raises(InputError) as error:
        load_demo_config(SMOKE, [override])
    assert expected in str(error.value)


@pytest.mark.parametrize("name", ["../../x", "..", ".", "a/b", "", "/abs/run"])
def test_the_demo_name_is_one_folder_inside_runs_dir(name: str) -> None:
    with pytest.raises(InputError) as error:
        load_demo_config(SMOKE, [f"name={name}"] if name else ["name=''"])
    assert f"demo.name must be a folder name inside runs_dir, got {name!r}" in str(error.value)


def test_pipeline_names_and_lists_are_checked_at_load() -> None:
    with pytest.raises(InputError, match=r"xe\.betas=\[0\.9, 1\.0\]: expected two floats >= 0 and < 1"):
        load_config(PipelineConfig, RECIPE, ["xe.betas=[0.9, 1.0]"])
    with pytest.raises(InputError, match=r"xe\.betas=\[0\.9\]: expected two floats"):
        load_config(PipelineConfig, RECIPE, ["xe.betas=[0.9]"])
    with pytest.raises(InputError, match="'clip-s' is not a text metric"):
        load_config(PipelineConfig, RECIPE, ["evaluation.text_metrics=[bleu4, clip-s]"])
    with pytest.raises(InputError, match="text_metrics: unknown metric 'bleu9'"):
        load_config(PipelineConfig, RECIPE, ["evaluation.text_metrics=[bleu9]"])
    with pytest.raises(InputError, match="every test_sets key must be a folder name inside run_dir/features, "
                                         "got '../coco'"):
        load_config(PipelineConfig, RECIPE, ["evaluation.test_sets={../coco: {name: coco-karpathy, path: x}}"])
    config = load_config(PipelineConfig, RECIPE, ["xe.betas=[0, 0.999]", "scst.length_penalty=-2.5"])
    assert config.xe.betas == [0.0, 0.999] and config.scst.length_penalty == -2.5


@pytest.mark.parametrize("override, key", [
    ("model.dropout=1.5", "model.dropout=1.5"), ("world.n_test=0", "world.n_test=0"),
    ("evaluate.gallery_size=-1", "evaluate.gallery_size=-1"), ("threads=0", "threads=0"),
    ("name=../../escaped", "demo.name"), ("scst.rewards=[nope]", "scst.rewards"),
])
def test_pacs_train_refuses_a_bad_value_before_any_work(override: str, key: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "deep" / "runs"
    runs.mkdir(parents=True)
    status = pacs_cli.main(["train", "--config", "demo_smoke", f"runs_dir={runs}", override])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    errors = [line for line in err if line.startswith("pacs train: error:")]
    assert len(errors) == 1 and key in errors[0] and "demo_smoke.yaml" in errors[0], err
    assert list(runs.iterdir()) == [] and not (tmp_path / "escaped").exists()  # no run folder, anywhere
