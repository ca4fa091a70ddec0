"""The recipe pipeline's configuration: data, vocabulary, features, reward models, evaluation, one YAML.

`PipelineConfig` is what `recipes/configs/coco_*.yaml` describe (rules in docs/captioner.md); the pipeline itself
is `pacs.captioner.orchestration.pipeline`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from annotated_types import Gt, Le

from pacs.captioner.modeling.model import CaptionerConfig
from pacs.captioner.modeling.train_scst import SCSTConfig
from pacs.captioner.modeling.train_xe import XEConfig
from pacs.captioner.modeling.vocab import DEFAULT_MAX_LENGTH
from pacs.captioner.orchestration.backbone_source import BackboneSource
from pacs.captioner.orchestration.captioner_kind import CaptionerKindConfig
from pacs.captioner.orchestration.data_sources import MetricTraining, data_mapping, data_source, training_data_sets
from pacs.captioner.orchestration.guard_choice import GuardedConfig
from pacs.captioner.orchestration.judge_correlation import CorrelationConfig
from pacs.metric.common.config import (
    MAX_BEAM,
    MAX_IMAGES,
    MAX_LENGTH,
    MAX_MICRO_BATCH,
    MAX_RESAMPLES,
    MAX_STEPS,
    NonNegativeInt,
    PositiveInt,
    Seed,
    check_folder_name,
    from_dict,
    to_dict,
)
from pacs.metric.common.config_files import packaged_config
from pacs.metric.common.errors import InputError


@dataclass
class DataConfig:
    """A caption data set (`pacs.captioner.data.DATASETS` name + path) and the splits to use."""

    name: str = "coco-karpathy"
    path: str = ""
    image_root: str | None = None
    missing_images: str = "skip"
    options: dict[str, Any] = field(default_factory=dict)
    train_splits: list[str] = field(default_factory=lambda: ["train"])
    val_split: str = "val"
    max_train_images: Annotated[NonNegativeInt, Le(MAX_IMAGES)] = 0
    max_val_images: Annotated[NonNegativeInt, Le(MAX_IMAGES)] = 0

    def loader_arguments(self) -> tuple[str, Path, str | None, str]:
        """`(name, path, image_root, missing_images)` for `pacs.captioner.data.load_dataset` / `stream_dataset`
        (`**options` besides), the path as the data set locates it (a packaged world config's file)."""
        return self.name, data_source(self.name).path_of(self.path), self.image_root, self.missing_images


@dataclass
class VocabConfig:
    """Vocabulary built from the training captions."""

    kind: str = "word"
    min_count: Annotated[PositiveInt, Le(MAX_IMAGES)] = 5
    vocab_size: Annotated[PositiveInt, Le(1_000_000)] = 8000
    max_length: Annotated[PositiveInt, Le(MAX_LENGTH)] = DEFAULT_MAX_LENGTH


@dataclass
class FeaturesConfig:
    """Grid-feature extraction."""

    source: BackboneSource = field(default_factory=BackboneSource)
    batch_size: Annotated[PositiveInt, Le(MAX_MICRO_BATCH)] = 64
    shard_size: Annotated[PositiveInt, Le(65_536)] = 512
    dtype: str = "float16"
    mixed_precision: str = "no"  # bf16 / fp16: the tower under torch.autocast (fp32 weights) while extracting
    # features extracted elsewhere: CACHE_DIR/<set> (train, and each test set's name) holds a pacs feature cache
    # (meta.json + shards) whose recorded fingerprint must be `source`'s; nothing is extracted then
    cache_dir: str = ""
    # threads decoding the next batch's images while the tower runs: auto (one per core), 0 or 1, or N; the
    # features are the same for every value (not part of the stage's settings)
    workers: int | str = "auto"

    def validate(self) -> None:
        """`workers` is auto or a number of threads."""
        from pacs.metric.common.parallel import resolve_workers

        resolve_workers(self.workers, "features.workers")


@dataclass
class RewardModelConfig:
    """Models of contrastive rewards and evaluation columns, one per family (see `REWARD_MODEL_SLOTS`).

    `clip` serves clip-s / ref-clip-s, `pacs` (the PAC-S model) pac-s / ref-pac-s and `pac` (the PAC-S++
    model) pac-s++ / ref-pac-s++. A model whose established family contradicts its slot is a config error
    unless `allow_family_mismatch`.
    """

    clip: BackboneSource = field(default_factory=BackboneSource)
    pac: BackboneSource = field(default_factory=lambda: BackboneSource(backbone=""))
    pacs: BackboneSource = field(default_factory=lambda: BackboneSource(backbone=""))
    device: str = "auto"
    dtype: str = "fp32"
    allow_family_mismatch: bool = False
    # threads decoding images for the reward's image cache and the evaluation's columns (auto: one per core);
    # the scores are the same for every value
    workers: int | str = "auto"

    def validate(self) -> None:
        """`dtype` is a compute precision the Scorer knows (fp32, bf16, fp16); `workers` auto or a count."""
        from pacs.metric.common.parallel import resolve_workers

        if self.dtype not in ("fp32", "bf16", "fp16"):
            raise InputError(f"reward_models.dtype={self.dtype!r}: expected fp32, bf16 or fp16")
        resolve_workers(self.workers, "reward_models.workers")


@dataclass
class RewardGuardsConfig:
    """Options of the guard rewards `rep-penalty` and `length-penalty` (`pacs.rewards.guards`; used only by specs naming them).

    `rep_n`: the n of Rep-n that `rep-penalty` subtracts; `length_limit`: `refs` (each image's longest reference),
    `train` (the `length_percentile` percentile of the training references' word counts) or a number of words.
    """

    rep_n: Annotated[PositiveInt, Le(16)] = 2
    length_limit: str = "refs"
    length_percentile: Annotated[float, Gt(0), Le(100)] = 95.0

    def validate(self) -> None:
        """`length_limit` is refs, train or a whole number of words >= 1."""
        text = str(self.length_limit).strip()
        if text not in ("refs", "train") and not (text.isdigit() and int(text) >= 1):
            raise InputError(f"length_limit={self.length_limit!r}: expected refs, train or a number of words >= 1")

    def context(self) -> dict[str, Any]:
        """The `build_reward` context keys of `pacs.rewards.guards`."""
        text = str(self.length_limit).strip()
        return {"rep_n": self.rep_n, "length_limit": int(text) if text.isdigit() else text,
                "length_percentile": self.length_percentile}


#: the rewards whose options `reward_guards` holds
GUARD_REWARDS = ("rep-penalty", "length-penalty")


@dataclass
class ContrastiveRewardConfig:
    """How every contrastive reward term scores (clip-s, pac-s, pac-s++ and their Ref- variants; `pacs.rewards.contrastive`).

    `score`: `cosine` (the papers' `w·max(cos, 0)`, default) or `sigmoid` (the reward model's calibrated
    `sigmoid(scale·cos + bias)`, range (0, 1); SigLIP-style models only, refused for a model without a logit bias).
    `long_captions`: `truncate` (the papers', default) or `chunk` (sentence pieces that fit the text context, the
    mean of their normalised embeddings). Values other than the defaults enter the SCST stage fingerprint.
    """

    score: Literal["cosine", "sigmoid"] = "cosine"
    long_captions: Literal["truncate", "chunk"] = "truncate"

    def context(self) -> dict[str, Any]:
        """The `build_reward` context keys of `pacs.rewards.contrastive` (`score`, `long_captions`)."""
        return {"score": self.score, "long_captions": self.long_captions}

    def changed(self) -> dict[str, Any]:
        """The keys set to something other than their default (what a stage fingerprint records)."""
        defaults = ContrastiveRewardConfig()
        return {key: value for key, value in self.context().items() if value != getattr(defaults, key)}


@dataclass
class ScstStageConfig(SCSTConfig):
    """A recipe's `scst` section: the trainer's settings (`SCSTConfig`) plus the judge's curves the pipeline draws
    around it (`pacs.captioner.orchestration.judge_monitor`; the demo's keys of the same names)."""

    # every N steps (and at steps 0 and the last) greedy captions of the first judge_monitor_images validation
    # images scored by the data set's judge, CIDEr-D and the contrastive columns into <stage>/judge_monitor.csv
    # (0: off; a data set with an exact judge only: the demo world)
    judge_monitor_every: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 0
    judge_monitor_images: Annotated[PositiveInt, Le(MAX_IMAGES)] = 100


JUDGE_MONITOR_KEYS = ("judge_monitor_every", "judge_monitor_images")
"""The keys of a recipe's `scst` section that the pipeline reads and the SCST trainer does not."""


def trainer_section(section: Any) -> dict[str, Any]:
    """A recipe's `scst` (or `xe`) section as the trainer's keys (without `JUDGE_MONITOR_KEYS`)."""
    return {key: value for key, value in to_dict(section).items() if key not in JUDGE_MONITOR_KEYS}


# (family, `reward_models` field): the model slot of each contrastive family.
REWARD_MODEL_SLOTS = (("clip", "clip"), ("pac-s", "pacs"), ("pac-s++", "pac"))


@dataclass
class EvalConfig:
    """Test sets ({name: DataConfig-like mapping with a `split`}) and decoding for evaluation."""

    test_sets: dict[str, dict[str, Any]] = field(default_factory=dict)
    beam_size: Annotated[PositiveInt, Le(MAX_BEAM)] = 5
    batch_size: Annotated[PositiveInt, Le(MAX_MICRO_BATCH)] = 50
    text_metrics: list[str] = field(default_factory=lambda: ["bleu4", "meteor", "cider", "spice"])
    max_images: Annotated[NonNegativeInt, Le(MAX_IMAGES)] = 0
    bootstrap: Annotated[NonNegativeInt, Le(MAX_RESAMPLES)] = 1000  # paired bootstrap resamples for the 95% intervals against XE (0: none)
    # the reward_models slots (clip, pacs, pac) whose CLIP-S / PAC-S / PAC-S++ columns (and Ref- variants) are
    # reported; null: every slot that names a model; []: none (no reward model is loaded for the evaluation)
    contrastive_models: list[str] | None = None
    # a human row per test set: one reference of every image held out (drawn with the run's seed) and scored
    # against the others (`pacs.captioner.orchestration.human_row`); every image needs two references or more
    human_baseline: bool = False
    # stage correlation/<set> on every test set whose data set makes candidates with a judge (the demo world):
    # Kendall tau of every metric against the judge (`pacs.captioner.orchestration.judge_correlation`); null: none
    correlation: CorrelationConfig | None = None

    def validate(self) -> None:
        """Check the text metric names and every test set (a folder name; a DataConfig plus `split`) when loaded."""
        from pacs.eval.registry import get_metric

        for name in self.text_metrics:
            try:
                kind = get_metric(name).kind
            except InputError as error:
                raise InputError(f"text_metrics: {error}") from None
            if kind != "text":
                raise InputError(f"text_metrics: {name!r} is not a text metric (text metrics: bleu1-4 meteor "
                                 f"rouge cider spice)")
        slots = [slot for _, slot in REWARD_MODEL_SLOTS]
        for slot in self.contrastive_models or []:
            if slot not in slots:
                raise InputError(f"contrastive_models: {slot!r} is not a reward_models slot (slots: "
                                 f"{', '.join(slots)})")
        for name, test_set in self.test_sets.items():
            check_folder_name("every test_sets key", name, "run_dir/features")
            split = test_set.get("split", "test")
            if split is not None and not isinstance(split, str):
                raise InputError(f"test_sets.{name}.split={split!r}: expected str or null")
            from_dict(DataConfig, {k: v for k, v in test_set.items() if k != "split"}, f"test_sets.{name}")


@dataclass
class PipelineConfig:
    """The whole recipe."""

    run_dir: str = "runs/coco"
    data: DataConfig = field(default_factory=DataConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    model: CaptionerConfig = field(default_factory=CaptionerConfig)
    # pacs' captioner (default) or a transformers image-to-text folder (pacs.captioner.orchestration.captioner_kind)
    captioner: CaptionerKindConfig = field(default_factory=CaptionerKindConfig)
    xe: XEConfig = field(default_factory=XEConfig)
    scst: ScstStageConfig = field(default_factory=ScstStageConfig)
    rewards: list[str] = field(default_factory=lambda: ["pac-s++"])
    # rewards also trained with each component normalised within the image's k samples before the weighting
    # (scst.mix_normalisation normalize_then_sum, pacs.rewards.mix): stage scst-<reward>-norm, row `<reward> norm`,
    # compared with the weighted-sum run of the same reward where `rewards` lists it (results.json mix_normalisation)
    normalised_rewards: list[str] = field(default_factory=list)
    reward_models: RewardModelConfig = field(default_factory=RewardModelConfig)
    reward_guards: RewardGuardsConfig = field(default_factory=RewardGuardsConfig)
    contrastive_reward: ContrastiveRewardConfig = field(default_factory=ContrastiveRewardConfig)
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    # guarded SCST runs of some `rewards`: every setting of every guard trained, chosen on validation CIDEr-D
    # (pacs.captioner.orchestration.guarded_stages; the hacking monitor, scst.monitor_every, must be on)
    guarded: GuardedConfig = field(default_factory=GuardedConfig)
    # the data set's own contrastive models, trained before the vocabulary (a data set that offers it: the demo
    # world, keys `pacs.captioner.demo.config.WorldMetricTrainingConfig`): stage `clip` and stage `pacs`, whose
    # checkpoints are the features' backbone and reward_models.clip / reward_models.pac (leave those unset)
    metric_training: dict[str, Any] | None = None
    seed: Seed = 42
    # training seeds: with two or more, the whole pipeline once per seed into run_dir/seed-<s> (features extracted
    # once) and the rows pooled over seeds into run_dir/seeds/ (pacs.captioner.orchestration.seed_runs)
    seeds: list[Seed] = field(default_factory=list)
    # seeds trained at once, each in its own process at cores // parallel_seeds torch threads (one-process CPU runs;
    # under accelerate launch or on an accelerator they run in turn); the features are made first, once
    parallel_seeds: Annotated[PositiveInt, Le(64)] = 1
    # every stage's device: auto (accelerate's process device: cuda:<local rank>, mps or cpu) or cpu / an explicit
    # device that must be the process's (pacs.metric.common.device); features / reward_models `device` default to it
    device: str = "auto"
    force: list[str] = field(default_factory=list)  # stages to re-run from scratch (`--force STAGE`)

    def validate(self) -> None:
        """`xe.betas`: Adam's two decay rates, each in [0, 1) (checked here: XEConfig types them as floats only)."""
        betas = self.xe.betas
        if len(betas) != 2 or not all(0 <= beta < 1 for beta in betas):
            raise InputError(f"xe.betas={betas}: expected two floats >= 0 and < 1")
        if len(set(self.seeds)) != len(self.seeds):
            raise InputError(f"seeds={self.seeds}: a seed is listed twice")
        from pacs.rewards.registry import check_reward_list  # the registry imports torch; configs load without it

        check_reward_list(self.rewards, "rewards")
        check_reward_list(self.normalised_rewards, "normalised_rewards")
        if len(set(self.normalised_rewards)) != len(self.normalised_rewards):
            raise InputError(f"normalised_rewards={self.normalised_rewards}: a reward is listed twice")
        if self.normalised_rewards and self.scst.baseline == "greedy":
            raise InputError("normalised_rewards: normalize_then_sum needs a baseline over the k samples (scst.baseline "
                             "mean or loo)")
        if self.normalised_rewards and self.scst.mix_normalisation == NORMALISED:
            raise InputError(f"normalised_rewards: scst.mix_normalisation is already {NORMALISED}, so the runs of "
                             "`rewards` are normalised too; set scst.mix_normalisation=weighted_sum to compare the two")
        unguarded = [reward for reward in self.guarded.rewards if reward not in self.rewards]
        if unguarded:
            raise InputError(f"guarded.rewards: {', '.join(unguarded)} not in rewards={self.rewards} (a guarded run is "
                             "compared with the unguarded run of its reward)")
        if self.guarded.rewards and not self.scst.monitor_every:
            raise InputError("guarded.rewards: each guard's setting is chosen on the hacking monitor's validation "
                             "CIDEr-D; set scst.monitor_every > 0")
        if self.metric_training is not None:
            check_metric_training(self)
        if self.scst.judge_monitor_every and data_source(self.data.name).judge is None:
            raise InputError(f"scst.judge_monitor_every={self.scst.judge_monitor_every}: data set {self.data.name!r} "
                             "has no judge of captions (the demo world has one); set scst.judge_monitor_every=0 (the "
                             "hacking monitor, scst.monitor_every, follows validation CIDEr-D on any data set)")


NORMALISED = "normalize_then_sum"
"""The `scst.mix_normalisation` of the `normalised_rewards` runs."""


def normalised_row(spec: str) -> str:
    """The table row of the `normalised_rewards` run of reward `spec`: `<spec> norm` (its stage:
    `scst-<slug>-norm`, its eval folder `eval/<slug>_norm/`)."""
    return f"{spec} norm"


def normalisation_pairs(config: PipelineConfig) -> list[tuple[str, str, str]]:
    """(reward spec, its normalised row, its weighted-sum row) of every `normalised_rewards` reward that `rewards`
    also trains."""
    return [(spec, normalised_row(spec), spec) for spec in config.normalised_rewards if spec in config.rewards]


METRIC_STAGES = ("clip", "pacs")
"""The stages of `metric_training`, in order: the data set's CLIP, then its PAC-S++ from that CLIP."""
METRIC_CHECKPOINT = "checkpoint.safetensors"


def metric_checkpoints(run_dir: str | Path) -> dict[str, Path]:
    """{stage: its checkpoint} of the `metric_training` stages of a run folder."""
    return {stage: Path(run_dir) / stage / METRIC_CHECKPOINT for stage in METRIC_STAGES}


def made_checkpoints(config: PipelineConfig) -> set[Path]:
    """The checkpoints this run's own `metric_training` stages make (not there before it starts)."""
    return set(metric_checkpoints(config.run_dir).values()) if config.metric_training is not None else set()


def metric_sources(run_dir: str | Path) -> dict[str, tuple[BackboneSource, BackboneSource, str]]:
    """{config key: (the source `metric_training` gives it, the key's default, the stage whose checkpoint it is)}."""
    clip, pacs = (str(path) for path in metric_checkpoints(run_dir).values())
    return {"features.source": (BackboneSource(backbone="", checkpoint=clip), BackboneSource(), "clip"),
            "reward_models.clip": (BackboneSource(backbone="", checkpoint=clip), BackboneSource(), "clip"),
            "reward_models.pac": (BackboneSource(backbone="", checkpoint=pacs), BackboneSource(backbone=""), "pacs")}


def metric_training_of(config: PipelineConfig) -> tuple[MetricTraining, Any] | None:
    """The data set's metric training and the recipe's settings of it (None: `metric_training` not set)."""
    if config.metric_training is None:
        return None
    training = data_source(config.data.name).metric_training
    if training is None:
        offered = ", ".join(training_data_sets()) or "none is registered"
        raise InputError(f"metric_training: data set {config.data.name!r} does not train its own contrastive models "
                         f"(data sets that do: {offered}); remove metric_training and name the models in "
                         "features.source and reward_models")
    return training, from_dict(training.settings, config.metric_training, "metric_training")


def check_metric_training(config: PipelineConfig) -> None:
    """`metric_training` on a data set that offers it, fitting that data set, and no other origin for the models
    its stages make (the features' backbone, reward_models.clip and .pac) nor precomputed features."""
    found = metric_training_of(config)
    assert found is not None
    training, settings = found
    for key, (given, default, stage) in metric_sources(config.run_dir).items():
        section, name = key.split(".")
        value = dataclasses.replace(getattr(getattr(config, section), name), device="auto")
        if value not in (given, default):
            raise InputError(f"metric_training: {key} is stage {stage}'s checkpoint ({given.checkpoint}), but the "
                             f"recipe names another model ({value.to_record()}); remove {key}, or remove "
                             "metric_training to use that model")
    if config.features.cache_dir:
        raise InputError(f"metric_training: the features are extracted with stage clip's CLIP, but "
                         f"features.cache_dir={config.features.cache_dir} names features made elsewhere; set "
                         "features.cache_dir=''")
    data = data_mapping(config.data)
    path = data_source(config.data.name).path_of(config.data.path) if config.data.path else None
    if path is not None and path.exists():  # a missing file: preflight names it with the others
        training.check({**data, "path": str(path)}, settings)


def default_config_path() -> Path:
    """The packaged config `demo` (recipes/configs/demo.yaml; the embedded default, installed or not)."""
    return packaged_config("demo")
