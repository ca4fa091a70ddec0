"""The run directory as the report reads it: its input files, each checked to stay inside the run directory.

Every file the report reads or hashes (the results table of `RESULT_FILES`, logs/*.csv or the recipe's
<stage>/log.csv and <stage>/monitor.csv, logs/*.reference.json, correlation/*, gallery.json, train_log.json,
stages/**/*.json and the gallery images) must resolve, symlinks included, inside the run directory
(`pacs.metric.common.contained_paths`); anything else is one InputError naming it, raised before the file is looked at,
so the report never reads, embeds or hashes a file outside the run (and never tells whether one exists). Bad
JSON / CSV is one InputError naming the file (`pacs.metric.common.json_input`), and so is a file of the wrong
JSON shape (a `columns` that is no list of names, a `delta` that is no object, highlights that are no
`[start, end, kind]` spans, ...: `check_results`, `load_correlation`, `load_gallery`). What the report reads is
bounded: each file at most `MAX_INPUT_BYTES`, all of them (gallery images included) `MAX_TOTAL_BYTES`, a CSV
`MAX_CSV_COLUMNS` columns and `MAX_CSV_ROWS` rows, the page's curves `MAX_PLOT_PANELS` panels from at most
`MAX_CURVE_FILES` files, a results table `MAX_TABLE_ROWS` rows and `MAX_TABLE_COLUMNS` columns, a gallery
`MAX_GALLERY_ENTRIES` entries; beyond a bound the report is refused in one line naming the file and the bound (a
page of 900 plot panels took minutes). The layout is in
`pacs.eval.report`.
"""
from __future__ import annotations

import csv
import logging
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from pacs.metric.common.contained_paths import ConfinedRoot
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file

logger = logging.getLogger(__name__)

CURVE_X_COLUMNS = ("step", "epoch", "iteration")
CURVE_SKIP_COLUMNS = ("epoch", "tokens", "nonfinite")  # bookkeeping, not curves
#: where each kind of run directory keeps its results table: the demo (and `pacs evaluate`) at the top, a recipe
#: over several seeds in seeds/, the recipe pipeline in eval/, recipes/compare_rewards.py in compare_rewards/ (rows
#: named by `reward`)
RESULT_FILES = ("results.json", "seeds/results.json", "eval/results.json", "compare_rewards/results.json")
MAX_INPUT_BYTES = 64 * 2 ** 20  # one input file of the report
MAX_TOTAL_BYTES = 512 * 2 ** 20  # every input file and gallery image together
MAX_CSV_COLUMNS = 64  # a CSV's columns: each is a plot panel (pacs writes at most about 20)
MAX_CSV_ROWS = 1_000_000
MAX_PLOT_PANELS = 128  # training-curve panels of the whole page (about 0.3 s each to draw)
MAX_TABLE_COLUMNS = 200  # columns of a results table
MAX_TABLE_ROWS = 10_000  # rows of a results table
MAX_GALLERY_ENTRIES = 10_000
MAX_CURVE_FILES = 500
#: a `pacs train-metric` output folder's record (evaluation history, training losses)
TRAIN_LOG = "train_log.json"


def read_input_json(path: Path) -> Any:
    """A JSON input of the report (`pacs.metric.common.json_input.read_json_file`: one InputError for any bad file)."""
    return read_json_file(bounded(path), path.name)


def bounded(path: Path) -> Path:
    """`path` when it is at most `MAX_INPUT_BYTES`; InputError naming the file and the bound otherwise."""
    try:
        size = path.stat().st_size
    except OSError:
        return path  # the reader's own one-line error names it
    if size > MAX_INPUT_BYTES:
        raise InputError(f"{path}: {size} bytes, above the {MAX_INPUT_BYTES} bytes the report reads from one file")
    return path


