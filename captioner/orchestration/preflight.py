"""Everything a recipe run needs, checked when it loads, before its run folder exists or any stage takes a step.

`preflight_problems(config)` walks every stage the config will run and returns one line per missing thing: data
files and image folders (training data and every test set), the feature backbone, the reward models the rewards
and the evaluation's contrastive columns use (only those: `needed_slots`), the KL guard's reference captioner,
precomputed features, Java for METEOR / SPICE (`pacs.eval.java_metrics`) and the run folder. Each line names the config
key to set. `check_before_start` raises them together as one `InputError` (one line: `(1) ...; (2) ...`), so a run with three problems is
refused once, listing three, instead of failing on the first after hours of work.
"""
from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from pacs.captioner.orchestration.backbone_source import BackboneSource
from pacs.captioner.orchestration.pipeline_config import REWARD_MODEL_SLOTS, PipelineConfig, made_checkpoints
from pacs.metric.common.errors import InputError

#: evaluation.contrastive_models accepts the slot names of `reward_models`
SLOT_NAMES = tuple(slot for _, slot in REWARD_MODEL_SLOTS)
#: the evaluation columns each slot's model scores (and their Ref- variants)
COLUMNS = {"clip": "CLIP-S", "pacs": "PAC-S", "pac": "PAC-S++"}


def source_given(source: BackboneSource) -> bool:
    """Whether a `reward_models` slot names a model (a backbone, a checkpoint or a random config)."""
    return bool(source.backbone or source.checkpoint or source.random_config)


def reward_slots(specs: Iterable[str]) -> list[str]:
    """The `reward_models` slots the contrastive terms of reward `specs` use (`clip`, `pacs`, `pac`), in slot order."""
    from pacs.metric.scoring.registry import METRICS
    from pacs.rewards.registry import parse_reward_spec

    slots = dict(REWARD_MODEL_SLOTS)
    used = {slots[METRICS[name].family] for spec in specs for name, _ in parse_reward_spec(spec) if name in METRICS}
    return [slot for slot in SLOT_NAMES if slot in used]


def evaluation_slots(config: PipelineConfig) -> list[str]:
    """The slots whose CLIP-S / PAC-S / PAC-S++ columns the evaluation reports: `evaluation.contrastive_models`, or
    (null, the default) every slot that names a model."""
    chosen = config.evaluation.contrastive_models
    if chosen is not None:
        return [slot for slot in SLOT_NAMES if slot in chosen]
    return [slot for slot in SLOT_NAMES if source_given(getattr(config.reward_models, slot))]


def needed_slots(config: PipelineConfig) -> list[str]:
    """Every `reward_models` slot some stage of the run loads (SCST rewards, evaluation columns), in slot order."""
    used = set(reward_slots(config.rewards)) | set(evaluation_slots(config))
    return [slot for slot in SLOT_NAMES if slot in used]


def _pretrained_problem(name: str, tag: str) -> str | None:
    """Why open_clip's pretrained `name/tag` cannot load offline (None: cached, or downloads are allowed)."""
    import open_clip

    cfg = open_clip.get_pretrained_cfg(name, tag)
    if not cfg or cfg.get("file"):
        return None
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    hub = cfg.get("hf_hub") or ""
    if hub:
        from huggingface_hub import try_to_load_from_cache

        repo, filename = os.path.split(hub.rstrip("/")) if not hub.endswith("/") else (hub.rstrip("/"), "")
        names = [filename] if filename else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
        if any(isinstance(try_to_load_from_cache(repo, n), str) for n in names):
            return None
        where = f"the Hugging Face repo {repo}"
    else:
        url = cfg.get("url", "")
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "clip" / os.path.basename(url)
        if cache.is_file():
            return None
        where = url
    if not offline:
        return None  # open_clip downloads it when the stage starts
    return (f"pretrained weights {name}/{tag} are not available offline (not in the local cache of {where}, "
            f"HF_HUB_OFFLINE=1)")


