"""Configuration of the embedded demo (dataclasses; YAML in recipes/configs/demo.yaml under `demo:`)."""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

from annotated_types import Ge, Le

from pacs.captioner.demo import judge_reward  # noqa: F401  (registers the oracle reward `judge`)
from pacs.captioner.demo.world import WorldConfig
from pacs.captioner.modeling.hf_random_init import RandomCaptionerConfig, check_random_captioner
from pacs.captioner.orchestration.guard_choice import GuardedConfig
from pacs.captioner.orchestration.judge_correlation import CorrelationConfig
from pacs.captioner.orchestration.stage_fingerprints import NOT_DETERMINING, settings_of
from pacs.metric.common.config import (
    DEFAULT_ALIASES_REMOVED_IN,
    MAX_BEAM,
    MAX_RESAMPLES,
    MAX_THREADS,
    Fraction,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Seed,
    check_batch_split,
    check_folder_name,
)
from pacs.metric.common.errors import InputError

logger = logging.getLogger(__name__)

DEMO_FAMILIES = ("clip", "pac-s++")
"""The metric families the demo trains a model of (the `clip` and `pacs` stages)."""
ContrastiveBatch = Annotated[int, Ge(2)]
"""A contrastive batch: at least 2 pairs (the other pairs of the batch are the negatives)."""
MAX_DEMO_STEPS = 100_000
"""Upper bound of the demo's step counts and every-N cadences (hours, not months, on 2 cores)."""
MAX_DEMO_BATCH = 4096
"""Upper bound of the demo's batch sizes (every batch is also bounded by its split, `DemoConfig.validate`)."""
MAX_VISION_TOKENS = 1024
"""Upper bound of (world.image_size // clip.patch_size)²: the ViT's attention grows with its square."""


@dataclass
class DemoWorldConfig(WorldConfig):
    """The world plus how many images each split holds (every split is used: none may be empty)."""

    n_references: Annotated[int, Ge(2), Le(100)] = 5  # the correlation stage holds the first one out as a candidate
    n_train: Annotated[PositiveInt, Le(100_000)] = 3000
    n_val: Annotated[PositiveInt, Le(20_000)] = 300
    n_test: Annotated[PositiveInt, Le(20_000)] = 200
    web_captions_per_image: Annotated[PositiveInt, Le(100)] = 4


@dataclass
class ClipStageConfig:
    """Pre-training a tiny CLIP from scratch on web-style alt-text (open_clip config built in code)."""

    # the metric trainer's name since 0.7 (the old one loads until 0.8; stages record it: RECORDED_NAMES)
    DEPRECATED_ALIASES: ClassVar[dict[str, str]] = {"steps": "max_steps"}

    embed_dim: Annotated[PositiveInt, Le(1024)] = 64
    vision_width: Annotated[int, Ge(32), Le(1024)] = 96  # one attention head per 32 channels
    vision_layers: Annotated[PositiveInt, Le(24)] = 3
    patch_size: Annotated[PositiveInt, Le(512)] = 8  # at most world.image_size
    text_width: Annotated[int, Ge(2), Le(1024)] = 64  # two attention heads: an even width
    text_layers: Annotated[PositiveInt, Le(24)] = 2
    context_length: Annotated[PositiveInt, Le(256)] = 32
    max_steps: Annotated[PositiveInt, Le(MAX_DEMO_STEPS)] = 600
    batch_size: Annotated[ContrastiveBatch, Le(MAX_DEMO_BATCH)] = 128
    micro_batch_size: Annotated[NonNegativeInt, Le(MAX_DEMO_BATCH)] = 0  # pairs a process encodes at once; 0: batch_size / processes
    lr: PositiveFloat = 1e-3
    weight_decay: NonNegativeFloat = 0.1
    eval_every: Annotated[NonNegativeInt, Le(MAX_DEMO_STEPS)] = 50  # validation every N steps (0: only after the last step)
    loss: str = "infonce"  # or "sigmoid": SigLIP's pairwise sigmoid loss with a learned logit bias

    def validate(self) -> None:
        """The text tower's two heads split its width; micro-batches split the batch; a known loss."""
        if self.loss not in ("infonce", "sigmoid"):
            raise InputError(f"clip.loss={self.loss!r}: expected infonce or sigmoid")
        if self.text_width % 2:
            raise InputError(f"clip.text_width={self.text_width}: expected an even int (two attention heads)")
        if self.micro_batch_size:
            check_batch_split("", self.batch_size, self.micro_batch_size)