def _read_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV input of the report; InputError naming the file when it is not UTF-8 CSV or has more than
    `MAX_CSV_COLUMNS` columns or `MAX_CSV_ROWS` rows."""
    try:
        with open(bounded(path), newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is not None and len(reader.fieldnames) > MAX_CSV_COLUMNS:
                raise InputError(f"{path}: {len(reader.fieldnames)} columns, above the {MAX_CSV_COLUMNS} the report "
                                 "reads (each column is a plot)")
            rows = []
            for row in reader:
                if len(rows) >= MAX_CSV_ROWS:
                    raise InputError(f"{path}: more than {MAX_CSV_ROWS} rows, above what the report reads")
                rows.append(row)
            return rows
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
    return bounded(path) if path.is_file() else None


def input_files(run_dir: Path, folder: str, pattern: str) -> list[Path]:
    """The files `run_dir/folder/pattern`, sorted, each checked to stay inside the run directory."""
    base = run_dir / folder
    if not _inside(run_dir, base).is_dir():
        return []
    return [bounded(path) for path in sorted(base.glob(pattern)) if _inside(run_dir, path).is_file()]


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
    check_results(path, data, rows)
    columns = data.get("columns") or sorted({k for r in rows for k in r if k != "model"})
    if len(columns) > MAX_TABLE_COLUMNS:
        raise InputError(f"{path}: {len(columns)} columns, above the {MAX_TABLE_COLUMNS} the report shows")
    _add_deltas(rows)
    return [c for c in columns if c not in ("model", "reward")], rows


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _is_number(value: Any) -> bool:
    """A JSON number or null (a blank cell)."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _check_names(path: Path, key: str, value: Any) -> None:
    """`value` (results.json `key`) is absent or a list of column names (strings)."""
    if value is not None and not (isinstance(value, list) and all(isinstance(c, str) for c in value)):
        found = _kind(value) if not isinstance(value, list) else "a list holding " + ", ".join(
            sorted({_kind(c) for c in value if not isinstance(c, str)}))
        raise InputError(f"{path}: {key} must be a list of column names (strings), not {found}")


def _check_row_fields(path: Path, where: str, row: dict[str, Any], intervals: tuple[str, ...]) -> None:
    """The per-column fields of a row: `delta` an object; each of `intervals` an object of [low, high] pairs;
    `delta_per_seed` an object of lists of numbers."""
    for key in ("delta", "delta_per_seed", *intervals):
        value = row.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise InputError(f"{path}: {where}: {key} must be an object {{column: ...}}, not {_kind(value)}")
        for column, item in value.items():
            if key in intervals:
                good = isinstance(item, list) and len(item) == 2 and all(_is_number(v) for v in item)
                expected = "[low, high] (numbers)"
            elif key == "delta_per_seed":
                good = isinstance(item, list) and all(_is_number(v) for v in item)
                expected = "a list of numbers (one per seed)"
            else:
                good, expected = True, ""
            if not good:
                raise InputError(f"{path}: {where}: {key}[{column!r}] must be {expected}, not {item!r:.60}")


