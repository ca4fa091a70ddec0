"""Stage 2: self-critical sequence training (PAC-S++ §4.2, Eq. 19) with any reward, under accelerate.

Per image: `k` captions (the k beams, PAC-S++ / M² style, or k multinomial samples) decoded without
gradients, rewarded by `reward(image_ids, captions [B][k], references [B][*]) -> [B, k]`, a baseline
subtracted (`mean` of the k — PAC-S++'s choice —, `loo` leave-one-out mean, or the reward of the `greedy`
caption), and the loss `−mean((r − b) · log p(caption))` over images and captions, with log p summed over
the tokens up to the first <eos> and computed by teacher forcing with the model in training mode.
Randomness (multinomial samples, dropout masks) is drawn per image from generators seeded by (seed, step, global
example index) (`pacs.captioner.modeling.example_rng`), so 1 or N processes and any micro-batch size give the same samples
and gradients, and a resume needs only the step number.
Non-finite rewards are replaced by the baseline (their advantage is 0), counted and logged; if they occur
in `nonfinite_patience` consecutive steps training stops with an error.

Guards against reward hacking (issue 24; each off by default, formulas in docs/captioner.md "SCST guards"):
`kl_coef` (β) shapes each sampled caption's reward before the baseline, r'(y) = r(y) − β·KL(y) with
KL(y) = Σ_t log π(y_t) − log π_ref(y_t) over its sampled tokens (`pacs.captioner.modeling.reference_policy`; the
`kl` column of log.csv is the mean KL(y)); `monitor_every` runs the hacking monitor
(`pacs.captioner.modeling.hacking_monitor`, `<output_dir>/monitor.csv`); `select_by` (`cider` / `reward`) keeps the
monitored step with the best validation score in `<output_dir>/best`. Repetition and length penalties are
reward components (`pacs.rewards.guards`: `rep-penalty`, `length-penalty`).
"""
from __future__ import annotations

import contextlib
import logging
import math
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from accelerate.utils import broadcast_object_list
from annotated_types import Ge, Le

from pacs.captioner.modeling.checkpoints import CheckpointManager
from pacs.captioner.modeling.example_rng import DROPOUT, SAMPLING, ExampleRNG, example_generators
from pacs.captioner.modeling.features import FeatureCache
from pacs.captioner.modeling.hacking_monitor import MONITOR_FILE, GamingThresholds, HackingMonitor
from pacs.captioner.modeling.model import token_log_probs
from pacs.captioner.modeling.policy import CaptionPolicy, PacsPolicy
from pacs.captioner.modeling.reward_spread import COUNTS as SPREAD_COUNTS
from pacs.captioner.modeling.reward_spread import SpreadWatch, spread_counts
from pacs.captioner.modeling.scst_guards import GamingStop, check_anchor, length_band_mask, mask_advantages
from pacs.captioner.modeling.train_xe import is_better
from pacs.captioner.modeling.training_setup import (
    BatchPlan,
    check_trackers,
    finish_trackers,
    make_accelerator,
    reduce_mean,
    start_trackers,
    tracker_names,
)
from pacs.metric.common.config import (
    MAX_BATCH,
    MAX_BEAM,
    MAX_IMAGES,
    MAX_LENGTH,
    MAX_MICRO_BATCH,
    MAX_STEPS,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Temperature,
    check_batch_split,
    to_dict,
)
from pacs.metric.common.errors import InputError, NonFiniteError, PacsError
from pacs.metric.common.optim import make_adam
from pacs.metric.common.progress import progress
from pacs.metric.common.seeding import seed_everything
from pacs.metric.common.trainer_config import TrainerConfig, is_due, resume_target
from pacs.metric.training.divergence import check_loss, check_weights, nonfinite_parameter
from pacs.rewards.mix import check_mix_normalisation, mixed_rewards

logger = logging.getLogger(__name__)

RewardFn = Callable[[list[str], list[list[str]], list[list[str]]], torch.Tensor]
SCST_COLUMNS = ("loss", "lr", "reward_mean", "reward_std", "advantage_mean", "advantage_abs", "length", "rep1",
                "incorrect", "nonfinite", "epoch", "kl", "zero_spread")
BASELINES = ("mean", "loo", "greedy")
SAMPLINGS = ("beam", "multinomial")
#: `select_by` -> the monitor column that picks the best checkpoint (`last`: the last step, no selection)
SELECT_BY = {"last": None, "cider": "cider", "reward": "reward"}
KEPT_DIR = "kept"  # stop_on_gaming: the last monitored model before a gaming signature
#: the guard settings (issue 24): left out of stage fingerprints while at their defaults (off), so runs finished
#: before they existed stay done; the monitor's warning thresholds never determine an output
GUARD_FIELDS = ("kl_coef", "kl_reference", "select_by", "monitor_every", "monitor_images",
                "mix_normalisation",  # mix_normalisation (issue 34): how a mixed reward's components aggregate
                "length_mask", "length_mask_slack", "cider_anchor", "stop_on_gaming")  # issue 44 (scst_guards)
