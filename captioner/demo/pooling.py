"""The seeds of several finished demo runs evaluated as one run (`tools/pool_seeds.py`; recipe runs pool through
`pacs.captioner.orchestration.recipe_pooling`, with the same folder, lock and refusal rules).

Seeds trained in different run directories — more seeds added later in a copy of a run, or seeds trained on
several machines from one run's copied metric stages — pool into one comparison over all of them: the `evaluate`
stage's own code (`pipeline.evaluate_seed_models`) on every seed's finished models, its results.json / .csv / .md
and findings as a run of those seeds would write them.

Pooling is refused unless it is the same experiment: every run's settings equal apart from where and how it ran
(`RUN_SETTINGS`), the metric stages the rewards and the table's columns come from bit-identical (the `clip` and
`pacs` checkpoints, and the grid `features` of every image), each seed in one run only, every seed stage
finished with the files its record lists, every record the one of its folder (`run_records.consistent_record`:
its stage name, output folder, fingerprint, output id and upstream ids; a model a record names is inside the
stage and one it recorded), and no model of one seed the same bytes as a model of another (a copied seed folder
is one training). Nothing is written until all of that holds and the evaluation is done; `--out` is checked
(and its temporary folder made) before any work, and a failure while writing (a full disk) leaves nothing.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pacs.captioner.demo.config import DemoConfig, migrate_scst_monitors, migrate_xe_layout
from pacs.captioner.orchestration import recipe_pooling, results_files, run_records
from pacs.captioner.orchestration.stage_outputs import manifest_problems
from pacs.metric.common.config import from_dict, load_yaml, to_dict
from pacs.metric.common.errors import InputError, PacsError
from pacs.metric.common.io import write_json_atomic
from pacs.metric.common.run_lock import hold_run_directory
from pacs.rewards.slug import reward_slug

RUN_SETTINGS = ("run_dir", "name", "runs_dir", "seeds", "threads", "parallel_seeds", "force", "device")
"""The settings that may differ between pooled runs: where and how a run ran, not what it trained."""
METRIC_CHECKPOINTS = ("clip", "pacs")
"""The stages whose `checkpoint.safetensors` every pooled run must share bit for bit."""


@dataclass(frozen=True)
class SeedSource:
    """One run directory and the seeds taken from it (empty: every seed of its config)."""

    run_dir: Path
    seeds: tuple[int, ...] = ()


def parse_source(text: str) -> SeedSource:
    """`RUN` or `RUN:S,S,...` (seeds as integers) as a SeedSource; InputError naming the text otherwise."""
    folder, _, seeds = text.rpartition(":")
    if not folder or not seeds or not set(seeds) <= set("0123456789,- "):  # no seed list: the whole text is the run
        folder, seeds = text, ""
    try:
        chosen = tuple(int(seed) for seed in seeds.split(",")) if seeds else ()
    except ValueError:
        raise InputError(f"{text!r}: expected RUN or RUN:S,S,... with integer seeds") from None
    return SeedSource(Path(folder), chosen)


def run_config(run_dir: Path) -> DemoConfig:
    """The settings a finished run recorded (`<run_dir>/config.yaml`)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise InputError(f"{run_dir}: not a demo run directory (no config.yaml)")
    recorded = load_yaml(path)
    if "scst" in recorded:  # a run of 0.6 recorded the monitors' old names
        recorded = {**recorded, "scst": migrate_scst_monitors(recorded["scst"], str(path))}
    recorded = migrate_xe_layout(recorded, str(path))  # and the captioner's sizes in `xe`
    return from_dict(DemoConfig, recorded, str(path))


def _trained_settings(config: DemoConfig) -> dict[str, Any]:
    return {key: value for key, value in to_dict(config).items() if key not in RUN_SETTINGS}


