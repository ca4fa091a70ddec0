"""The run directory as the report reads it: its input files, each checked to stay inside the run directory.

Every file the report reads or hashes (the results table of `RESULT_FILES`, logs/*.csv or the recipe's
<stage>/log.csv and <stage>/monitor.csv, logs/*.reference.json, correlation/*, gallery.json, train_log.json,
stages/**/*.json and the gallery images) must resolve, symlinks included, inside the run directory
(`pacs.metric.common.paths_inside`); anything else is one InputError naming it, raised before the file is looked at,
so the report never reads, embeds or hashes a file outside the run (and never tells whether one exists). Bad
JSON / CSV is one InputError naming the file (`pacs.metric.common.json_input`). The layout is in `pacs.eval.report`.
"""
from __future__ import annotations

import csv
import logging
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file
from pacs.metric.common.paths_inside import ConfinedRoot

logger = logging.getLogger(__name__)

CURVE_X_COLUMNS = ("step", "epoch", "iteration")
CURVE_SKIP_COLUMNS = ("epoch", "tokens", "nonfinite")  # bookkeeping, not curves
#: where each kind of run directory keeps its results table: the demo (and `pacs evaluate`) at the top, a recipe
#: over several seeds in seeds/, the recipe pipeline in eval/, recipes/compare_rewards.py in compare_rewards/ (rows
#: named by `reward`)
RESULT_FILES = ("results.json", "seeds/results.json", "eval/results.json", "compare_rewards/results.json")
#: a `pacs train-metric` output folder's record (evaluation history, training losses)
TRAIN_LOG = "train_log.json"


def read_input_json(path: Path) -> Any:
    """A JSON input of the report (`pacs.metric.common.json_input.read_json_file`: one InputError for any bad file)."""
    return read_json_file(path, path.name)


def _read_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV input of the report; InputError naming the file when it is not UTF-8 CSV."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text (byte {error.start}: {error.reason})") from None
    except csv.Error as error:
        raise InputError(f"{path}: malformed CSV ({error})") from None


def _root(run_dir: Path) -> ConfinedRoot:
    """The run directory as the root every input of the report must stay inside (symlinks resolved)."""
    return ConfinedRoot(run_dir, f"the run directory {run_dir}")


def _inside(run_dir: Path, path: Path) -> Path:
    """`path` (a file of the run directory the report reads) when it stays inside `run_dir` once symlinks are
    resolved; InputError otherwise (checked before anything is read, whether or not the target exists)."""
    return _root(run_dir).check(path, str(path))


def input_file(run_dir: Path, relative: str) -> Path | None:
    """`run_dir/relative` when it is a file inside the run directory; None when absent (InputError: leads out)."""
    path = _inside(run_dir, run_dir / relative)
    return path if path.is_file() else None


def input_files(run_dir: Path, folder: str, pattern: str) -> list[Path]:
    """The files `run_dir/folder/pattern`, sorted, each checked to stay inside the run directory."""
    base = run_dir / folder
    if not _inside(run_dir, base).is_dir():
        return []
    return [path for path in sorted(base.glob(pattern)) if _inside(run_dir, path).is_file()]


def finite_number(value: Any) -> float | None:
    """`value` as a finite float, or None (not a number, NaN or infinite)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def results_file(run_dir: Path) -> Path | None:
    """The run's results table: the first of `RESULT_FILES` that exists (None: no table)."""
    for name in RESULT_FILES:
        path = input_file(run_dir, name)
        if path is not None:
            return path
    return None