MONITOR_THRESHOLD_FIELDS = ("monitor_reward_rise", "monitor_rep_rise", "monitor_length_rise",
                            "monitor_distinct_drop", "monitor_incorrect_rise", "monitor_cider_drop",
                            "degenerate_window", "degenerate_fraction")


class NonFiniteRewardError(PacsError):
    """The reward kept returning NaN or infinite values."""


@dataclass
class SCSTConfig(TrainerConfig):
    """Stage-2 settings (defaults: PAC-S++ §5.1: Adam 1e-6, batch 32, one epoch, beam 5, mean baseline).

    The shared trainer fields are `TrainerConfig`'s; SCST validates nothing while training (the pipeline's
    evaluation stage scores it), so `eval_every` must stay 0.
    """

    output_dir: str = "runs/scst"
    reward: str = "pac-s++"
    lr: PositiveFloat = 1e-6
    batch_size: Annotated[PositiveInt, Le(MAX_BATCH)] = 32
    micro_batch_size: Annotated[NonNegativeInt, Le(MAX_MICRO_BATCH)] = 32  # per process; 0: batch_size / processes (derived by the pipeline)
    epochs: Annotated[PositiveInt, Le(1000)] = 1
    max_steps: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 0
    samples: str = "beam"
    k: Annotated[PositiveInt, Le(MAX_BEAM)] = 5
    temperature: Temperature = 1.0  # >= MIN_TEMPERATURE: 1e-300 would be 0 in float32
    top_k: Annotated[NonNegativeInt, Le(1_000_000)] = 0
    length_penalty: float = 0.0
    max_length: Annotated[PositiveInt, Le(MAX_LENGTH)] = 20
    baseline: str = "mean"
    grad_clip: NonNegativeFloat = 0.0
    nonfinite_patience: Annotated[PositiveInt, Le(1000)] = 3
    save_every: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 100  # checkpoint every N steps (0: only after the last step)
    keep_checkpoints: Annotated[NonNegativeInt, Le(1000)] = 2
    log_every: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 1  # log every N steps (0: only the last step)
    seed: int = 42
    trackers: list[str] | None = None  # accelerate's log_with by name (None: tensorboard when installed)
    tensorboard: bool | None = None  # deprecated (0.8 drops it): trackers
    # guards against reward hacking (all off by default; docs/captioner.md "SCST guards")
    kl_coef: NonNegativeFloat = 0.0  # β of the per-token KL to the reference policy (0: off)
    kl_reference: str = ""  # the reference captioner folder ("": the SCST init checkpoint, i.e. the XE model)
    select_by: str = "last"  # the reported model: last step, or the monitored step with the best cider / reward
    monitor_every: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 0  # hacking monitor on validation every N steps (0: off)
    monitor_images: Annotated[NonNegativeInt, Le(MAX_IMAGES)] = 100  # validation images the monitor captions (0: all)
    monitor_reward_rise: NonNegativeFloat = 0.0  # warn only when the validation reward rose by more than this
    monitor_rep_rise: NonNegativeFloat = 0.5  # ... and Rep-2 rose by more than this
    monitor_length_rise: NonNegativeFloat = 0.2  # ... or the mean length by more than this fraction
    monitor_distinct_drop: NonNegativeFloat = 0.1  # ... or distinct-2 fell by more than this
    monitor_incorrect_rise: NonNegativeFloat = 10.0  # ... or %Incorrect rose by more than these points
    monitor_cider_drop: NonNegativeFloat = 0.2  # ... or the validation CIDEr-D fell by more than this fraction
    # degenerate-reward warning (pacs.captioner.modeling.reward_spread): the reward's spread within the k samples was
    # zero for more than `degenerate_fraction` of the images, on average over the last `degenerate_window` steps
    degenerate_window: Annotated[PositiveInt, Le(MAX_STEPS)] = 10
    degenerate_fraction: Annotated[float, Ge(0), Le(1)] = 0.5
    # a mixed reward's components: summed with their weights, or each normalised within the image's k samples
    # first (GDPO; TRL's multi_objective_aggregation="normalize_then_sum"; pacs.rewards.mix, docs/rewards.md)
    mix_normalisation: str = "weighted_sum"
    # issue 44 (pacs.captioner.modeling.scst_guards): a sample whose length in words leaves its image's reference
    # band [min - slack, max + slack] gets advantage 0; a CIDEr-D term of this weight in the reward (the spec is
    # built with anchored_reward_spec); stop at the first monitored step with a gaming signature, keeping the last
    # monitored model before it in <output_dir>/kept
    length_mask: bool = False
    length_mask_slack: Annotated[NonNegativeInt, Le(MAX_LENGTH)] = 2
    cider_anchor: NonNegativeFloat = 0.0
    stop_on_gaming: bool = False

    def validate(self) -> None:
        """Cross-field checks run when the config is loaded (pacs.metric.common.config.from_dict)."""
        super().validate()
        check_trackers(self, "scst")
        if self.eval_every:
            raise InputError(f"eval_every={self.eval_every}: SCST does not validate while training (the "
                             "pipeline's evaluation stage scores it); leave eval_every at 0")
        if self.micro_batch_size:
            check_batch_split("", self.batch_size, self.micro_batch_size)
        if self.samples not in SAMPLINGS:
            raise InputError(f"samples={self.samples!r}: unknown SCST sampling (known: {', '.join(SAMPLINGS)})")
        if self.baseline not in BASELINES:
            raise InputError(f"baseline={self.baseline!r}: unknown SCST baseline (known: {', '.join(BASELINES)})")
        if self.baseline == "loo" and self.k < 2:
            raise InputError(f"k={self.k}: the leave-one-out baseline needs k >= 2 captions per image")
        self.check_guards()

    def check_guards(self) -> None:
        """The guards' cross-field checks (also run by `train_scst` for a config built in code)."""
        if self.select_by not in SELECT_BY:
            raise InputError(f"select_by={self.select_by!r}: unknown (known: {', '.join(SELECT_BY)})")
        if self.select_by != "last" and not self.monitor_every:
            raise InputError(f"select_by={self.select_by!r} needs monitor_every > 0: the validation score that "
                             "selects the checkpoint is computed by the hacking monitor")
        if self.kl_reference and not self.kl_coef:
            raise InputError(f"kl_reference={self.kl_reference!r} has no effect with kl_coef=0: set kl_coef > 0")
        if self.stop_on_gaming and not self.monitor_every:
            raise InputError("stop_on_gaming needs monitor_every > 0: the gaming signature is the hacking monitor's")
        if self.length_mask_slack != 2 and not self.length_mask:
            raise InputError(f"length_mask_slack={self.length_mask_slack} has no effect with length_mask off: set "
                             "length_mask: true")
        if check_mix_normalisation(self.mix_normalisation) == "normalize_then_sum" and self.baseline == "greedy":
            raise InputError("mix_normalisation=normalize_then_sum needs a baseline over the k samples (mean or "
                             "loo): the greedy caption is not among the samples each component is normalised over")


