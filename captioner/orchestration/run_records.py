"""A demo run directory's stage records read back as data, never as pointers (issue 41 item 2).

A stage record (`<run_dir>/stages/<stage>.json`, written by `pacs.captioner.orchestration.stages`) is a file anyone
can edit. What the demo and `tools/pool_seeds.py` take from one is checked before it is used:

- its sections are of the types the runner writes (`settings`, `inputs`, `upstream`, `outputs`, `summary`:
  objects), else one line naming the record and the key;
- a path it names (`summary.model`, the model a guarded SCST stage chose) is joined with the stage's folder and
  must resolve inside the run directory (`pacs.metric.common.contained_paths.ConfinedRoot`, symlinks included: an
  absolute path or `../../..` is refused before anything there is looked at), and must be one of that stage's
  own outputs: its files are checked against the sizes and digests the stage recorded when it finished
  (`pacs.captioner.orchestration.stage_outputs.manifest_problems`), so it is the model that stage wrote;
- for pooling (`consistent_record`), the record must be the one of the folder it is read for: it names that
  stage, lists no output but the stage's own folder, its fingerprint is the digest of its own settings, inputs and
  upstream ids, its output id comes from that fingerprint, and every upstream id is the output id the run's record
  of that upstream stage holds now (a stage of a seed folder reads only shared stages and its own folder's).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from pacs.captioner.orchestration.stage_outputs import manifest_problems
from pacs.captioner.orchestration.stages import RECORDS, Fingerprint
from pacs.metric.common.contained_paths import ConfinedRoot
from pacs.metric.common.errors import InputError

SECTIONS = ("settings", "inputs", "upstream", "outputs", "summary")
"""The parts of a stage record that are objects (`{...}`) whenever present."""


def record_path(run_dir: Path, stage: str) -> Path:
    """Where stage `stage` of `run_dir` keeps its record (the stage name confined to the records folder)."""
    records = Path(run_dir) / RECORDS
    return ConfinedRoot(records).join(f"{stage}.json", f"stage record {stage!r}")


def read_record(run_dir: Path, stage: str) -> dict[str, Any]:
    """The record of `stage` in `run_dir`, its sections checked (`check_sections`); InputError naming the file when
    it is missing, unreadable (not UTF-8, not JSON, too deep) or not an object."""
    path = record_path(run_dir, stage)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: stage {stage} has no record (not trained in {run_dir}?)") from None
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text (byte {error.start}): not a stage record") from None
    except (OSError, ValueError, RecursionError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else type(error).__name__
        raise InputError(f"{path}: stage {stage} has no readable record ({reason})") from None
    if not isinstance(record, dict):
        raise InputError(f"{path}: expected a stage record (a JSON object), got {type(record).__name__}")
    check_sections(record, path)
    return record


def check_sections(record: Mapping[str, Any], path: Path) -> None:
    """InputError naming the record and the key when a section of it (`SECTIONS`) is not an object."""
    for key in SECTIONS:
        if key in record and not isinstance(record[key], Mapping):
            raise InputError(f"{path}: {key}: expected an object, got {type(record[key]).__name__}")


def section(record: Mapping[str, Any] | None, key: str, path: Path) -> dict[str, Any]:
    """`record[key]` as an object (empty when absent); InputError naming the record and the key otherwise."""
    value = (record or {}).get(key, {})
    if not isinstance(value, Mapping):
        raise InputError(f"{path}: {key}: expected an object, got {type(value).__name__}")
    return dict(value)


def stage_files(record: Mapping[str, Any], stage: str, path: Path) -> dict[str, Any]:
    """The files stage `stage` recorded as its output folder's (`outputs[<stage>]`: name -> size and digest)."""
    outputs = section(record, "outputs", path)
    files = outputs.get(PurePosixPath(stage).as_posix())
    if not isinstance(files, Mapping) or not files:
        raise InputError(f"{path}: outputs: no record of the files of stage {stage}'s folder")
    return dict(files)


def model_files(record: Mapping[str, Any], stage: str, subfolder: str, path: Path) -> dict[str, Any]:
    """The recorded files (name inside the model folder -> size and digest) of the model folder `subfolder` of
    stage `stage`; InputError naming the record when the stage recorded none there."""
    prefix = f"{PurePosixPath(subfolder).as_posix()}/"
    files = {name[len(prefix):]: entry for name, entry in stage_files(record, stage, path).items()
             if isinstance(name, str) and name.startswith(prefix)}
    if not files:
        raise InputError(f"{path}: outputs: stage {stage} recorded no file in {subfolder}/ (not a model it wrote)")
    return files