def _first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """The dotted key of the first setting that differs between two settings trees (None: equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = _first_difference(a.get(key), b.get(key), f"{where}.{key}" if where else key)
            if found:
                return found
        return None
    return None if a == b else where


def check_same_experiment(configs: dict[Path, DemoConfig]) -> None:
    """InputError naming the run and the setting where a run's training settings differ from the first run's."""
    (first_dir, first), *others = configs.items()
    for run_dir, config in others:
        key = _first_difference(_trained_settings(first), _trained_settings(config))
        if key is not None:
            raise InputError(f"{run_dir}: setting {key} differs from {first_dir} (only {', '.join(RUN_SETTINGS)} "
                             "may differ between pooled runs)")


def check_shared_metric_stages(runs: list[Path], transformers: bool) -> None:
    """InputError naming the file when a run's metric checkpoints or grid features are not the first run's."""
    import torch

    from pacs.captioner.demo import captioning

    first = runs[0]
    for stage in METRIC_CHECKPOINTS:
        expected = _weights(_existing(first / stage / "checkpoint.safetensors"))
        for run_dir in runs[1:]:
            path = _existing(run_dir / stage / "checkpoint.safetensors")
            weights = _weights(path)
            if weights.keys() != expected.keys() or not all(torch.equal(weights[k], expected[k]) for k in expected):
                raise InputError(f"{path}: not the weights of {first / stage} (pooled seeds must be scored by, and "
                                 "trained on, the same metric stages: copy them into a run before training its seeds)")
    if transformers:  # a transformers captioner reads the images, not grid features
        return
    reference = captioning.open_features(first / "features")
    ids = sorted(reference.index)
    expected_features = reference.get(ids)
    for run_dir in runs[1:]:
        other = captioning.open_features(run_dir / "features")
        if sorted(other.index) != ids or not torch.equal(other.get(ids), expected_features):
            raise InputError(f"{run_dir / 'features'}: not the grid features of {first / 'features'}")


def _weights(path: Path) -> dict[str, Any]:
    """The tensors of a safetensors checkpoint (its metadata, e.g. the pacs version that wrote it, aside)."""
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as error:  # noqa: BLE001 - any unreadable checkpoint is the same one-line refusal
        raise InputError(f"{path}: not a readable safetensors checkpoint ({error})") from None


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise InputError(f"{path}: missing (not a finished run?)")
    return path


def _finished_record(run_dir: Path, stage: str) -> dict[str, Any]:
    """A seed stage's record, verified: the record of that folder (`run_records.consistent_record`), finished,
    and its outputs as it recorded them."""
    record = run_records.consistent_record(run_dir, stage)
    problems = manifest_problems(record.get("outputs") or {}, [run_dir / stage], run_dir)
    if problems:
        raise InputError(f"{run_dir / stage}: changed since its stage finished ({'; '.join(problems)})")
    return record


def seed_models(config: DemoConfig, run_dir: Path, seed: int) -> tuple[dict[str, Path], dict[str, Any]]:
    """One seed's finished models in `run_dir` (the table's row names -> model folders) and its guard choices,
    every stage verified (`_finished_record`); `seed_model_identities` tells what each model's bytes are."""
    return _seed_models(config, run_dir, seed)[:2]


def _seed_models(config: DemoConfig, run_dir: Path, seed: int) -> tuple[dict[str, Path], dict[str, Any],
                                                                          dict[str, tuple]]:
    """`seed_models` and, per row, the model's identity (`run_records.model_identity`: its weights' digests)."""
    from pacs.captioner.demo import captioning, pipeline
    from pacs.captioner.orchestration import findings

    prefix = pipeline.seed_prefix(config, seed)
    stages = {"xe": (f"{prefix}xe", "best")}
    stages.update({findings.scst_model_name(spec): (f"{prefix}scst-{reward_slug(spec)}", "final")
                   for spec in config.scst.rewards})
    stages.update({captioning.normalised_model_name(spec): (f"{prefix}scst-{captioning.normalised_label(spec)}",
                                                           "final") for spec in config.scst.normalised_rewards})
    models, identities = {}, {}
    for model, (stage, subfolder) in stages.items():
        record = _checked_seed(_finished_record(run_dir, stage), run_dir, stage, seed)
        path = run_records.record_path(run_dir, stage)
        models[model] = run_records.verified_model(run_dir, stage, subfolder, record, path, "outputs")
        identities[model] = run_records.model_identity(record, stage, subfolder, path)
    choices: dict[str, Any] = {}
    records: dict[str, dict[str, Any]] = {}

    def finished(guard: dict[str, Any], stage: str) -> dict[str, Any]:
        records[stage] = _checked_seed(_finished_record(run_dir, stage), run_dir, stage, seed)
        return run_records.section(records[stage], "summary", run_records.record_path(run_dir, stage))

    for reward in config.guarded.rewards:  # the run's own choice, made again from its verified records
        choices[reward], _ = pipeline.seed_guard_choice(config, seed, reward, finished, lambda stage: run_dir / stage)
        for model, stage in pipeline.guarded_row_stages(config, seed, reward, choices[reward]).items():
            path = run_records.record_path(run_dir, stage)
            folder = run_records.recorded_model(run_dir, stage, records[stage], path)
            models[model] = folder
            identities[model] = run_records.model_identity(records[stage], stage,
                                                           folder.relative_to(run_dir / stage).as_posix(), path)
    return models, choices, identities


def _checked_seed(record: dict[str, Any], run_dir: Path, stage: str, seed: int) -> dict[str, Any]:
    """`record` when its settings say it trained `seed`; InputError naming the record otherwise."""
    recorded = run_records.section(record, "settings", run_records.record_path(run_dir, stage)).get("seed")
    if recorded != seed or isinstance(recorded, bool):
        raise InputError(f"{run_records.record_path(run_dir, stage)}: trained with seed {recorded!r}, not {seed}")
    return record


def check_distinct_models(identities: dict[int, dict[str, tuple]], folders: dict[int, dict[str, Path]]) -> None:
    """InputError naming both folders when a model of one seed is the same bytes as a model of another seed (a
    copied seed folder is one training, not two)."""
    seen: dict[tuple, tuple[int, str]] = {}
    for seed, rows in identities.items():
        for row, identity in rows.items():
            other = seen.get(identity)
            if other is not None and other[0] != seed:
                raise InputError(f"{folders[seed][row]}: seed {seed}'s {row} model is the same bytes as seed "
                                 f"{other[0]}'s {other[1]} model ({folders[other[0]][other[1]]}): a copied seed, not "
                                 "another training; pool seeds that were trained")
            seen.setdefault(identity, (seed, row))


