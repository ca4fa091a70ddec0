"""The run directory as the report reads it: its input files, each checked to stay inside the run directory.

Every file the report reads or hashes (results.json, logs/*.csv, logs/*.reference.json, correlation/*,
gallery.json and the gallery images) must resolve, symlinks included, inside the run directory
(`metric.common.paths_inside`); anything else is one InputError naming it, raised before the file is looked at,
so the report never reads, embeds or hashes a file outside the run (and never tells whether one exists). Bad
JSON / CSV is one InputError naming the file (`metric.common.json_input`). The layout is in `eval.report`.
"""
from __future__ import annotations

import csv
import logging
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from metric.common.errors import InputError
from metric.common.json_input import read_json_file
from metric.common.paths_inside import ConfinedRoot

logger = logging.getLogger(__name__)

CURVE_X_COLUMNS = ("step", "epoch", "iteration")
CURVE_SKIP_COLUMNS = ("epoch", "tokens", "nonfinite")  # bookkeeping, not curves


def read_input_json(path: Path) -> Any:
    """A JSON input of the report (`metric.common.json_input.read_json_file`: one InputError for any bad file)."""
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


def load_results(run_dir: Path) -> tuple[list[str], list[dict[str, Any]]] | None:
    """The results table (columns, rows) from results.json, or None when absent."""
    path = input_file(run_dir, "results.json")
    if path is None:
        return None
    data = read_input_json(path)
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "model" in r for r in rows):
        raise InputError(f"{path}: expected {{'rows': [{{'model': ..., metric: value}}]}}")
    columns = data.get("columns") or sorted({k for r in rows for k in r if k != "model"})
    return list(columns), rows


def load_curves(run_dir: Path) -> dict[str, dict[str, dict[str, tuple[list[float], list[float]]]]]:
    """Training curves: group -> column -> variant -> (x, y), from logs/*.csv."""
    curves: dict[str, dict[str, dict[str, tuple[list[float], list[float]]]]] = defaultdict(lambda: defaultdict(dict))
    for path in input_files(run_dir, "logs", "*.csv"):
        group, _, variant = path.stem.partition("-")
        rows = _read_csv(path)
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
    return curves


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
    fixed = [input_file(run_dir, name) for name in ("results.json", "correlation/correlation.json",
                                                     "correlation/scores.csv", "gallery.json")]
    files = [path for path in fixed if path is not None]
    files += input_files(run_dir, "logs", "*.csv") + input_files(run_dir, "logs", "*.reference.json")
    images = [gallery_image(run_dir, index, entry) for index, entry in enumerate(load_gallery(run_dir) or [])]
    return files + [path for path in images if path is not None and path.is_file()]