def verified_model(run_dir: Path, stage: str, subfolder: str | Path, record: Mapping[str, Any], path: Path,
                   key: str = "model") -> Path:
    """`<run_dir>/<stage>/<subfolder>`, when it resolves inside the run directory, inside the stage's folder, and
    holds exactly the files the stage recorded there (sizes and digests: the model that stage wrote); else one
    InputError naming the record `path` and `key` (what named the folder)."""
    run_dir = Path(run_dir)
    text = str(subfolder)
    if not text or "\0" in text:
        raise InputError(f"{path}: {key}: expected the name of a model folder of stage {stage}, got {text!r}")
    root = ConfinedRoot(run_dir)
    what = f"{path}: {key} ({text!r})"
    resolved = root.resolve(root.check(run_dir / stage / text, what))
    stage_folder = root.resolve(run_dir / stage)
    if resolved is None or stage_folder is None or not resolved.is_relative_to(stage_folder) \
            or resolved == stage_folder:
        raise InputError(f"{what} must name a folder inside {run_dir / stage} (a model that stage wrote)")
    inside = resolved.relative_to(stage_folder).as_posix()
    files = model_files(record, stage, inside, path)
    folder = run_dir / stage / inside
    problems = manifest_problems({f"{PurePosixPath(stage).as_posix()}/{inside}": files}, [folder], run_dir)
    if problems:
        raise InputError(f"{folder}: not the model stage {stage} wrote ({'; '.join(problems)}; named by {path} "
                         f"{key})")
    return folder


def recorded_model(run_dir: Path, stage: str, record: Mapping[str, Any] | None, path: Path) -> Path:
    """The model folder a guarded SCST stage's record names (`summary.model`), verified by `verified_model`."""
    if record is None:
        raise InputError(f"{path}: stage {stage} has no readable record")
    summary = section(record, "summary", path)
    model = summary.get("model")
    if not isinstance(model, str):
        raise InputError(f"{path}: summary.model: expected the name of a model folder of stage {stage}, got "
                         f"{type(model).__name__}")
    return verified_model(run_dir, stage, model, record, path, "summary.model")


def model_identity(record: Mapping[str, Any], stage: str, subfolder: str, path: Path) -> tuple:
    """What makes a model folder the same bytes as another: its weights files' recorded sizes and digests (every
    file of the folder when it holds no weights file)."""
    files = model_files(record, stage, subfolder, path)
    weights = {name: entry for name, entry in files.items()
               if PurePosixPath(name).suffix in (".safetensors", ".bin", ".pt", ".pth")} or files
    return tuple(sorted((PurePosixPath(name).name, str(entry.get("size")), str(entry.get("digest")))
                        for name, entry in weights.items() if isinstance(entry, Mapping)))


def consistent_record(run_dir: Path, stage: str) -> dict[str, Any]:
    """The finished record of `stage` in `run_dir`, checked to be that folder's own (see the module docstring);
    InputError naming the record and what does not match."""
    path = record_path(run_dir, stage)
    record = read_record(run_dir, stage)
    if record.get("status") != "finished":
        raise InputError(f"{path}: stage {stage} did not finish")
    if record.get("stage") != stage:
        raise InputError(f"{path}: stage: the record names stage {record.get('stage')!r}, not {stage!r} (a record "
                         "copied from another stage's folder)")
    own = PurePosixPath(stage).as_posix()
    for key in section(record, "outputs", path):
        if key != own:
            raise InputError(f"{path}: outputs: lists {key!r}, not this stage's folder {own!r}")
    settings, inputs = section(record, "settings", path), section(record, "inputs", path)
    upstream = section(record, "upstream", path)
    if record.get("fingerprint") != Fingerprint(settings, inputs, upstream).digest():
        raise InputError(f"{path}: fingerprint: not the digest of the record's own settings, inputs and upstream "
                         "(the record was edited)")
    output_id = record.get("output_id")
    if not isinstance(output_id, str) or not output_id.startswith(f"{record['fingerprint']}-"):
        raise InputError(f"{path}: output_id: {output_id!r} was not made from the record's fingerprint")
    folder = PurePosixPath(stage).parent.as_posix()
    for name, value in upstream.items():
        home = PurePosixPath(str(name)).parent.as_posix()
        if home not in (".", folder):  # a seed's stage reads the shared stages and its own seed's, no other
            raise InputError(f"{path}: upstream.{name}: a stage of another folder than {folder}/ (a record copied "
                             "from another seed)")
        other = read_record(run_dir, str(name))
        if other.get("output_id") != value:
            raise InputError(f"{path}: upstream.{name}: {value!r} is not the output of stage {name} of {run_dir} "
                             f"({other.get('output_id')!r})")
    return record