@dataclass
class PacsStageConfig:
    """Fine-tuning the tiny CLIP into PAC-S++: LoRA on clean captions with synthetic positives."""

    # the metric trainer's name since 0.7 (the old one loads until 0.8; stages record it: RECORDED_NAMES)
    DEPRECATED_ALIASES: ClassVar[dict[str, str]] = {"steps": "max_steps"}

    rank: Annotated[PositiveInt, Le(256)] = 4
    alpha: PositiveFloat = 4.0
    max_steps: Annotated[PositiveInt, Le(MAX_DEMO_STEPS)] = 300
    batch_size: Annotated[ContrastiveBatch, Le(MAX_DEMO_BATCH)] = 64
    micro_batch_size: Annotated[NonNegativeInt, Le(MAX_DEMO_BATCH)] = 0  # pairs a process encodes at once; 0: batch_size / processes
    lr: PositiveFloat = 2e-3
    lambda_v: NonNegativeFloat = 0.1
    lambda_t: NonNegativeFloat = 0.001
    eval_every: Annotated[NonNegativeInt, Le(MAX_DEMO_STEPS)] = 50  # validation every N steps (0: only after the last step)

    def validate(self) -> None:
        """Micro-batches split the batch."""
        if self.micro_batch_size:
            check_batch_split("", self.batch_size, self.micro_batch_size)


@dataclass
class DemoModelConfig:
    """The demo's captioner (pacs' encoder-decoder over the CLIP's grid features): a recipe's `model` keys
    (`pacs.captioner.modeling.model.CaptionerConfig`) at the world's sizes."""

    d_model: Annotated[PositiveInt, Le(1024)] = 128
    n_heads: Annotated[PositiveInt, Le(64)] = 4
    encoder_layers: Annotated[PositiveInt, Le(24)] = 2
    decoder_layers: Annotated[PositiveInt, Le(24)] = 2
    ffn_dim: Annotated[PositiveInt, Le(4096)] = 256
    dropout: Fraction = 0.1
    max_length: Annotated[PositiveInt, Le(256)] = 20  # the longest caption (tokens; a transformers captioner's too)

    def validate(self) -> None:
        """The attention heads split d_model."""
        if self.d_model % self.n_heads:
            raise InputError(f"model.d_model={self.d_model}: expected a multiple of model.n_heads ({self.n_heads})")


@dataclass
class DemoScheduleConfig:
    """The XE learning-rate schedule, a recipe's `xe.schedule` keys: warm-up to `peak_lr`, constant to 60 % of
    `xe.max_steps`, then the PAC-S++ decay to `peak_lr / 10` at the last step (derived from these two)."""

    warmup_steps: Annotated[NonNegativeInt, Le(MAX_DEMO_STEPS)] = 50
    peak_lr: PositiveFloat = 1e-3


@dataclass
class XEStageConfig:
    """The cross-entropy stage (a recipe's `xe` keys; the captioner's sizes are the `model` section)."""

    # XEConfig's names since 0.7 (the old ones load until 0.8; stages record them: RECORDED_NAMES)
    DEPRECATED_ALIASES: ClassVar[dict[str, str]] = {"steps": "max_steps", "val_every": "eval_every",
                                                    "val_images": "val_max_images"}

    max_steps: Annotated[PositiveInt, Le(MAX_DEMO_STEPS)] = 800
    batch_size: Annotated[PositiveInt, Le(MAX_DEMO_BATCH)] = 64
    micro_batch_size: Annotated[NonNegativeInt, Le(MAX_DEMO_BATCH)] = 0  # per process; 0: batch_size / processes
    schedule: DemoScheduleConfig = field(default_factory=DemoScheduleConfig)
    log_every: Annotated[PositiveInt, Le(MAX_DEMO_STEPS)] = 20
    eval_every: Annotated[PositiveInt, Le(MAX_DEMO_STEPS)] = 200  # validation every N steps (and after the last)
    val_max_images: Annotated[NonNegativeInt, Le(20_000)] = 100  # validation images XE picks its best checkpoint on (0: all of world.n_val)