def two_origins_problem(source: BackboneSource, key: str) -> str | None:
    """A model source given two origins (`random_config` and a `checkpoint` or `backbone`): which one would be
    built is not what a reader of the config expects, so both are named and neither is chosen."""
    if not source.random_config:
        return None
    others = [f"{key}.checkpoint={source.checkpoint}"] if source.checkpoint else []
    if source.backbone and source.backbone != BackboneSource.backbone:  # the class default is no choice of the user's
        others.append(f"{key}.backbone={source.backbone}")
    if not others:
        return None
    return (f"{key}: two origins for one model: {key}.random_config (a random model) and {' and '.join(others)}; "
            f"keep one (to load the file, remove {key}.random_config: {key}.random_config={{}})")


def source_problem(source: BackboneSource, key: str, made: Collection[Path] = ()) -> str | None:
    """Why the model a `BackboneSource` describes cannot be built (None when it can, as far as files tell;
    `made`: checkpoints a stage of the run makes before any stage reads them, not checked)."""
    problem = two_origins_problem(source, key)
    if problem or source.random_config:
        return problem
    if source.checkpoint and Path(source.checkpoint) in made:
        return None
    if source.checkpoint:
        path = Path(source.checkpoint).expanduser()
        if not path.exists():
            return f"{key}.checkpoint: {path} not found; set {key}.checkpoint to the model file or folder"
        if source.arch and source.arch not in ("openai", "openclip-laion") and not Path(source.arch).is_file():
            return f"{key}.arch: {source.arch} is neither an architecture file nor a preset (openai, openclip-laion)"
        return None
    if not source.backbone:
        return f"{key}: no model; set {key}.backbone (open_clip NAME[/PRETRAINED or FILE]) or {key}.checkpoint"
    spec = source.backbone
    if spec.startswith("local-dir:"):
        folder = Path(spec[len("local-dir:"):]).expanduser()
        return None if folder.is_dir() else f"{key}.backbone: {spec}: folder {folder} not found"
    if spec.startswith("hf-hub:"):
        return None
    name, _, pretrained = spec.partition("/")
    if not pretrained or name == "tiny-random":
        return None
    import open_clip

    if open_clip.get_pretrained_cfg(name, pretrained):
        problem = _pretrained_problem(name, pretrained)
        if problem is None:
            return None
        return (f"{key}.backbone: {problem}; set {key}.backbone={name}/PATH_TO_FILE (a local copy of the weights)"
                f"{'' if key.startswith('features') else ' or ' + key + '.checkpoint'}")
    if Path(pretrained).expanduser().is_file():
        return None
    return (f"{key}.backbone: {spec}: {pretrained!r} is neither a pretrained tag of {name} nor an existing file; "
            f"set {key}.backbone={name}/PATH_TO_FILE")


def _data_problems(key: str, data: Any) -> list[str]:
    """Missing annotation path / image folder / unknown loader of a `data` section or a test-set mapping."""
    from pacs.captioner.data import DATASETS
    from pacs.captioner.orchestration.data_sources import data_source

    get = data.get if isinstance(data, dict) else lambda name, default=None: getattr(data, name, default)
    problems = []
    name = str(get("name", "") or "")
    if name.lower() not in DATASETS:
        problems.append(f"{key}.name: unknown data set {name!r} (known: {', '.join(sorted(DATASETS))})")
    path = get("path", "")
    if not path:
        problems.append(f"{key}.path: not set; set it to the {name or 'data set'} annotation file or folder")
    elif not data_source(name).path_of(path).exists():
        problems.append(f"{key}.path: {path} not found; set {key}.path to the {name or 'data set'} annotations")
    root = get("image_root", None)
    if root and not data_source(name).makes_image_root and not Path(root).expanduser().is_dir():
        problems.append(f"{key}.image_root: folder {root} not found; set {key}.image_root to the image folder")
    return problems


def _run_dir_problem(run_dir: str) -> str | None:
    """Why `run_dir` cannot be created or written (a file in the way, an unwritable parent)."""
    path = Path(run_dir).expanduser()
    if path.exists():
        if not path.is_dir():
            return f"run_dir: {path} is a file, not a folder; set run_dir to a folder"
        return None if os.access(path, os.W_OK | os.X_OK) else f"run_dir: {path} is not writable; set run_dir"
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"run_dir: {parent} is a file, so {path} cannot be created; set run_dir to a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"run_dir: {path} cannot be created ({parent} is not writable); set run_dir"
    return None


