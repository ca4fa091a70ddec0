"""What a recipe run does differently per captioner kind (`captioner.kind`, `pacs.captioner.orchestration.captioner_kind`).

`captioner_kind(config)` chooses the kind once per run; the one stage runner of
`pacs.captioner.orchestration.pipeline` (`stage_names`, `plan_stages`, `run_pipeline`) asks it only what differs:

- the stages before XE (`before_xe`: pacs' captioner `vocab` and `features/train`, a transformers folder none) and
  the feature stage of a set (`feature_stages`: `features/<set>`, or none: the model reads the images);
- whether XE runs (`trains_xe`), its body and its settings / inputs; the starting model without XE (`init_model`)
  and the table's reference row (`start`: `xe`, or `init`);
- the SCST policy (`scst_policy`, a `pacs.captioner.modeling.policy.CaptionPolicy`; None: `train_scst`'s own
  `PacsPolicy` over `train_features`) and what the SCST stages add to their settings and inputs;
- the settings / inputs of stage `eval/<model>/<set>` and how a model captions a test set (`caption`).

A third kind is one more class here, registered in `KINDS`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pacs.captioner.modeling.hf_captioning import HFCaptionOptions, check_folder, generate_captions, load_hf_captioner
from pacs.captioner.modeling.hf_policy import HFPolicy
from pacs.captioner.modeling.hf_random_init import build_random_captioner, caption_words
from pacs.captioner.modeling.hf_train_xe import train_hf_xe
from pacs.captioner.modeling.train_xe import train_xe
from pacs.captioner.modeling.vocab import build_vocab, load_vocab
from pacs.captioner.orchestration.pipeline_config import PipelineConfig
from pacs.captioner.orchestration.shared_stages import (
    RecipeRun,
    caption_with_features,
    test_feature_stage,
    test_set_selection,
)
from pacs.captioner.orchestration.stage_fingerprints import (
    data_inputs,
    reward_model_inputs,
    reward_model_settings,
    settings_of,
    trainer_settings,
)


class CaptionerKind:
    """The stage graph's answers shared by every kind (pacs' captioner's); a kind overrides what differs."""

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        self.train_features: Any = None  # what `train_scst` reads besides the policy (pacs: the feature cache)

    @property
    def trains_xe(self) -> bool:
        """Whether stage `xe` runs (its model starts SCST and is the table's reference row)."""
        return True

    @property
    def start(self) -> str:
        """The first model's row: `xe`, or `init` (the given model itself) without XE."""
        return "xe" if self.trains_xe else "init"

    def init_model(self) -> Path:
        """The starting model's folder when XE does not run."""
        raise NotImplementedError

    def init_stages(self) -> list[str]:
        """The stages of this run that make the starting model (`init`: none, the model is given)."""
        return []

    def check(self) -> list[str]:
        """Checks of the kind's own inputs before any work (InputError); their lines in the dry-run's list."""
        return []

    def before_xe(self) -> list[str]:
        """The stages before XE, in order (XE's upstream)."""
        return []

    def feature_stages(self, set_name: str) -> list[str]:
        """The feature stage of set `set_name` (`train` or a test set) a model reading it depends on."""
        return []

    def prepare(self, run: RecipeRun, train_store: Any, images: dict[str, Any]) -> None:
        """Run the stages before XE."""

    def plan_prepare(self, run: RecipeRun, plan_features: Any) -> None:
        """`StageRunner.plan` of the stages before XE (`plan_features(name, selection, inputs)` plans a feature stage)."""

    def plan_test_features(self, set_name: str, set_config: dict[str, Any], plan_features: Any) -> None:
        """`StageRunner.plan` of the feature stage of a test set."""

    def test_features(self, run: RecipeRun, set_name: str, items: list, set_config: dict[str, Any]) -> Any:
        """Stage `features/<set>` of a test set's `items`: what `caption` reads besides the images."""
        return None

    def init_inputs(self, stages: Any) -> dict[str, Any]:
        """The starting model's files as inputs of the stages training from it."""
        return {}

    def xe_parts(self, stages: Any, init_inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The settings and inputs of stage `xe` (its run and its plan)."""
        raise NotImplementedError

    def train_xe(self, xe_config: Any, train_store: Any, images: dict[str, Any], validation: dict[str, list[str]],
                 state: Any) -> Any:
        """Stage `xe`'s training (every process): its result."""
        raise NotImplementedError

    def scst_settings(self) -> dict[str, Any]:
        """What the kind adds to the settings of every stage `scst-<reward>`."""
        return {}

    def scst_policy(self, init: Path, images: dict[str, Any], scst: Any, state: Any) -> Any:
        """The `CaptionPolicy` SCST trains from model folder `init` (None: `train_scst` loads pacs' own)."""
        return None

    def eval_parts(self, stages: Any, set_name: str, folder: Path,
                   starting: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """The settings and inputs of stage `eval/<model>/<set>` (its run and its plan); `starting`: the model is
        the given starting folder itself (no stage made it)."""
        raise NotImplementedError

    def caption(self, run: RecipeRun, folder: Path, items: list, features: Any,
                scorers: Any) -> tuple[dict[str, str], dict[str, Any] | None] | None:
        """Caption a test set's `items` with model `folder` (`scorers()`: the evaluation's scorers): the captions
        and their contrastive scores per image (None: scored from `scorers()` with the rows), on the main process
        (None on the others)."""
        raise NotImplementedError


class PacsCaptioner(CaptionerKind):
    """pacs' own captioner over CLIP grid features: vocab, features/train, xe, SCST, features/<set>, evaluation."""

    def before_xe(self) -> list[str]:
        """`vocab`, `features/train`."""
        return ["vocab", *self.feature_stages("train")]

    def feature_stages(self, set_name: str) -> list[str]:
        """`features/<set>`."""
        return [f"features/{set_name}"]

    def vocab_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The settings and inputs of stage `vocab` (its run and its plan)."""
        config = self.config
        return {"vocab": settings_of(config.vocab), "data": settings_of(config.data)}, data_inputs(config.data)

    def prepare(self, run: RecipeRun, train_store: Any, images: dict[str, Any]) -> None:
        """Stages `vocab` (main process; the others wait) and `features/train` (every process)."""
        config = self.config
        vocab_path = run.dir / "vocab.json"

        def make_vocab() -> dict[str, Any]:
            """Stage `vocab` (main process)."""
            v = config.vocab
            vocab = build_vocab(v.kind, train_store.captions(), v.min_count, v.vocab_size, v.max_length)
            vocab.save(vocab_path)
            return {"size": len(vocab)}

        run.stages.run("vocab", make_vocab, *self.vocab_parts(), outputs=[vocab_path])
        self.vocab = load_vocab(vocab_path)
        self.train_features = run.feature_stage("train", images, {"data": settings_of(config.data)},
                                                data_inputs(config.data))

    def plan_prepare(self, run: RecipeRun, plan_features: Any) -> None:
        """Plans of `vocab` and `features/train`."""
        run.stages.plan("vocab", *self.vocab_parts(), outputs=[run.dir / "vocab.json"])
        plan_features("train", {"data": settings_of(self.config.data)}, data_inputs(self.config.data))

    def plan_test_features(self, set_name: str, set_config: dict[str, Any], plan_features: Any) -> None:
        """Plan of `features/<set>`."""
        plan_features(set_name, test_set_selection(self.config, set_config), data_inputs(set_config))

    def test_features(self, run: RecipeRun, set_name: str, items: list, set_config: dict[str, Any]) -> Any:
        """Stage `features/<set>` (every process): the test set's feature cache."""
        return test_feature_stage(run, set_name, items, set_config)

    def xe_parts(self, stages: Any, init_inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model, data and XE settings; no inputs (its upstream: vocab and features/train)."""
        config = self.config
        return ({"xe": trainer_settings(config.xe), "model": settings_of(config.model),
                 "data": settings_of(config.data), "seed": config.seed}, {})

    def train_xe(self, xe_config: Any, train_store: Any, images: dict[str, Any], validation: dict[str, list[str]],
                 state: Any) -> Any:
        """`train_xe` of a fresh captioner on the training features."""
        config = self.config
        return train_xe(xe_config, config.model, self.vocab, self.train_features, train_store.pairs(), validation,
                        feature_source=config.features.source.to_record())

    def eval_parts(self, stages: Any, set_name: str, folder: Path,
                   starting: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """The test set, decoding and scoring settings; the data and reward models' files (upstream: the model's
        stage and features/<set>)."""
        config = self.config
        e, set_config = config.evaluation, config.evaluation.test_sets[set_name]
        chosen = {} if e.contrastive_models is None else {"contrastive_models": e.contrastive_models}
        return ({"test_set": set_config, "beam_size": e.beam_size, "text_metrics": e.text_metrics,
                 "max_images": e.max_images, "reward_models": reward_model_settings(config.reward_models), **chosen},
                {**data_inputs(set_config), **reward_model_inputs(stages, config.reward_models)})

    def caption(self, run: RecipeRun, folder: Path, items: list, features: Any,
                scorers: Any) -> tuple[dict[str, str], dict[str, Any] | None] | None:
        """Beam search over the features and the contrastive scores, split over the processes."""
        return caption_with_features(run, folder, items, features, scorers)


class TransformersCaptioner(CaptionerKind):
    """A transformers image-to-text folder (`captioner: {kind: transformers, checkpoint: FOLDER}`): optional XE
    (`captioner.xe`, `pacs.captioner.modeling.hf_train_xe`), SCST with an `HFPolicy`, evaluation by the model's own
    `generate`. No vocabulary and no grid features; the stages' settings hold the `captioner` section, their inputs
    the checkpoint folder's sha256."""

    @property
    def trains_xe(self) -> bool:
        """`captioner.xe`."""
        return self.config.captioner.xe

    @property
    def built(self) -> bool:
        """Whether stage `init` builds the starting model from random weights (`captioner.init`)."""
        return self.config.captioner.init is not None

    def init_model(self) -> Path:
        """`captioner.checkpoint`, or stage `init`'s folder `<run_dir>/init`."""
        return Path(self.config.run_dir) / "init" if self.built else Path(self.config.captioner.checkpoint)

    def init_stages(self) -> list[str]:
        """`init` when it builds the starting model."""
        return ["init"] if self.built else []

    def check(self) -> list[str]:
        """The folder loads as a captioner (`check_folder`); nothing to check of a model stage `init` builds."""
        if self.built:
            return []
        check_folder(self.config.captioner.checkpoint, self.config.captioner.prompt)
        return ["transformers captioner folder (check_folder)"]

    def before_xe(self) -> list[str]:
        """`init` when it builds the starting model."""
        return self.init_stages()

    def init_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The settings and inputs of stage `init` (its run and its plan): the sizes, the caption length, the seed
        drawing the weights and the data whose words are the vocabulary; the data's files."""
        config = self.config
        return ({"init": settings_of(config.captioner.init), "max_length": config.scst.max_length,
                 "seed": config.seed, "data": settings_of(config.data)}, data_inputs(config.data))

    def prepare(self, run: RecipeRun, train_store: Any, images: dict[str, Any]) -> None:
        """Stage `init` (main process; the others wait) when it builds the starting model."""
        if not self.built:
            return
        config, folder = self.config, self.init_model()

        def build() -> dict[str, Any]:
            """Stage `init` (main process): the random-weight captioner over the training captions' words."""
            sizes = config.captioner.init
            return build_random_captioner(sizes, caption_words(train_store.captions()), sizes.image_size,
                                          config.scst.max_length, config.seed, folder)

        run.stages.run("init", build, *self.init_parts(), outputs=[folder])

    def plan_prepare(self, run: RecipeRun, plan_features: Any) -> None:
        """Plan of `init` when it builds the starting model."""
        if self.built:
            run.stages.plan("init", *self.init_parts(), outputs=[self.init_model()])

    def init_inputs(self, stages: Any) -> dict[str, Any]:
        """The checkpoint folder (none when stage `init` builds it: that stage is upstream)."""
        return {} if self.built else {"checkpoint": stages.checkpoint(Path(self.config.captioner.checkpoint))}

    def xe_parts(self, stages: Any, init_inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The XE, captioner and data settings; the data and the checkpoint folder."""
        config = self.config
        return ({"xe": trainer_settings(config.xe), "captioner": settings_of(config.captioner),
                 "data": settings_of(config.data), "seed": config.seed, "max_length": config.scst.max_length},
                {**data_inputs(config.data), **init_inputs})

    def train_xe(self, xe_config: Any, train_store: Any, images: dict[str, Any], validation: dict[str, list[str]],
                 state: Any) -> Any:
        """`train_hf_xe` of the checkpoint's `HFPolicy` on the training references."""
        config = self.config
        policy = HFPolicy.load(self.init_model(), images, config.captioner.options(), config.scst.max_length,
                               device=state.device, seed=config.seed)
        return train_hf_xe(xe_config, policy, train_store.pairs(), validation)

    def scst_settings(self) -> dict[str, Any]:
        """The `captioner` section."""
        return {"captioner": settings_of(self.config.captioner)}

    def scst_policy(self, init: Path, images: dict[str, Any], scst: Any, state: Any) -> Any:
        """The `HFPolicy` of `init` over the images."""
        return HFPolicy.load(init, images, self.config.captioner.options(), scst.max_length, device=state.device,
                             seed=scst.seed)

    def eval_parts(self, stages: Any, set_name: str, folder: Path,
                   starting: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """The test set, decoding (prompt, length) and scoring settings; the data and reward models' files, and
        the checkpoint folder's when the model is the starting one."""
        config = self.config
        e, set_config = config.evaluation, config.evaluation.test_sets[set_name]
        inputs = {**data_inputs(set_config), **reward_model_inputs(stages, config.reward_models)}
        if starting:
            inputs["checkpoint"] = stages.checkpoint(folder)
        return ({"test_set": set_config, "beam_size": e.beam_size, "text_metrics": e.text_metrics,
                 "max_images": e.max_images, "captioner": {"prompt": config.captioner.prompt},
                 "max_length": config.scst.max_length, "reward_models": reward_model_settings(config.reward_models)},
                inputs)

    def caption(self, run: RecipeRun, folder: Path, items: list, features: Any,
                scorers: Any) -> tuple[dict[str, str], dict[str, Any] | None] | None:
        """The model's own `generate` (`pacs caption`'s rules, beam `evaluation.beam_size`) on the main process;
        scored with the rows."""
        state = run.stages.state
        if not state.is_main_process:
            return None
        config, e = self.config, self.config.evaluation
        scorers()
        options = HFCaptionOptions(prompt=config.captioner.prompt, beam_size=e.beam_size,
                                   max_new_tokens=config.scst.max_length, batch_size=e.batch_size,
                                   device=str(state.device))
        paths = {i.image_id: i.image_path for i in items}
        return generate_captions(load_hf_captioner(folder, str(state.device)), paths, options), None


#: `captioner.kind` -> its class
KINDS: dict[str, type[CaptionerKind]] = {"pacs": PacsCaptioner, "transformers": TransformersCaptioner}


def captioner_kind(config: PipelineConfig) -> CaptionerKind:
    """The run's captioner kind (chosen once per run)."""
    return KINDS[config.captioner.kind](config)