def pool_seed_runs(sources: list[SeedSource], out: Path) -> dict[str, Any]:
    """Evaluate the seeds of `sources` as one run into the new folder `out` (results.json / .csv / .md, pooled.json
    naming each seed's run, and the evaluate stage's files), holding every source run's lock; its results.

    `out` is checked (and its temporary folder made next to it) before any work; nothing is left there when
    pooling stops, whatever stops it (a refusal, a full disk)."""
    if not sources:
        raise InputError("no runs to pool")
    if out.exists() or out.is_symlink():
        raise InputError(f"{out}: exists; pooling writes a new folder (remove it or choose another)")
    if len({source.run_dir.resolve() for source in sources}) != len(sources):
        raise InputError("a run is named twice; take several seeds from it as RUN:S,S,...")
    recipe = recipe_pooling.is_recipe_run(sources[0].run_dir)  # a recipe's seeds pool by its own records
    configs = {} if recipe else {source.run_dir: run_config(source.run_dir) for source in sources}
    created, work = _work_folder(out)
    try:
        with ExitStack() as locks:  # no run trains in a source while its seeds are read
            folders = [folder for source in sources for folder in recipe_pooling.seed_runs(source.run_dir,
                                                                                           source.seeds).values()] \
                if recipe else list(configs)
            for run_dir in folders:
                locks.enter_context(hold_run_directory(run_dir))
            if recipe:
                results = recipe_pooling.pool_recipe_runs([(s.run_dir, s.seeds) for s in sources], work)
                work.rename(out)
                return results
            return _pool_locked(sources, configs, out, work)
    except OSError as error:  # a full disk, an unwritable folder: one line naming `out` and the file
        if isinstance(error, PacsError):  # MissingResourceError is one too, with its own line
            raise
        raise InputError(f"{out}: not written, pooling stopped: {_os_error_line(error)}") from None
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
        for folder in reversed(created):  # the parents made for `out`, when pooling left nothing in them
            if not out.exists():
                with contextlib.suppress(OSError):
                    folder.rmdir()


def _os_error_line(error: OSError, where: Path | None = None) -> str:
    """One line of an operating-system failure: the file (else `where`), what failed and its fix if any."""
    from pacs.metric.common.os_errors import describe_os_error

    if error.filename is None and where is not None and error.errno is not None:
        error = OSError(error.errno, error.strerror or str(error), str(where))
    line = describe_os_error(error)
    if line:
        return line
    where = " and ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
    what = error.strerror or str(error) or type(error).__name__
    return f"{where}: {what}" if where else what


def _work_folder(out: Path) -> tuple[list[Path], Path]:
    """The folders made for `out`'s parent (to remove if pooling fails) and the temporary folder the pooled files
    are written to (renamed to `out` when done); InputError naming `out` when it cannot be written there."""
    created: list[Path] = []
    parent = out.parent
    missing = []
    while not parent.exists() and not parent.is_symlink() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{out}: cannot be written: {parent} is not a folder")
    try:
        for folder in reversed(missing):
            folder.mkdir()
            created.append(folder)
        return created, Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as error:
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise InputError(f"{out}: cannot be written: {_os_error_line(error, out.parent)}") from None


def _pool_locked(sources: list[SeedSource], configs: dict[Path, DemoConfig], out: Path,
                 work: Path) -> dict[str, Any]:
    from pacs.captioner.demo import captioning, pipeline
    from pacs.captioner.demo.data import DemoData

    check_same_experiment(configs)
    owner: dict[int, Path] = {}
    for source in sources:
        available = configs[source.run_dir].seed_list()
        for seed in source.seeds or tuple(available):
            if seed not in available:
                raise InputError(f"{source.run_dir}: has no seed {seed} (its seeds: {available})")
            if seed in owner:
                raise InputError(f"seed {seed} is taken from both {owner[seed]} and {source.run_dir}: each seed once")
            owner[seed] = source.run_dir
    first = sources[0].run_dir
    config = configs[first]
    check_shared_metric_stages(list(configs), config.captioner.transformers)
    seeds = sorted(owner)
    models, guarded, identities = {}, {}, {}
    for seed in seeds:
        models[seed], guarded[seed], identities[seed] = _seed_models(configs[owner[seed]], owner[seed], seed)
    check_distinct_models(identities, models)
    pooled = from_dict(DemoConfig, {**to_dict(config), "seeds": seeds}, "pooled config")
    data = DemoData.build(pooled.world, first / "data" / "images")
    pipeline.evaluate_seed_models(pooled, data, models, guarded, first, work)
    results = json.loads((work / "results.json").read_text(encoding="utf-8"))
    results_files.write_results(work, results, ["model", *captioning.DEMO_COLUMNS], pipeline.DEMO_DIGITS)
    write_json_atomic(work / "pooled.json", {"seeds": {str(seed): str(owner[seed]) for seed in seeds},
                                             "metric_stages": str(first)})
    work.rename(out)
    return results