def preflight_problems(config: PipelineConfig, made_earlier: Collection[Path] = ()) -> list[str]:
    """One line per thing the run's stages need and do not have (empty: ready to start; `made_earlier`: model
    files made earlier in the same run, by another seed's stages)."""

    from pacs.eval.java_metrics import missing_java_problems
    from pacs.metric.scoring.registry import METRICS
    from pacs.rewards.registry import parse_reward_spec
    from pacs.rewards.slug import reward_slug

    problems: list[str] = []
    made = {*made_checkpoints(config), *(Path(path) for path in made_earlier)}  # checkpoints of the run's stages
    problem = _run_dir_problem(config.run_dir)
    if problem:
        problems.append(problem)
    problems += _data_problems("data", config.data)
    for name, test_set in config.evaluation.test_sets.items():
        problems += _data_problems(f"evaluation.test_sets.{name}", test_set)
    features = config.captioner.kind != "transformers"  # a transformers captioner reads the images: no features
    if features and config.features.cache_dir and not Path(config.features.cache_dir).expanduser().is_dir():
        problems.append(f"features.cache_dir: folder {config.features.cache_dir} not found; set it to the folder "
                        "of precomputed feature caches, or to '' to extract features")
    problem = source_problem(config.features.source, "features.source", made) if features else None
    if problem:
        problems.append(problem)
    slots = dict(REWARD_MODEL_SLOTS)
    for spec in config.rewards:  # a contrastive reward without its family's model
        for name, _ in parse_reward_spec(spec):
            if name in METRICS and not source_given(getattr(config.reward_models, slots[METRICS[name].family])):
                slot = slots[METRICS[name].family]
                problems.append(f"rewards: {spec!r} needs a {METRICS[name].family} model: set reward_models.{slot} "
                                "(reward_models.pac is the PAC-S++ model, reward_models.pacs the PAC-S model)")
    for slot in needed_slots(config):
        source = getattr(config.reward_models, slot)
        if source_given(source):
            problem = source_problem(source, f"reward_models.{slot}", made)
            if problem:
                users = [f"reward {spec}" for spec in config.rewards if slot in reward_slots([spec])]
                if slot in evaluation_slots(config):
                    users.append(f"the evaluation's {COLUMNS[slot]} columns")
                problems.append(f"{problem} (used by {', '.join(users)})"
                                + ("" if slot in reward_slots(config.rewards) else
                                   f"; or leave its columns out with evaluation.contrastive_models="
                                   f"[{', '.join(s for s in evaluation_slots(config) if s != slot)}]"))
        elif config.evaluation.contrastive_models is not None and slot in config.evaluation.contrastive_models:
            problems.append(f"evaluation.contrastive_models names {slot}, but reward_models.{slot} names no model")
    kl_reference = config.scst.kl_reference
    if config.scst.kl_coef and kl_reference and config.rewards and not Path(kl_reference).expanduser().is_dir():
        problems.append(f"scst.kl_reference: captioner folder {kl_reference} not found; set it to a captioner "
                        "folder, or to '' for the XE model")
    problems += [f"evaluation.text_metrics: {line}" for line in missing_java_problems(config.evaluation.text_metrics)]
    slugs: dict[str, str] = {}
    for spec in config.rewards:
        other = slugs.setdefault(reward_slug(spec), spec)
        if other != spec:
            problems.append(f"rewards: {other!r} and {spec!r} share the folder scst-{reward_slug(spec)}; keep one")
    return problems


def check_before_start(config: PipelineConfig, where: str = "config", made_earlier: Collection[Path] = ()) -> None:
    """InputError listing every `preflight_problems` line (one error for all of them); nothing when ready."""
    problems = preflight_problems(config, made_earlier)
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        raise InputError(f"{where}: the run cannot start ({count}, nothing was written): "
                         + " ".join(f"({number}) {line};" for number, line in enumerate(problems, start=1))[:-1])