@dataclass
class SCSTResult:
    """What stage 2 produced (`best_*`: the checkpoint `select_by` chose; None / 0 with `select_by: last`)."""

    final_dir: Path
    steps: int
    losses: list[float]
    nonfinite_total: int
    best_dir: Path | None = None
    best_step: int = 0
    best_score: float | None = None
    select_by: str = "last"
    zero_spread_fraction: float | None = None  # images whose k rewards were all equal, over every step
    degenerate_warning: str | None = None  # the degenerate-reward warning, when it was raised
    kept_dir: Path | None = None  # stop_on_gaming: the last monitored model before a gaming signature
    kept_step: int = 0
    stopped_step: int = 0  # stop_on_gaming: the monitored step whose gaming signature stopped the run (0: none)

    @property
    def selected_dir(self) -> Path:
        """The model to report: `best_dir` when a validation signal selected one, else `kept_dir` (stop_on_gaming),
        else `final_dir`."""
        if self.best_dir is not None:
            return self.best_dir
        return self.kept_dir if self.kept_dir is not None else self.final_dir


def gaming_thresholds(config: SCSTConfig) -> GamingThresholds:
    """The hacking monitor's warning thresholds from `scst.monitor_*`."""
    return GamingThresholds(reward_rise=config.monitor_reward_rise, rep_rise=config.monitor_rep_rise,
                            length_rise=config.monitor_length_rise, distinct_drop=config.monitor_distinct_drop,
                            incorrect_rise=config.monitor_incorrect_rise, cider_drop=config.monitor_cider_drop)