def load_results(run_dir: Path) -> tuple[list[str], list[dict[str, Any]]] | None:
    """The results table (columns, rows) from `results_file` (rows named by `model`, or by `reward` as
    compare_rewards names them), else the summary of a metric-training folder (`train_log.json`); None when absent."""
    path = results_file(run_dir)
    if path is None:
        return _train_log_results(run_dir)
    data = read_input_json(path)
    rows = data.get("rows") if isinstance(data, dict) else None
    if isinstance(rows, list) and rows and all(isinstance(r, dict) and "model" not in r and "reward" in r
                                               for r in rows):
        rows = [{"model": r["reward"], **{k: v for k, v in r.items() if k != "reward"}} for r in rows]
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "model" in r for r in rows):
        raise InputError(f"{path}: expected {{'rows': [{{'model': ..., metric: value}}]}}")
    columns = data.get("columns") or sorted({k for r in rows for k in r if k != "model"})
    _add_deltas(rows)
    return [c for c in columns if c not in ("model", "reward")], rows


def _add_deltas(rows: list[dict[str, Any]]) -> None:
    """Give rows with intervals (`ci`) but no `delta` (the recipe's eval/results.json) their change against the
    XE row of the same test set, the baseline their intervals are paired with."""
    baselines = {r.get("test_set"): r for r in rows if r.get("model") in ("xe", "– (XE)")}
    for row in rows:
        base = baselines.get(row.get("test_set"))
        if isinstance(row.get("ci"), dict) and "delta" not in row and base is not None:
            deltas = {c: (finite_number(row.get(c)), finite_number(base.get(c))) for c in row["ci"]}
            row["delta"] = {c: a - b for c, (a, b) in deltas.items() if a is not None and b is not None}


def _train_log(run_dir: Path) -> dict[str, Any] | None:
    path = input_file(run_dir, TRAIN_LOG)
    if path is None:
        return None
    data = read_input_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("history", []), list):
        raise InputError(f"{path}: expected {{'history': [{{'step': ..., column: value}}], ...}}")
    return data


def _train_log_results(run_dir: Path) -> tuple[list[str], list[dict[str, Any]]] | None:
    """A metric-training folder's one-row table: steps, the best step and its validation loss."""
    data = _train_log(run_dir)
    if data is None:
        return None
    row = {"model": run_dir.resolve().name, "steps": data.get("steps"), "best_step": data.get("best_step"),
           "best_val_total": data.get("best_val_total")}
    return ["steps", "best_step", "best_val_total"], [row]


def curve_files(run_dir: Path) -> list[tuple[Path, str, str]]:
    """(file, group, variant) of every training-curve CSV: logs/*.csv (`<group>-<variant>.csv`); without them, the
    recipe pipeline's stage logs `<stage>/log.csv` (`scst-cider/log.csv`: group scst, variant cider) and the SCST
    hacking monitors `<stage>/monitor.csv` (group hacking)."""
    found = []
    for path in input_files(run_dir, "logs", "*.csv"):
        group, _, variant = path.stem.partition("-")
        found.append((path, group, variant or group))
    if found:
        return found
    for name, fixed in (("log.csv", None), ("monitor.csv", "hacking")):
        # a recipe over several seeds keeps each seed's stages in seed-<s>/: one line per stage and seed
        for path in sorted(run_dir.glob(f"*/{name}")) + sorted(run_dir.glob(f"seed-*/*/{name}")):
            if not _inside(run_dir, path).is_file():
                continue
            group, _, variant = path.parent.name.partition("-")
            seed = f" {path.parent.parent.name}" if path.parent.parent != run_dir else ""
            found.append((path, fixed or group, (variant or group) + seed))
    return found


def stage_records(run_dir: Path) -> list[Path]:
    """The stage records of a run (`stages/**/*.json`: recipe pipeline and demo; `seed-<s>/stages/` of a recipe
    over several seeds), each inside the run directory."""
    found = []
    for base in [run_dir / "stages", *sorted(run_dir.glob("seed-*/stages"))]:
        if _inside(run_dir, base).is_dir():
            found += [path for path in sorted(base.rglob("*.json"))
                      if path.name != "hashes.json" and _inside(run_dir, path).is_file()]
    return found