@dataclass
class ScstStageConfig:
    """SCST fine-tuning of the XE captioner with each reward."""

    # SCSTConfig's names since 0.7 (the old ones load until 0.8; stages record them: RECORDED_NAMES)
    DEPRECATED_ALIASES: ClassVar[dict[str, str]] = {"steps": "max_steps", "beam_size": "k"}

    rewards: list[str] = field(default_factory=lambda: ["cider", "clip-s", "pac-s++", "ref-pac-s++"])
    # rewards also trained with `mix_normalisation: normalize_then_sum` (each component normalised within the
    # image's k samples before the weighting, pacs.rewards.mix): stage `scst-<reward>-norm`, row `scst <reward> norm`
    normalised_rewards: list[str] = field(default_factory=list)
    max_steps: Annotated[PositiveInt, Le(MAX_DEMO_STEPS)] = 60
    batch_size: Annotated[PositiveInt, Le(MAX_DEMO_BATCH)] = 32
    micro_batch_size: Annotated[NonNegativeInt, Le(MAX_DEMO_BATCH)] = 0  # per process; 0: batch_size / processes
    k: Annotated[PositiveInt, Le(MAX_BEAM)] = 5  # samples per image (the beam's width with samples: beam)
    lr: PositiveFloat = 5e-5
    log_every: Annotated[PositiveInt, Le(MAX_DEMO_STEPS)] = 5
    samples: str = "beam"  # or "multinomial" (pacs.captioner.modeling.train_scst.SAMPLINGS)
    baseline: str = "mean"  # or "loo" (mean of the other samples), "greedy"
    # the hacking monitor (length, Rep-n, distinct-n, validation CIDEr-D, reward) every N steps on these many
    # validation images (0: off): SCSTConfig's `monitor_every` / `monitor_images`, a recipe's keys
    monitor_every: Annotated[NonNegativeInt, Le(MAX_DEMO_STEPS)] = 10
    monitor_images: Annotated[NonNegativeInt, Le(20_000)] = 300
    # the judge's curves: greedy captions of these many validation images scored by the judge and the metrics every
    # N steps (logs/scst_val-<reward>.csv; 0: off)
    judge_monitor_every: Annotated[NonNegativeInt, Le(MAX_DEMO_STEPS)] = 10
    judge_monitor_images: Annotated[NonNegativeInt, Le(20_000)] = 100

    def validate(self) -> None:
        """Rewards, sampling and baseline are checked when the config is loaded, before any stage runs."""
        from pacs.captioner.modeling.train_scst import BASELINES, SAMPLINGS
        from pacs.metric.scoring.registry import METRICS
        from pacs.rewards.registry import check_reward_list, parse_reward_spec

        check_reward_list(self.rewards, "scst.rewards")
        check_reward_list(self.normalised_rewards, "scst.normalised_rewards")
        for spec in [*self.rewards, *self.normalised_rewards]:
            try:
                terms = parse_reward_spec(spec)
            except InputError as error:
                raise InputError(f"scst.rewards: {error}") from None
            for name, _ in terms:
                if name in METRICS and METRICS[name].family not in DEMO_FAMILIES:
                    raise InputError(f"scst.rewards: {spec!r} needs a {METRICS[name].family} model; the demo "
                                     f"trains only {' and '.join(DEMO_FAMILIES)}")
        if self.samples not in SAMPLINGS:
            raise InputError(f"scst.samples={self.samples!r}: unknown (known: {', '.join(SAMPLINGS)})")
        if self.baseline not in BASELINES:
            raise InputError(f"scst.baseline={self.baseline!r}: unknown (known: {', '.join(BASELINES)})")
        if self.baseline == "loo" and self.k < 2:
            raise InputError(f"scst.k={self.k}: the leave-one-out baseline needs >= 2 samples")
        if self.normalised_rewards and self.baseline == "greedy":
            raise InputError("scst.normalised_rewards: normalize_then_sum needs a baseline over the k samples "
                             "(scst.baseline mean or loo)")
        if len(set(self.normalised_rewards)) != len(self.normalised_rewards):
            raise InputError(f"scst.normalised_rewards={self.normalised_rewards}: a reward is listed twice")