def guard_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` (an SCST config as a dict) without the monitor thresholds and the guard keys at their default."""
    defaults = SCSTConfig()
    return {key: value for key, value in settings.items() if key not in MONITOR_THRESHOLD_FIELDS
            and not (key in GUARD_FIELDS and value == getattr(defaults, key))}


def scst_loss(logits: torch.Tensor, tokens: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """SCST's policy-gradient loss `−mean((r − b)·log p(y))` for logits `[B·k, T, V]` of captions `tokens` `[B·k, T]`.

    log p(y) is summed over the tokens up to **and including** the first <eos> (`token_log_probs`), so the end
    token's log-probability is always in the gradient; `advantages` is `[B, k]`.
    """
    return policy_gradient_loss(token_log_probs(logits, tokens), advantages)


def policy_gradient_loss(token_log_p: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """`−mean((r − b)·log p(y))` from per-token log-probabilities `[B·k, T]` (zero after the end token) and
    advantages `[B, k]`: log p(y) is the sum over the caption's tokens, its end token included."""
    log_p = token_log_p.sum(1).view_as(advantages)
    return -(advantages.to(log_p.device) * log_p).mean()


def compute_advantages(rewards: torch.Tensor, baseline: str,
                       greedy_rewards: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Return (repaired rewards, advantages, number of non-finite rewards) for rewards `[B, k]`.

    Non-finite rewards are replaced by the mean of the image's finite rewards (0 if none is finite) before
    the baseline is computed, so their advantage is 0 under the `mean` baseline.
    """
    if baseline not in BASELINES:
        raise InputError(f"unknown SCST baseline {baseline!r} (known: {', '.join(BASELINES)})")
    rewards = rewards.float()
    finite = torch.isfinite(rewards)
    count = int((~finite).sum())
    n_finite = finite.sum(1, keepdim=True)
    finite_mean = torch.where(finite, rewards, torch.zeros_like(rewards)).sum(1, keepdim=True) / n_finite.clamp(min=1)
    repaired = torch.where(finite, rewards, finite_mean.expand_as(rewards))
    k = rewards.shape[1]
    if baseline == "mean":
        base = repaired.mean(1, keepdim=True).expand_as(repaired)
    elif baseline == "loo":
        if k < 2:
            raise InputError("the leave-one-out baseline needs k >= 2 captions per image")
        base = (repaired.sum(1, keepdim=True) - repaired) / (k - 1)
    else:
        if greedy_rewards is None:
            raise InputError("the greedy baseline needs the rewards of the greedy captions")
        g = greedy_rewards.float().view(-1, 1)
        g_finite = torch.isfinite(g)
        count += int((~g_finite).sum())
        base = torch.where(g_finite, g, finite_mean).expand_as(repaired)
    advantages = repaired - base
    # A non-finite reward gets advantage 0 whatever the baseline ("replaced by the baseline").
    advantages = torch.where(finite, advantages, torch.zeros_like(advantages))
    return repaired, advantages, count


def fluency_stats(captions: Sequence[str]) -> tuple[float, float]:
    """(Rep-1, %Incorrect) of a list of captions, from pacs.eval.fluency (NaN, with a warning, if it is unavailable)."""
    try:
        from pacs.eval.fluency import incorrect_rate, rep_n
    except ImportError as error:
        logger.warning("Rep-1/%%Incorrect not logged: pacs.eval.fluency is unavailable (%s)", error)
        return float("nan"), float("nan")
    return float(rep_n(list(captions), 1)), float(incorrect_rate(list(captions)))


def scst_total_steps(config: SCSTConfig, n_train: int) -> int:
    """The optimizer steps of an SCST run over `n_train` images: the whole batches of an epoch (the last partial
    one is dropped) times `epochs`, capped by `max_steps`."""
    steps = (n_train // config.batch_size) * config.epochs
    return min(steps, config.max_steps) if config.max_steps else steps


def train_scst(config: SCSTConfig, init_checkpoint: str | Path, features: FeatureCache | None,
               train: Sequence[tuple[str, Sequence[str]]], reward: RewardFn,
               on_step: Callable[[int, Any], None] | None = None,
               validation: Mapping[str, Sequence[str]] | None = None,
               policy: CaptionPolicy | None = None) -> SCSTResult:
    """Fine-tune the captioner in `init_checkpoint` on `train` ((image_id, references) pairs) with `reward`.

    Resumes from the latest checkpoint in `<output_dir>/checkpoints` (or the folder `resume` names); writes
    `<output_dir>/final` (a captioner folder) and `<output_dir>/log.csv`. `on_step(step, model)`, when given, is
    called on every process with the unwrapped captioner before the first update (step 0, or the resumed step)
    and after every optimizer step (e.g. to monitor held-out scores); it must not change the model.
    `validation` ({image_id: references}, features cached) feeds the hacking monitor (`monitor_every`), which
    writes `<output_dir>/monitor.csv` and, with `select_by` cider / reward, `<output_dir>/best`.
    `policy` (`pacs.captioner.modeling.policy`): the captioner loaded from `init_checkpoint` (default: pacs' own
    captioner over `features`; a `pacs.captioner.modeling.hf_policy.HFPolicy` for a transformers folder).
    """
    loop = SCSTLoop(config, init_checkpoint, features, train, reward, validation, policy, on_step)
    loop.begin()
    try:  # the bar is closed before an error (e.g. a diverged loss) is printed
        while loop.running():
            if loop.step():
                loop.checkpoint()
    finally:
        loop.progress.close()
    return loop.result()


def check_scst_inputs(config: SCSTConfig, features: FeatureCache | None, train: Sequence[tuple[str, Sequence[str]]],
                      reward: RewardFn, validation: Mapping[str, Sequence[str]] | None,
                      policy: CaptionPolicy | None) -> dict[str, list[str]]:
    """Check the config, the reward's aggregation and the images before any work; the monitor's validation sample."""
    if config.samples not in SAMPLINGS:
        raise InputError(f"unknown SCST sampling {config.samples!r} (known: {', '.join(SAMPLINGS)})")
    if config.baseline not in BASELINES:
        raise InputError(f"unknown SCST baseline {config.baseline!r} (known: {', '.join(BASELINES)})")
    config.check_guards()  # also for a config built in code
    built = getattr(reward, "mix_normalisation", "weighted_sum")
    if built != "weighted_sum" and built != config.mix_normalisation:  # build_reward(..., mix_normalisation=...)
        raise InputError(f"the reward was built with mix_normalisation={built!r} but scst.mix_normalisation="
                         f"{config.mix_normalisation!r}: SCST aggregates as its config says; set it there")
    if policy is None:
        missing = features.missing(image_id for image_id, _ in train)
        if missing:
            raise InputError(f"{len(missing)} image id(s) lack cached features, e.g. {missing[:3]}")
    else:
        missing = policy.missing_images(str(image_id) for image_id, _ in train)
        if missing:
            raise InputError(f"{len(missing)} image id(s) have no image, e.g. {missing[:3]}")
    check_anchor(reward, config.cider_anchor)
    return _monitor_sample(config, validation, features, policy)


class SCSTLoop:
    """Stage 2's loop: a set-up (`__init__`, `begin`), a step (`step`), a check-point (`checkpoint`) and a
    result (`result`); the resumable state is `state` (`step`, `epoch`, `position`, the non-finite counters,
    `best_score`, `best_step`, the reward-spread window)."""

    def __init__(self, config: SCSTConfig, init_checkpoint: str | Path, features: FeatureCache | None,
                 train: Sequence[tuple[str, Sequence[str]]], reward: RewardFn,
                 validation: Mapping[str, Sequence[str]] | None = None, policy: CaptionPolicy | None = None,
                 on_step: Callable[[int, Any], None] | None = None) -> None:
        """Check the inputs, load the policy (and the KL reference), prepare the optimizer, restore the latest
        checkpoint, start the trackers, the progress bar and the hacking monitor."""
        monitored = check_scst_inputs(config, features, train, reward, validation, policy)
        self.config, self.train, self.reward, self.on_step = config, train, reward, on_step
        self.init_checkpoint, self.out = init_checkpoint, Path(config.output_dir)
        self.policy = policy or PacsPolicy.load(init_checkpoint, features)
        model = self.policy.module
        bad = nonfinite_parameter(model.named_parameters())
        if bad is not None:
            raise NonFiniteError(f"init_checkpoint {init_checkpoint}: weight {bad!r} is not finite (NaN/inf): the "
                                 "model it was trained into diverged; retrain it with a lower learning rate",
                                 parameter="init_checkpoint")
        config.max_length = min(config.max_length, self.policy.max_length)
        self.accelerator = accelerator = make_accelerator(self.out, "log.csv", SCST_COLUMNS, config.mixed_precision,
                                                          tracker_names(config.trackers, config.tensorboard, "scst"))
        self.reference = None
        if config.kl_coef > 0:
            self.reference = self.policy.reference(config.kl_reference or init_checkpoint, accelerator.device)
            logger.info("scst: KL guard, beta=%g, reference policy %s", config.kl_coef, self.reference.folder)
        seed_everything(config.seed)
        self.plan = BatchPlan(len(train), config.batch_size, config.micro_batch_size, accelerator.num_processes,
                              config.seed, "scst")
        self.total_steps = scst_total_steps(config, len(train))
        if self.plan.dropped_per_epoch:
            logger.info("scst: %d image(s) per epoch do not fill a batch and are skipped", self.plan.dropped_per_epoch)
        optimizer = make_adam([p for p in model.parameters() if p.requires_grad], lr=config.lr)
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        self.checkpoints = CheckpointManager(accelerator, self.out / "checkpoints", config.keep_checkpoints)
        self._restore()
        start_trackers(accelerator, "scst", dict(to_dict(config), init_checkpoint=str(init_checkpoint)),
                       self.state["step"] if self.state["step"] else None)
        self.losses: list[float] = []
        self.stage, self.hint = f"scst[{config.reward}]", f"lr={config.lr:g}"
        name = self.out.name  # the stage's own name on its bar (`scst-clip-s-kl0.1`), tagged with the seed
        self.progress = progress(total=self.total_steps, initial=self.state["step"],
                                 desc=name if name.startswith("scst") else f"scst {name}",
                                 disable=not accelerator.is_main_process)
        self.monitor = None
        if monitored:
            self.monitor = HackingMonitor(self.out / MONITOR_FILE, monitored, features,
                                          getattr(self.policy, "vocab", None), reward, gaming_thresholds(config),
                                          config.max_length, config.monitor_every, self.total_steps,
                                          resume_step=self.state["step"] if self.resumed else None,
                                          policy=self.policy)

    def _restore(self) -> None:
        """The state of the latest checkpoint (or a fresh one), the reward's caches; stale outputs of a fresh run
        removed."""
        config, accelerator = self.config, self.accelerator
        state = self.checkpoints.restore(resume_target(config.resume), self.total_steps)
        self.resumed = state is not None
        state = state or {"step": 0, "epoch": 0, "position": 0, "nonfinite_streak": 0, "nonfinite_total": 0}
        state.setdefault("best_score", None)  # checkpoints written before the guards lack them
        state.setdefault("best_step", 0)
        if config.stop_on_gaming:  # only then: the checkpoints of unguarded runs stay as they were
            state.setdefault("kept_step", 0)
            state.setdefault("stopped_step", 0)
        self.state = state
        self.stop = GamingStop(gaming_thresholds(config), state["kept_step"], state["stopped_step"]) \
            if config.stop_on_gaming else None
        self.spread = SpreadWatch(config.reward, config.k, config.degenerate_window, config.degenerate_fraction,
                                  self.total_steps, state.get("reward_spread"))
        if not self.resumed and accelerator.is_main_process:
            for stale in (self.out / "best", self.out / KEPT_DIR, self.out / MONITOR_FILE):  # left by an earlier run
                if stale.is_dir():
                    shutil.rmtree(stale)
                elif stale.exists():
                    stale.unlink()
        accelerator.wait_for_everyone()
        restored = self.checkpoints.restored_extra()
        if restored is not None and "reward" in restored and hasattr(self.reward, "load_state_dict"):
            self.reward.load_state_dict(restored["reward"])  # the caches of the run it continues: the same batches

    def begin(self) -> None:
        """Monitor the init (or resumed) model when due and call `on_step` on it, before the first update."""
        if self.monitor is not None and self.monitor.due(self.state["step"]):
            self.monitor_step(self.state["step"])
        if self.on_step is not None:
            self.on_step(self.state["step"], self.accelerator.unwrap_model(self.model))

    def running(self) -> bool:
        """Whether steps remain (none after a gaming signature stopped the run)."""
        return self.state["step"] < self.total_steps and not (self.stop is not None and self.stop.stopped_step)

    def step(self) -> bool:
        """One optimizer step over a global batch, its checks, monitor row and log row; whether a check-point is
        due."""
        accelerator, config, state = self.accelerator, self.config, self.state
        stats = self._gradients()
        loss = reduce_mean(accelerator, stats["loss"])  # every micro-batch's loss, all processes: one verdict
        check_loss(accelerator, loss, self.stage, state["step"] + 1, self.hint)
        if config.grad_clip > 0:
            accelerator.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        state["step"] += 1
        state["epoch"], state["position"] = self.plan.advance(state["epoch"], state["position"])
        step = state["step"]
        nonfinite = self._count_rewards(stats, step)
        self.losses.append(loss)
        self.progress.update(1)
        saving = is_due(step, config.save_every) or step == self.total_steps
        monitoring = self.monitor is not None and self.monitor.due(step)
        if self.on_step is not None or saving or monitoring:  # never monitor, select, checkpoint or save a model
            check_weights(accelerator, self.model, self.stage, step, self.hint)  # with non-finite weights
        if monitoring:
            self.monitor_step(step)
        if self.on_step is not None:
            self.on_step(step, accelerator.unwrap_model(self.model))
        if is_due(step, config.log_every) or step == self.total_steps:
            accelerator.log({**_log_row(accelerator, stats, loss, config.lr, nonfinite, state["epoch"]),
                             "zero_spread": self.spread.fractions[-1]}, step=step)
        if nonfinite:
            logger.warning("scst step %d: %d non-finite reward(s) replaced by the baseline", step, nonfinite)
        if state["nonfinite_streak"] >= config.nonfinite_patience:
            raise NonFiniteRewardError(
                f"reward {config.reward!r} returned NaN/inf values in {state['nonfinite_streak']} consecutive steps "
                f"(last at step {step}, {state['nonfinite_total']} in total): check the reward model and inputs")
        return saving or (self.stop is not None and bool(self.stop.stopped_step))  # a stopped run is resumable

    def _gradients(self) -> dict[str, Any]:
        """This process's micro-batches of the next step, their gradients accumulated; the step's statistics."""
        micro_batches = self.plan.local_micro_batches(self.state["epoch"], self.state["position"],
                                                      self.accelerator.process_index)
        stats = {"loss": 0.0, "rewards": [], "advantages": [], "captions": [], "nonfinite": 0, "kl": [],
                 "spread": dict.fromkeys(SPREAD_COUNTS, 0)}
        for index, micro in enumerate(micro_batches):
            _scst_micro_step(self.accelerator, self.model, self.policy, [self.train[i] for i in micro], self.reward,
                             self.config, stats, len(micro_batches), sync=index == len(micro_batches) - 1,
                             step=self.state["step"], indices=micro, reference=self.reference)
        return stats

    def _count_rewards(self, stats: dict[str, Any], step: int) -> int:
        """Sum the non-finite rewards and the reward-spread counts over processes into the state; the step's
        non-finite count (the degenerate-reward warning logged when it is raised)."""
        accelerator, state = self.accelerator, self.state
        nonfinite = int(accelerator.reduce(torch.tensor([stats["nonfinite"]], device=accelerator.device),
                                           reduction="sum").item())
        state["nonfinite_total"] += nonfinite
        counts = accelerator.reduce(torch.tensor([stats["spread"][key] for key in SPREAD_COUNTS],
                                                 device=accelerator.device), reduction="sum").tolist()
        degenerate = self.spread.update(step, dict(zip(SPREAD_COUNTS, map(int, counts))))
        state["reward_spread"] = self.spread.state()
        if degenerate and accelerator.is_main_process:
            logger.warning("scst step %d: %s", step, degenerate)
        state["nonfinite_streak"] = state["nonfinite_streak"] + 1 if nonfinite else 0
        return nonfinite

    def monitor_step(self, step: int) -> None:
        """Monitor row of `step`; with `select_by`, keep the model in `best/` when its score is the best so far."""
        accelerator, config, state = self.accelerator, self.config, self.state
        row = self.monitor(accelerator, accelerator.unwrap_model(self.model), step, self.spread.since_last_monitor())
        if self.stop is not None and not self._keep(row):
            return  # a gamed model is never a candidate
        column = SELECT_BY[config.select_by]
        if column is None or step == 0:  # step 0 is the init model: the monitor's baseline, never a candidate
            return
        score = row[column]
        if is_better(score, state["best_score"]):
            state["best_score"], state["best_step"] = score, step
            if accelerator.is_main_process:
                self.policy.save(self.out / "best", accelerator.unwrap_model(self.model),
                                 {"stage": "scst", "reward": config.reward, "step": step,
                                  "init_checkpoint": str(self.init_checkpoint), "select_by": config.select_by,
                                  f"val_{column}": score})
        elif not math.isfinite(score):
            logger.warning("scst step %d: validation %s is %s: never the best model", step, column, score)

    def _keep(self, row: dict[str, float]) -> bool:
        """stop_on_gaming: keep the model of `row`'s step in `kept/` unless the row has a gaming signature (then the
        run stops after this step); whether it was kept."""
        step = int(row["step"])
        kept = self.stop.update(self.monitor.rows[0], row)
        self.state["kept_step"], self.state["stopped_step"] = self.stop.kept_step, self.stop.stopped_step
        if kept and self.accelerator.is_main_process:
            self.policy.save(self.out / KEPT_DIR, self.accelerator.unwrap_model(self.model),
                             {"stage": "scst", "reward": self.config.reward, "step": step,
                              "init_checkpoint": str(self.init_checkpoint), "stop_on_gaming": True})
        elif not kept:
            logger.warning("scst step %d: gaming signature %s on validation: training stops; the model kept is "
                           "step %d's (%s)", step, ", ".join(name for name, _ in self.stop.signatures),
                           self.stop.kept_step, self.out / KEPT_DIR)
        return kept

    def checkpoint(self) -> None:
        """Save a resumable checkpoint: the main process's state, the model, the optimizer, the reward's caches."""
        box = [self.state]
        broadcast_object_list(box, from_process=0)
        self.checkpoints.save(box[0], extra={"reward": self.reward.state_dict()} if hasattr(self.reward, "state_dict")
                              else None)

    def result(self) -> SCSTResult:
        """Check the last weights, save `<output_dir>/final`, finish the trackers; what stage 2 produced."""
        accelerator, config, state = self.accelerator, self.config, self.state
        check_weights(accelerator, self.model, self.stage, state["step"], self.hint)
        final = self.out / "final"
        if accelerator.is_main_process:
            self.policy.save(final, accelerator.unwrap_model(self.model),
                             {"stage": "scst", "reward": config.reward, "step": state["step"],
                              "init_checkpoint": str(self.init_checkpoint),
                              "nonfinite_rewards": state["nonfinite_total"]})
        accelerator.wait_for_everyone()
        finish_trackers(accelerator)
        best_dir = None
        if SELECT_BY[config.select_by] is not None:
            if state["best_score"] is None:
                raise NonFiniteError(f"scst select_by={config.select_by}: no monitored step had a finite validation "
                                     f"{config.select_by} score, so no checkpoint can be selected",
                                     parameter="scst.select_by")
            best_dir = self.out / "best"
            logger.info("scst: selected step %d by validation %s (%.4g); the last step is in %s", state["best_step"],
                        config.select_by, state["best_score"], final)
        kept = None if self.stop is None else self.out / KEPT_DIR
        return SCSTResult(final, int(state["step"]), self.losses, int(state["nonfinite_total"]), best_dir,
                          int(state["best_step"]), state["best_score"], config.select_by, self.spread.fraction,
                          self.spread.warning, kept, int(state.get("kept_step", 0)),
                          int(state.get("stopped_step", 0)))


def _monitor_sample(config: SCSTConfig, validation: Mapping[str, Sequence[str]] | None,
                    features: FeatureCache | None, policy: CaptionPolicy | None = None) -> dict[str, list[str]]:
    """The validation images the hacking monitor captions (empty when it is off); InputError when it has none."""
    if not config.monitor_every:
        return {}
    if not validation:
        raise InputError(f"scst.monitor_every={config.monitor_every}: the hacking monitor needs validation images "
                         "(train_scst(validation={image_id: references}))")
    ids = list(validation)[:config.monitor_images] if config.monitor_images else list(validation)
    missing = (features.missing(str(i) for i in ids) if policy is None
               else policy.missing_images(str(i) for i in ids))
    if missing:
        lack = "lack cached features" if policy is None else "have no image"
        raise InputError(f"scst monitor: {len(missing)} validation image id(s) {lack}, e.g. {missing[:3]}")
    for image_id in ids:
        refs = validation[image_id]
        if isinstance(refs, str) or not refs:
            raise InputError(f"scst monitor: validation image {image_id!r} needs a non-empty list of references")
    return {str(i): list(validation[i]) for i in ids}


def _scst_micro_step(accelerator: Any, model: Any, captioner: CaptionPolicy,
                     batch: Sequence[tuple[str, Sequence[str]]], reward: RewardFn, config: SCSTConfig,
                     stats: dict[str, Any], n_micro: int, sync: bool, step: int, indices: Sequence[int],
                     reference: Any = None) -> None:
    """One micro-batch: k captions per image, rewards, advantages (KL-shaped), the policy-gradient backward."""
    image_ids = [str(image_id) for image_id, _ in batch]
    references = [list(refs) for _, refs in batch]
    feats = captioner.batch(image_ids, accelerator.device)
    policy = accelerator.unwrap_model(model)
    policy.eval()
    with accelerator.autocast():  # mixed_precision bf16/fp16: sampling autocast too (nothing when "no")
        sampled = captioner.sample(policy, feats, config, ExampleRNG(
            example_generators(config.seed, step, indices, SAMPLING, accelerator.device)))
    captions = captioner.decode(sampled)
    greedy_rewards, greedy_tokens = None, None
    if config.baseline == "greedy":
        with accelerator.autocast():
            greedy_tokens = captioner.greedy(policy, feats, config.max_length)
        greedy_captions = captioner.decode(greedy_tokens)
        greedy_rewards = torch.as_tensor(reward(image_ids, greedy_captions, references)).float().cpu().view(-1)
    raw = torch.as_tensor(reward(image_ids, captions, references)).float().cpu()
    if raw.shape != (len(batch), config.k):
        raise InputError(f"reward {config.reward!r} returned shape {tuple(raw.shape)}, expected {(len(batch), config.k)}")
    learnt = mixed_rewards(reward, raw, config.mix_normalisation)  # normalize_then_sum: per-image component z-scores
    repaired, advantages, count = compute_advantages(learnt, config.baseline, greedy_rewards)
    if learnt is not raw:  # log.csv's reward columns stay the weighted sum (comparable across aggregations)
        repaired = compute_advantages(raw, "mean")[0]
    b, k, length = sampled.shape
    tokens = sampled.reshape(b * k, length).to(accelerator.device)
    if reference is not None:  # KL guard: r'(y) = r(y) − β·KL(y), before the baseline (policy still in eval mode)
        with accelerator.autocast():
            kl = reference.sequence_kl(policy, feats, tokens, repeats=k).float().cpu().view(b, k)
            greedy_kl = None if greedy_tokens is None else reference.sequence_kl(
                policy, feats, greedy_tokens.view(b, -1).to(accelerator.device)).float().cpu()
        shaped_greedy = None if greedy_rewards is None else greedy_rewards - config.kl_coef * greedy_kl
        _, advantages, _ = compute_advantages(learnt - config.kl_coef * kl, config.baseline, shaped_greedy)
        stats["kl"].append(kl)
    if config.length_mask:  # out-of-band samples: reward := baseline, advantage 0 (scst_guards)
        advantages = mask_advantages(advantages, length_band_mask(captions, references, config.length_mask_slack))
    model.train()
    dropout = ExampleRNG(example_generators(config.seed, step, indices, DROPOUT, accelerator.device))
    with contextlib.nullcontext() if sync else accelerator.no_sync(model):
        log_p = captioner.token_log_probs(model, policy, feats, tokens, k, dropout)
        loss = policy_gradient_loss(log_p, advantages)
        accelerator.backward(loss / n_micro)
    stats["loss"] += float(loss.detach()) / n_micro
    stats["rewards"].append(repaired)
    stats["advantages"].append(advantages)
    stats["captions"].extend(c for row in captions for c in row)
    stats["nonfinite"] += count
    for key, value in spread_counts(raw, captions).items():
        stats["spread"][key] += value


def _log_row(accelerator: Any, stats: dict[str, Any], loss: float, lr: float, nonfinite: int,
             epoch: int) -> dict[str, float]:
    rewards = accelerator.gather(torch.cat(stats["rewards"]).to(accelerator.device)).float()
    advantages = accelerator.gather(torch.cat(stats["advantages"]).to(accelerator.device)).float()
    words = [len(c.split()) for c in stats["captions"]]
    rep1, incorrect = fluency_stats(stats["captions"])
    row = {"loss": loss, "lr": lr, "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
           "advantage_mean": float(advantages.mean()), "advantage_abs": float(advantages.abs().mean()),
           "length": reduce_mean(accelerator, sum(words) / max(1, len(words))),
           "rep1": reduce_mean(accelerator, rep1), "incorrect": reduce_mean(accelerator, incorrect),
           "nonfinite": nonfinite, "epoch": epoch}
    if stats["kl"]:  # the KL guard is on: mean KL(y) over every sampled caption of the step, all processes
        row["kl"] = float(accelerator.gather(torch.cat(stats["kl"]).to(accelerator.device)).float().mean())
    return row