def load_warnings(run_dir: Path) -> list[tuple[str, str]]:
    """(stage, warning) of every finished stage whose summary carries warnings (an SCST reward that never varied:
    `degenerate_warning` / `warnings`); a record that is not JSON is skipped (the stages re-run it)."""
    return [(name, line) for _, name, lines in _warning_records(run_dir) for line in lines]


def _warning_records(run_dir: Path) -> list[tuple[Path, str, list[str]]]:
    """(record, stage, warnings) of the stage records that carry warnings."""
    out = []
    for path in stage_records(run_dir):
        try:
            record = read_input_json(path)
        except InputError:
            continue
        summary = record.get("summary") if isinstance(record, dict) else None
        if not isinstance(summary, dict):
            continue
        lines = summary.get("warnings") or ([summary["degenerate_warning"]] if summary.get("degenerate_warning")
                                           else [])
        name = str(record.get("stage", path.stem))
        if path.parent.parent != run_dir and path.parent.parent.name.startswith("seed-"):
            name = f"{path.parent.parent.name}/{name}"  # seed-<s>/stages/<stage>.json
        lines = [str(line) for line in lines if line] if isinstance(lines, list) else [str(lines)]
        if lines:
            out.append((path, name, lines))
    return out


def has_results(run_dir: Path) -> bool:
    """Whether the run directory holds anything the report shows (a table, curves, correlations or a gallery)."""
    return bool(results_file(run_dir) or input_file(run_dir, TRAIN_LOG) or curve_files(run_dir)
                or input_file(run_dir, "correlation/correlation.json") or input_file(run_dir, "correlation/scores.csv")
                or input_file(run_dir, "gallery.json"))


def load_curves(run_dir: Path) -> dict[str, dict[str, dict[str, tuple[list[float], list[float]]]]]:
    """Training curves: group -> column -> variant -> (x, y), from logs/*.csv."""
    curves: dict[str, dict[str, dict[str, tuple[list[float], list[float]]]]] = defaultdict(lambda: defaultdict(dict))
    sources: list[tuple[Path | None, str, str, list[dict[str, Any]]]] = [
        (path, group, variant, []) for path, group, variant in curve_files(run_dir)]
    train_log = _train_log(run_dir)
    if train_log is not None:  # a metric-training folder: its evaluation history and training losses
        sources.append((None, "validation", "validation", [r for r in train_log.get("history", [])
                                                           if isinstance(r, dict)]))
        losses = train_log.get("train_losses") or []
        sources.append((None, "training", "training", [{"step": i + 1, "train_loss": v} for i, v in enumerate(losses)]))
    for path, group, variant, given in sources:
        rows = _read_csv(path) if path is not None else given
        if not rows:
            logger.warning("%s: no rows, skipped in the report", path)
            continue
        x_column = next((c for c in CURVE_X_COLUMNS if c in rows[0]), None)
        xs = [finite_number(r[x_column]) if x_column else float(i) for i, r in enumerate(rows)]
        for column in rows[0]:
            if column in CURVE_X_COLUMNS or column in CURVE_SKIP_COLUMNS or column is None:
                continue
            points = [(x, finite_number(r.get(column))) for x, r in zip(xs, rows)]
            points = [(x, y) for x, y in points if x is not None and y is not None]
            if points:
                curves[group][column][variant or group] = ([p[0] for p in points], [p[1] for p in points])
    for group, columns in curves.items():  # a column constant in every variant (e.g. a fixed lr) is no curve
        for column in [c for c, variants in columns.items()
                       if len({y for _, ys in variants.values() for y in ys}) <= 1 and len(variants)]:
            del columns[column]
    return {group: columns for group, columns in curves.items() if columns}  # a group of constants draws nothing


