"""Configuration of the embedded demo (dataclasses; YAML in recipes/configs/demo.yaml under `demo:`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from captioner.demo.world import WorldConfig
from metric.common.config import NonNegativeInt, PositiveFloat, PositiveInt
from metric.common.errors import InputError


@dataclass
class DemoWorldConfig(WorldConfig):
    """The world plus how many images each split holds."""

    n_train: int = 3000
    n_val: int = 300
    n_test: int = 200
    web_captions_per_image: int = 4


@dataclass
class ClipStageConfig:
    """Pre-training a tiny CLIP from scratch on web-style alt-text (open_clip config built in code)."""

    embed_dim: int = 64
    vision_width: int = 96
    vision_layers: int = 3
    patch_size: int = 8
    text_width: int = 64
    text_layers: int = 2
    context_length: int = 32
    steps: PositiveInt = 600
    batch_size: PositiveInt = 128
    micro_batch_size: NonNegativeInt = 0  # pairs a process encodes at once; 0: batch_size / processes
    lr: PositiveFloat = 1e-3
    weight_decay: float = 0.1
    eval_every: int = 50


@dataclass
class PacsStageConfig:
    """Fine-tuning the tiny CLIP into PAC-S++: LoRA on clean captions with synthetic positives."""

    rank: PositiveInt = 4
    alpha: float = 4.0
    steps: PositiveInt = 300
    batch_size: PositiveInt = 64
    micro_batch_size: NonNegativeInt = 0  # pairs a process encodes at once; 0: batch_size / processes
    lr: PositiveFloat = 2e-3
    lambda_v: float = 0.1
    lambda_t: float = 0.001
    eval_every: int = 50


@dataclass
class CorrelationStageConfig:
    """Candidates of varied quality on validation images, scored by every metric and the judge."""

    n_images: int = 300
    candidates_per_image: int = 5


@dataclass
class XEStageConfig:
    """The captioner and its cross-entropy stage."""

    d_model: int = 128
    n_heads: int = 4
    encoder_layers: int = 2
    decoder_layers: int = 2
    ffn_dim: int = 256
    dropout: float = 0.1
    max_length: int = 20
    steps: PositiveInt = 800
    batch_size: PositiveInt = 64
    micro_batch_size: int = 0  # per process; 0: batch_size / processes
    lr: PositiveFloat = 1e-3
    warmup_steps: NonNegativeInt = 50
    log_every: PositiveInt = 20
    val_every: PositiveInt = 200
    val_images: int = 100


@dataclass
class ScstStageConfig:
    """SCST fine-tuning of the XE captioner with each reward."""

    rewards: list[str] = field(default_factory=lambda: ["cider", "clip-s", "pac-s++", "ref-pac-s++"])
    steps: PositiveInt = 60
    batch_size: PositiveInt = 32
    micro_batch_size: int = 0  # per process; 0: batch_size / processes
    beam_size: PositiveInt = 5
    lr: PositiveFloat = 5e-5
    log_every: PositiveInt = 5
    samples: str = "beam"  # or "multinomial" (captioner.modeling.train_scst.SAMPLINGS)
    baseline: str = "mean"  # or "loo" (mean of the other samples), "greedy"
    monitor_every: NonNegativeInt = 10  # held-out validation scores every N steps (0: off)
    monitor_images: NonNegativeInt = 100

    def validate(self) -> None:
        """Sampling and baseline names are checked when the config is loaded, before any stage runs."""
        from captioner.modeling.train_scst import BASELINES, SAMPLINGS

        if self.samples not in SAMPLINGS:
            raise InputError(f"scst.samples={self.samples!r}: unknown (known: {', '.join(SAMPLINGS)})")
        if self.baseline not in BASELINES:
            raise InputError(f"scst.baseline={self.baseline!r}: unknown (known: {', '.join(BASELINES)})")


@dataclass
class EvaluateStageConfig:
    """Evaluation of every captioner on the test split, and the gallery of the report."""

    beam_size: PositiveInt = 3
    gallery_size: int = 12
    bootstrap_resamples: PositiveInt = 1000  # paired bootstrap of (SCST − XE) over the test images


@dataclass
class DemoConfig:
    """The whole demo: where it writes, its seed, the world and every stage."""

    name: str = "demo"
    runs_dir: str = "runs"
    seed: int = 0
    threads: int = 1
    force: list[str] = field(default_factory=list)  # stages to re-run from scratch (`--force STAGE`)
    prompt: str = "A photo depicts "
    world: DemoWorldConfig = field(default_factory=DemoWorldConfig)
    clip: ClipStageConfig = field(default_factory=ClipStageConfig)
    pacs: PacsStageConfig = field(default_factory=PacsStageConfig)
    correlation: CorrelationStageConfig = field(default_factory=CorrelationStageConfig)
    xe: XEStageConfig = field(default_factory=XEStageConfig)
    scst: ScstStageConfig = field(default_factory=ScstStageConfig)
    evaluate: EvaluateStageConfig = field(default_factory=EvaluateStageConfig)