@dataclass
class GuardedScstConfig(GuardedConfig):
    """The demo's guarded SCST runs (docs/demo.md "Guards"; docs/captioner.md "SCST guards"): a recipe's `guarded:`
    (`pacs.captioner.orchestration.guard_choice.GuardedConfig`: best validation CIDEr-D, ties fewest gaming
    signatures; never test, never the judge), the KL row `scst <reward> +KL`, the combination `scst <reward> +guards`,
    and the cadence of the guarded runs' hacking monitor."""

    # the selection signal is the hacking monitor's validation CIDEr-D (scst.monitor_*; must be on)
    monitor_every: Annotated[NonNegativeInt, Le(MAX_DEMO_STEPS)] = 0  # the hacking monitor's cadence in the guarded
    # runs, the steps their checkpoint is chosen among (0: scst.monitor_every, as in the unguarded runs)
    monitor_images: Annotated[NonNegativeInt, Le(20_000)] = 0  # validation images of the guarded runs' hacking
    # monitor, whose CIDEr-D chooses their checkpoint (0: scst.monitor_images)

    def validate(self) -> None:
        """Guarded rewards must be trained by the demo, and the guards' grids be valid (`GuardedConfig.validate`)."""
        ScstStageConfig(rewards=list(self.rewards)).validate()
        super().validate()


RECORDED_NAMES: dict[type, dict[str, str]] = {
    ClipStageConfig: {"max_steps": "steps"},
    PacsStageConfig: {"max_steps": "steps"},
    XEStageConfig: {"max_steps": "steps", "eval_every": "val_every", "val_max_images": "val_images"},
    ScstStageConfig: {"max_steps": "steps", "k": "beam_size", "monitor_every": "hacking_monitor_every",
                      "monitor_images": "hacking_monitor_images", "judge_monitor_every": "monitor_every",
                      "judge_monitor_images": "monitor_images"},
}
"""Section class -> {key: the name its stages' settings record it under}: the names of 0.6 and before. Stage
fingerprints hash these settings, so a run folder finished before the 0.7 renames is reused, not re-run (done runs
stay done). It outlives `DEPRECATED_ALIASES` (which only reads the old names from YAML and overrides, until 0.8):
changing it re-runs every finished stage."""


SCST_MONITOR_RENAMES = {"hacking_monitor_every": "monitor_every", "hacking_monitor_images": "monitor_images",
                        "monitor_every": "judge_monitor_every", "monitor_images": "judge_monitor_images"}
"""The demo's `scst` monitor keys of 0.6 -> 0.7: the hacking monitor takes a recipe's names (`monitor_*`), and the
judge's curves, which had them, become `judge_monitor_*`. Applied to a section of the 0.6 layout (one that names a
`hacking_monitor_*` key) until 0.8, with one deprecation line per key."""


def migrate_scst_monitors(section: Any, where: str) -> Any:
    """A demo `scst` section (a mapping) in 0.7's monitor names: a 0.6 section (naming `hacking_monitor_*`) renamed
    by `SCST_MONITOR_RENAMES` (one deprecation line per key); a section naming `monitor_*` and neither `hacking_monitor_*` nor
    `judge_monitor_*` is read in 0.7's names, with one warning that the meaning moved (never silently)."""
    if not isinstance(section, dict):
        return section
    old = [key for key in section if key.startswith("hacking_monitor_")]
    if old:
        both = [key for key in section if key.startswith("judge_monitor_")]
        if both:
            raise InputError(f"{where}: scst.{old[0]} (0.6's name of the hacking monitor) and scst.{both[0]} (0.7's "
                             "names) in one section; write 0.7's: monitor_every / monitor_images (the hacking "
                             "monitor) and judge_monitor_every / judge_monitor_images (the judge's curves)")
        for key, new in SCST_MONITOR_RENAMES.items():
            if key in section:  # one line per key, as the other renamed keys (`DEPRECATED_ALIASES`)
                message = (f"{where}: scst.{key} is deprecated (removed in pacs {DEFAULT_ALIASES_REMOVED_IN}): use "
                           f"scst.{new} (0.7 gives the hacking monitor a recipe's names)")
                warnings.warn(message, DeprecationWarning, stacklevel=2)
                logger.warning("%s", message)
        return {SCST_MONITOR_RENAMES.get(key, key): value for key, value in section.items()}
    moved = [key for key in ("monitor_every", "monitor_images") if key in section]
    if moved and not any(key.startswith("judge_monitor_") for key in section):
        logger.warning("%s: scst.%s is the hacking monitor since 0.7 (a recipe's name); before 0.7 it set the judge's "
                       "curves, now scst.judge_monitor_every / judge_monitor_images", where, " and ".join(moved))
    return section