def load_references(run_dir: Path) -> dict[str, tuple[str, dict[str, float]]]:
    """Reference lines per curve group: group -> (label, {column: value}), from logs/<group>.reference.json."""
    out: dict[str, tuple[str, dict[str, float]]] = {}
    for path in input_files(run_dir, "logs", "*.reference.json"):
        data = read_input_json(path)
        if not isinstance(data, dict) or not isinstance(data.get("values"), dict):
            raise InputError(f"{path}: expected {{'label': ..., 'values': {{column: value}}}}")
        values = {str(k): v for k, v in ((k, finite_number(v)) for k, v in data["values"].items()) if v is not None}
        out[path.name[:-len(".reference.json")]] = (str(data.get("label", "reference")), values)
    return out


def load_correlation(run_dir: Path) -> tuple[dict[str, Any], dict[str, list[float]]] | None:
    """(summary per metric, scores per column incl. `judge`) from correlation/, or None when absent."""
    summary_path = input_file(run_dir, "correlation/correlation.json")
    summary = read_input_json(summary_path) if summary_path is not None else {}
    columns: dict[str, list[float]] = {}
    scores_path = input_file(run_dir, "correlation/scores.csv")
    if scores_path is not None:
        rows = _read_csv(scores_path)
        for column in (rows[0] if rows else {}):
            values = [finite_number(r[column]) for r in rows]
            if all(v is not None for v in values):
                columns[column] = values  # type: ignore[assignment]
    if not summary and not columns:
        return None
    return summary, columns


def load_gallery(run_dir: Path) -> list[dict[str, Any]] | None:
    """Gallery entries from gallery.json, or None when absent (InputError naming a malformed entry)."""
    path = input_file(run_dir, "gallery.json")
    if path is None:
        return None
    data = read_input_json(path)
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a list of gallery entries")
    for index, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise InputError(f"{path}: entry #{index} is not an object")
        image_id = entry.get("image_id", "?")
        references, captions = entry.get("references", []), entry.get("captions") or {}
        if not isinstance(references, list) or not all(isinstance(r, str) for r in references):
            raise InputError(f"{path}: entry #{index} (image id {image_id!r}): references must be a list of strings")
        if not isinstance(captions, dict) or not all(isinstance(info, dict) for info in captions.values()):
            raise InputError(f"{path}: entry #{index} (image id {image_id!r}): captions must be an object "
                             "{model: {caption, scores, verdict, highlights}}")
        if entry.get("image") is not None and not isinstance(entry["image"], str):
            raise InputError(f"{path}: entry #{index} (image id {image_id!r}): image must be a path (a string)")
    return data


def gallery_image(run_dir: str | os.PathLike, index: int, entry: dict[str, Any]) -> Path | None:
    """The image path of gallery entry #`index` (None when it names none); InputError naming the entry when the
    path does not resolve (symlinks included) inside the run directory, before anything is looked up there."""
    if not entry.get("image"):
        return None
    run_dir = Path(run_dir)
    what = (f"{run_dir / 'gallery.json'}: entry #{index} (image id {entry.get('image_id', '?')!r}): "
            f"its image {entry['image']!r}")
    return _root(run_dir).join(str(entry["image"]), what)

def report_inputs(run_dir: str | os.PathLike) -> list[Path]:
    """The files of `run_dir` that the report is built from (those that exist), in a fixed order."""
    run_dir = Path(run_dir)
    fixed = [results_file(run_dir), input_file(run_dir, TRAIN_LOG)]
    fixed += [input_file(run_dir, name) for name in ("correlation/correlation.json", "correlation/scores.csv",
                                                     "gallery.json")]
    files = [path for path in fixed if path is not None]
    files += [path for path, _, _ in curve_files(run_dir)] + input_files(run_dir, "logs", "*.reference.json")
    files += [path for path, _, _ in _warning_records(run_dir)]  # their warnings are on the page
    images = [gallery_image(run_dir, index, entry) for index, entry in enumerate(load_gallery(run_dir) or [])]
    return files + [path for path in images if path is not None and path.is_file()]