def check_results(path: Path, data: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """InputError naming `path` and the key when results.json has a key of the wrong JSON type (`columns`, a row's
    `delta` / `ci` / `delta_per_seed`, `reward_gains`, `findings`, `seeds`, `system_table`) or too many rows."""
    if len(rows) > MAX_TABLE_ROWS:
        raise InputError(f"{path}: {len(rows)} rows, above the {MAX_TABLE_ROWS} the report shows")
    _check_names(path, "columns", data.get("columns"))
    for index, row in enumerate(rows):
        _check_row_fields(path, f"rows[{index}] (model {str(row.get('model'))!r:.60})", row, ("ci",))
    for key in ("reward_gains", "findings", "seeds"):
        if data.get(key) is not None and not isinstance(data[key], list):
            raise InputError(f"{path}: {key} must be a list, not {_kind(data[key])}")
    for index, gain in enumerate(data.get("reward_gains") or []):
        if isinstance(gain, dict) and gain.get("ci") is not None and not (
                isinstance(gain["ci"], list) and len(gain["ci"]) == 2 and all(_is_number(v) for v in gain["ci"])):
            raise InputError(f"{path}: reward_gains[{index}].ci must be [low, high] (numbers), not "
                             f"{gain['ci']!r:.60}")
    table = data.get("system_table")
    if table is None:
        return
    if not isinstance(table, dict):
        raise InputError(f"{path}: system_table must be an object, not {_kind(table)}")
    _check_names(path, "system_table.metrics", table.get("metrics"))
    if table.get("columns") is not None and not (isinstance(table["columns"], dict) and all(
            isinstance(c, dict) for c in table["columns"].values())):
        raise InputError(f"{path}: system_table.columns must be an object {{metric: {{...}}}}")
    table_rows = table.get("rows")
    if isinstance(table_rows, list):
        if len(table_rows) > MAX_TABLE_ROWS:
            raise InputError(f"{path}: system_table has {len(table_rows)} rows, above the {MAX_TABLE_ROWS} the "
                             "report shows")
        for index, row in enumerate(table_rows):
            if isinstance(row, dict):
                _check_row_fields(path, f"system_table.rows[{index}]", row, ("ci", "delta_ci"))


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
    if data.get("train_losses") is not None and not isinstance(data["train_losses"], list):
        raise InputError(f"{path}: train_losses must be a list of numbers, not {_kind(data['train_losses'])}")
    if max(len(data.get("history") or []), len(data.get("train_losses") or [])) > MAX_CSV_ROWS:
        raise InputError(f"{path}: more than {MAX_CSV_ROWS} history entries or losses, above what the report reads")
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
    recipe pipeline's stage logs `<stage>/log.csv` (`scst-cider/log.csv`: group scst, variant cider), the SCST
    hacking monitors `<stage>/monitor.csv` (group hacking), the judge's curves `<stage>/judge_monitor.csv` (group
    scst_val, as the demo's logs/scst_val-<reward>.csv) and the validation histories of the world's own CLIP and
    PAC-S++ `clip/history.csv`, `pacs/history.csv` (groups clip and pacs, as the demo's logs/clip.csv)."""
    found = []
    for path in input_files(run_dir, "logs", "*.csv"):
        group, _, variant = path.stem.partition("-")
        found.append((path, group, variant or group))
    if not found:
        for name, fixed in (("log.csv", None), ("monitor.csv", "hacking"), ("judge_monitor.csv", "scst_val"),
                            ("history.csv", None)):
            # a recipe over several seeds keeps each seed's stages in seed-<s>/: one line per stage and seed
            for path in sorted(run_dir.glob(f"*/{name}")) + sorted(run_dir.glob(f"seed-*/*/{name}")):
                if not _inside(run_dir, path).is_file():
                    continue
                group, _, variant = path.parent.name.partition("-")
                seed = f" {path.parent.parent.name}" if path.parent.parent != run_dir else ""
                found.append((bounded(path), fixed or group, (variant or group) + seed))
    if len(found) > MAX_CURVE_FILES:
        raise InputError(f"{run_dir}: {len(found)} training-curve CSV files, above the {MAX_CURVE_FILES} the report "
                         "draws")
    return found


def stage_records(run_dir: Path) -> list[Path]:
    """The stage records of a run (`stages/**/*.json`: recipe pipeline and demo; `seed-<s>/stages/` of a recipe
    over several seeds), each inside the run directory."""
    found = []
    for base in [run_dir / "stages", *sorted(run_dir.glob("seed-*/stages"))]:
        if _inside(run_dir, base).is_dir():
            found += [bounded(path) for path in sorted(base.rglob("*.json"))
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
    panels = sum(len(columns) for columns in curves.values())
    if panels > MAX_PLOT_PANELS:
        raise InputError(f"{run_dir}: its training curves make {panels} plot panels, above the {MAX_PLOT_PANELS} the "
                         "report draws (logs/*.csv, <stage>/log.csv)")
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
    if not isinstance(summary, dict):
        raise InputError(f"{summary_path}: expected an object {{metric: {{'tau_b': ..., 'tau_c': ..., 'n': ...}}}}, "
                         f"not {_kind(summary)}")
    for metric, entry in summary.items():
        if isinstance(entry, dict) and not _is_number(entry.get("tau_b")):
            raise InputError(f"{summary_path}: {metric}.tau_b must be a number, not {entry['tau_b']!r:.60}")
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
    if len(data) > MAX_GALLERY_ENTRIES:
        raise InputError(f"{path}: {len(data)} entries, above the {MAX_GALLERY_ENTRIES} the report shows")
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
        for model, info in captions.items():
            _check_caption(path, f"entry #{index} (image id {image_id!r}): captions[{model!r}]", info)
    return data


def _check_caption(path: Path, where: str, info: dict[str, Any]) -> None:
    """A gallery caption's `scores` is an object and its `highlights` a list of [start, end, kind] spans."""
    scores, spans = info.get("scores"), info.get("highlights")
    if scores is not None and not isinstance(scores, dict):
        raise InputError(f"{path}: {where}.scores must be an object {{metric: value}}, not {_kind(scores)}")
    if spans is None:
        return
    if not isinstance(spans, list):
        raise InputError(f"{path}: {where}.highlights must be a list of [start, end, kind] spans, not "
                         f"{_kind(spans)}")
    for number, span in enumerate(spans):
        if not (isinstance(span, list) and len(span) == 3 and all(
                isinstance(v, int) and not isinstance(v, bool) for v in span[:2]) and isinstance(span[2], str)):
            raise InputError(f"{path}: {where}.highlights[{number}] must be [start, end, kind] (two integers and a "
                             f"string), not {span!r:.60}")


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
    files += [bounded(path) for path in images if path is not None and path.is_file()]
    total = sum(path.stat().st_size for path in files)
    if total > MAX_TOTAL_BYTES:
        raise InputError(f"{run_dir}: the report's input files and gallery images are {total} bytes, above the "
                         f"{MAX_TOTAL_BYTES} bytes the report reads")
    return files