XE_MOVES: dict[str, tuple[str, str]] = {
    **{key: ("model", key) for key in ("d_model", "n_heads", "encoder_layers", "decoder_layers", "ffn_dim", "dropout",
                                       "max_length")},
    "lr": ("xe.schedule", "peak_lr"), "warmup_steps": ("xe.schedule", "warmup_steps")}
"""The demo's `xe` keys of 0.6 -> their 0.7 place, a recipe's: the captioner's sizes in `model`, the learning rate
and its warm-up in `xe.schedule` (`peak_lr`, `warmup_steps`). Moved until 0.8, one deprecation line per key."""


def migrate_xe_layout(section: Any, where: str) -> Any:
    """A demo section (a mapping) with its 0.6 `xe` keys moved by `XE_MOVES` (one deprecation line per key); a key
    given in both places is refused, naming both."""
    if not isinstance(section, dict) or not isinstance(section.get("xe"), dict):
        return section
    old = [key for key in section["xe"] if key in XE_MOVES]
    if not old:
        return section
    xe = {key: value for key, value in section["xe"].items() if key not in XE_MOVES}
    model = dict(section.get("model") or {})
    schedule = dict(xe.get("schedule") or {})
    for key in old:
        place, name = XE_MOVES[key]
        target = model if place == "model" else schedule
        if name in target:
            raise InputError(f"{where}: xe.{key} (0.6's name) and {place}.{name} (0.7's) in one config; keep "
                             f"{place}.{name}")
        target[name] = section["xe"][key]
        message = (f"{where}: xe.{key} is deprecated (removed in pacs {DEFAULT_ALIASES_REMOVED_IN}): use "
                   f"{place}.{name} (a recipe's key)")
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        logger.warning("%s", message)
    if schedule:
        xe["schedule"] = schedule
    return {**section, "xe": xe, **({"model": model} if model else {})}


def recorded_xe(config: Any, drop: frozenset[str] | set[str] = NOT_DETERMINING) -> dict[str, Any]:
    """The settings an XE stage of the demo records: the `model` section's and the `xe` section's in 0.6's flat
    layout and names (`lr`, `warmup_steps`, `steps`, ...), so finished runs are reused (`RECORDED_NAMES`)."""
    xe = recorded_settings(config.xe, drop)
    schedule = xe.pop("schedule")
    return {**settings_of(config.model, drop), **xe, "lr": schedule["peak_lr"],
            "warmup_steps": schedule["warmup_steps"]}


def recorded_settings(section: Any, drop: frozenset[str] | set[str] = NOT_DETERMINING) -> dict[str, Any]:
    """`settings_of(section, drop)` with its keys under the names finished runs recorded (`RECORDED_NAMES`): the
    settings of the demo's stages, and so their fingerprints, in the names of 0.6 (as
    `stage_fingerprints.trainer_settings` keeps XE's `eval_every` under `val_every`)."""
    names = RECORDED_NAMES.get(type(section), {})
    return {names.get(key, key): value for key, value in settings_of(section, drop).items()}


CAPTIONER_KINDS = ("pacs", "transformers")
"""`captioner.kind`: pacs' own captioner over CLIP grid features, or a transformers image-to-text model."""


@dataclass
class DemoCaptionerConfig(RandomCaptionerConfig):
    """Which captioner the demo trains: `pacs` (its encoder–decoder over the CLIP's grid features, sized by `model`)
    or `transformers` (a tiny `family` model built from random weights in stage `init`, vision tower included;
    docs/demo.md "A transformers captioner in the demo world"). The sizes are a recipe's `captioner.init` keys
    (`RandomCaptionerConfig`; `patch_size` at most world.image_size: 16 at 48 px, one token per cell); the others
    train the transformers model. A `pacs` run ignores them (its stages' settings never hold this section)."""

    kind: str = "pacs"
    finetune: str = "full"  # or "lora" (pacs.captioner.modeling.hf_policy.HFTrainOptions)
    lora_r: Annotated[PositiveInt, Le(1024)] = 8
    lora_alpha: PositiveFloat = 16.0
    train_vision: bool = True  # the vision tower starts from random weights: it has to learn too

    def validate(self) -> None:
        """A known kind, family and fine-tuning mode; heads split their widths (the patches: `DemoConfig`)."""
        if self.kind not in CAPTIONER_KINDS:
            raise InputError(f"captioner.kind={self.kind!r}: expected one of {', '.join(CAPTIONER_KINDS)}")
        if self.kind == "pacs":
            return
        check_random_captioner(self, "captioner.")
        if self.finetune not in ("full", "lora"):
            raise InputError(f"captioner.finetune={self.finetune!r}: expected full or lora")

    @property
    def transformers(self) -> bool:
        """True when the demo trains a transformers captioner (`kind: transformers`)."""
        return self.kind == "transformers"


@dataclass
class EvaluateStageConfig:
    """Evaluation of every captioner on the test split, and the gallery of the report."""

    beam_size: Annotated[PositiveInt, Le(MAX_BEAM)] = 3
    gallery_size: Annotated[NonNegativeInt, Le(1000)] = 12  # test images shown in the report (at most world.n_test)
    bootstrap_resamples: Annotated[PositiveInt, Le(MAX_RESAMPLES)] = 1000  # paired bootstrap of (SCST − XE) over the test images


@dataclass
class DemoConfig:
    """The whole demo: where it writes, its seed, the world and every stage."""

    run_dir: str = "runs/demo"  # the run folder (a recipe's key too); the packaged presets: runs/<preset>
    name: str | None = None  # deprecated in 0.7, removed in 0.8: the run folder was runs_dir/name; use run_dir
    runs_dir: str | None = None  # deprecated in 0.7, removed in 0.8 (see name)
    seed: Seed = 0
    seeds: list[Seed] = field(default_factory=list)  # XE and every SCST run once per seed (empty: [seed])
    parallel_seeds: Annotated[PositiveInt, Le(64)] = 1  # seeds trained at once, each in its own process with
    # threads // parallel_seeds torch threads (one-process runs; under accelerate launch the seeds run in turn)
    threads: Annotated[PositiveInt, Le(MAX_THREADS)] = 1  # torch threads per process
    device: str = "auto"  # auto: the GPU when there is one (accelerate's process device); cpu forces the CPU
    force: list[str] = field(default_factory=list)  # stages to re-run from scratch (`--force STAGE`)
    prompt: str = "A photo depicts "
    world: DemoWorldConfig = field(default_factory=DemoWorldConfig)
    clip: ClipStageConfig = field(default_factory=ClipStageConfig)
    pacs: PacsStageConfig = field(default_factory=PacsStageConfig)
    correlation: CorrelationConfig = field(default_factory=CorrelationConfig)
    captioner: DemoCaptionerConfig = field(default_factory=DemoCaptionerConfig)  # pacs' own, or transformers
    model: DemoModelConfig = field(default_factory=DemoModelConfig)  # pacs' captioner (sizes; max_length for both)
    xe: XEStageConfig = field(default_factory=XEStageConfig)
    scst: ScstStageConfig = field(default_factory=ScstStageConfig)
    guarded: GuardedScstConfig = field(default_factory=GuardedScstConfig)
    evaluate: EvaluateStageConfig = field(default_factory=EvaluateStageConfig)
    captioning: bool = True  # false: only the metric stages (data, clip, pacs, correlation), e.g. demo_siglip.yaml

    def seed_list(self) -> list[int]:
        """The training seeds of XE and SCST: `seeds`, or `[seed]` when it is empty."""
        return list(self.seeds) or [self.seed]

    def run_path(self) -> Path:
        """The run folder: `run_dir`; with the deprecated `runs_dir` / `name`, runs_dir/name, each of them
        defaulting to run_dir's parent / last folder (`runs_dir=/tmp/x` on demo_smoke: /tmp/x/demo_smoke)."""
        if self.name is None and self.runs_dir is None:
            return Path(self.run_dir)
        base = Path(self.run_dir)
        return Path(base.parent if self.runs_dir is None else self.runs_dir) / (self.name or base.name)

    def validate(self) -> None:
        """Checks that span sections: the run folder stays inside runs_dir, every batch fits its split, guarded
        runs have the validation signal they are selected by."""
        if not str(self.run_dir).strip():
            raise InputError("demo.run_dir: expected the run folder, got an empty path")
        if self.name is not None:
            check_folder_name("demo.name", self.name, "runs_dir")
        if self.name is not None or self.runs_dir is not None:
            given = " and ".join(key for key, value in (("name", self.name), ("runs_dir", self.runs_dir))
                                 if value is not None)
            logger.warning("demo: %s are deprecated since 0.7 and go in 0.8: write run_dir=%s instead", given,
                           self.run_path())
        if len(set(self.seeds)) != len(self.seeds):
            raise InputError(f"seeds={self.seeds}: a seed is listed twice")
        if self.guarded.rewards and not (self.scst.monitor_every and self.scst.monitor_images):
            raise InputError("guarded.rewards: the guarded runs are selected by the hacking monitor's validation "
                             "CIDEr-D; set scst.monitor_every and scst.monitor_images > 0")
        world = self.world
        check_metric_fit(world, self.clip, self.pacs)
        if self.captioner.transformers:  # the transformers captioner's own ViT
            check_patch(world, "captioner", self.captioner.patch_size)
        # (key, batch, what the split offers): the trainers refuse a batch larger than their data set
        fits = (("xe.batch_size", self.xe.batch_size, world.n_train * world.n_references,
                 "world.n_train × world.n_references training captions"),
                ("scst.batch_size", self.scst.batch_size, world.n_train, "world.n_train training images"))
        check_fits(fits)

        from pacs.captioner.demo.budget import check_memory

        check_memory(self)  # sizes within their bounds must also fit together (captioner/demo/budget.py)


def check_patch(world: DemoWorldConfig, section: str, patch: int) -> None:
    """A ViT patch of `section` fits the world's images, in at most `MAX_VISION_TOKENS` tokens."""
    if patch > world.image_size:
        raise InputError(f"{section}.patch_size={patch}: expected <= world.image_size ({world.image_size})")
    tokens = (world.image_size // patch) ** 2
    if tokens > MAX_VISION_TOKENS:
        raise InputError(f"{section}.patch_size={patch}: expected (world.image_size // "
                         f"{section}.patch_size)² <= {MAX_VISION_TOKENS} vision tokens, got {tokens}")


def check_fits(fits: tuple[tuple[str, int, int, str], ...]) -> None:
    """Each (key, batch, available, what): the batch is at most what its split offers (the trainers refuse more)."""
    for key, batch, available, what in fits:
        if batch > available:
            raise InputError(f"{key}={batch}: expected <= the {available} {what}")


def check_metric_fit(world: DemoWorldConfig, clip: ClipStageConfig, pacs: PacsStageConfig, prefix: str = "") -> None:
    """The `clip` and `pacs` stages fit `world`: the CLIP's patches its images, their batches its splits (`prefix`:
    where the two sections are, e.g. `metric_training.`)."""
    check_patch(world, f"{prefix}clip", clip.patch_size)
    check_fits(((f"{prefix}clip.batch_size", clip.batch_size, world.n_train * world.web_captions_per_image,
                 "world.n_train × world.web_captions_per_image training pairs"),
                (f"{prefix}clip.batch_size", clip.batch_size, world.n_val, "world.n_val validation pairs"),
                (f"{prefix}pacs.batch_size", pacs.batch_size, world.n_train * min(3, world.n_references),
                 "world.n_train × min(3, world.n_references) training pairs"),
                (f"{prefix}pacs.batch_size", pacs.batch_size, world.n_val, "world.n_val validation pairs")))


@dataclass
class WorldMetricTrainingConfig:
    """A recipe's `metric_training` on the demo world (`data: {name: demo-world}`): the world's own tiny CLIP
    (stage `clip`, pre-trained on its web alt-text) and PAC-S++ (stage `pacs`, LoRA with its positives), trained
    exactly as the demo's stages of the same names, with the recipe's `seed`."""

    prompt: str = "A photo depicts "
    clip: ClipStageConfig = field(default_factory=ClipStageConfig)
    pacs: PacsStageConfig = field(default_factory=PacsStageConfig)
