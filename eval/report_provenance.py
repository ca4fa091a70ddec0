"""Where a run came from, for its report: pacs version and commit, config, command, date, wall time, machine, seeds.

`record_provenance` writes `provenance.json` into the run directory when a `pacs train` invocation ends (the
caller: `pacs.captioner.entry`): the command, the pacs version and git commit of the code that ran (commit None when
the code is not a git checkout; `dirty` when tracked files differ from it), the machine, the start and end of the
invocation and its wall time, and which stages ran or were reused. `load_provenance` reads it back with what the
run folder itself records: its `config.yaml`, the stage records (`stages/**/*.json`: the first start, the last
end and the seconds of every stage) and the seeds (results.json `seeds`, else the config's `seed`). A run without
`provenance.json` (a run folder written by pacs 0.6, or by `run_demo` called from Python) shows what its folder
records and says the rest was not recorded.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from pacs.eval import report_inputs as _inputs
from pacs.metric.common.config import yaml_value
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import write_json_atomic
from pacs.metric.common.provenance import pacs_version

PROVENANCE_FILE = "provenance.json"
CONFIG_FILE = "config.yaml"


def git_commit(folder: Path | None = None) -> dict[str, Any] | None:
    """{commit, dirty} of the git checkout holding pacs' code (`folder`), or None when it is not one (or git is
    missing)."""
    folder = folder or Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())} if commit else None


def machine() -> dict[str, Any]:
    """The machine running this process: OS, architecture, CPU cores, Python and, when torch sees one, the GPU."""
    found: dict[str, Any] = {"system": f"{platform.system()} {platform.release()}", "architecture": platform.machine(),
                             "cpu_cores": os.cpu_count(), "python": platform.python_version()}
    torch = sys.modules.get("torch")  # only when the run imported it: the report never loads torch itself
    if torch is not None and torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
    return found


def record_provenance(run_dir: str | os.PathLike, started: float, argv: Sequence[str] | None = None,
                      stages: dict[str, Any] | None = None) -> Path:
    """Write `run_dir/provenance.json` for the invocation that began at `started` (time.time()) and ends now."""
    argv = list(sys.argv if argv is None else argv)
    finished = time.time()
    record = {"command": shlex.join([Path(argv[0]).name, *argv[1:]]) if argv else None,
              "pacs_version": pacs_version(), "git": git_commit(), "machine": machine(),
              "started": _iso(started), "finished": _iso(finished), "wall_seconds": round(finished - started, 1),
              "stages": stages or {}}
    path = Path(run_dir) / PROVENANCE_FILE
    write_json_atomic(path, record)
    return path


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc).isoformat(timespec="seconds")


def _stage_times(run_dir: Path) -> dict[str, Any]:
    """First start, last end and summed seconds of the run's finished stage records."""
    starts, ends, total, count = [], [], 0.0, 0
    for path in _inputs.stage_records(run_dir):
        try:
            record = _inputs.read_input_json(path)
        except InputError:  # a record that is not JSON is skipped (the stages re-run it)
            continue
        if not isinstance(record, dict) or record.get("status") != "finished":
            continue
        started, seconds = _inputs.finite_number(record.get("started")), _inputs.finite_number(record.get("seconds"))
        if started is None or seconds is None:
            continue
        starts.append(started)
        ends.append(started + seconds)
        total += seconds
        count += 1
    if not count:
        return {}
    return {"first_start": _iso(min(starts)), "last_end": _iso(max(ends)), "stage_seconds": round(total, 1),
            "span_seconds": round(max(ends) - min(starts), 1), "stages": count}


def load_provenance(run_dir: Path, results: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the report shows as the run's provenance (see the module): `recorded` (provenance.json or {}),
    `config` (config.yaml's text or None), `stage_times`, `seeds`."""
    path = _inputs.input_file(run_dir, PROVENANCE_FILE)
    recorded = _inputs.read_input_json(path) if path is not None else {}
    config_path = _inputs.input_file(run_dir, CONFIG_FILE)
    config = config_path.read_text(encoding="utf-8", errors="replace") if config_path is not None else None
    seeds = (results or {}).get("seeds")
    if not seeds and config:
        seeds = _config_seeds(config)
    return {"recorded": recorded if isinstance(recorded, dict) else {}, "config": config,
            "stage_times": _stage_times(run_dir), "seeds": seeds or []}


def _config_seeds(text: str) -> list[Any]:
    """The seeds a config.yaml names (`seeds:`, else `seed:`; the demo's under `demo:`)."""
    try:
        data = yaml_value(text)  # bounded: a run folder's config.yaml is data, a 'billion laughs' one included
    except yaml.YAMLError:  # YAMLBoundError too
        return []
    section = data.get("demo", data) if isinstance(data, dict) else {}
    if not isinstance(section, dict):
        return []
    if isinstance(section.get("seeds"), list) and section["seeds"]:
        return section["seeds"]
    return [section["seed"]] if section.get("seed") is not None else []


def provenance_files(run_dir: Path) -> list[Path]:
    """The files of the run directory the provenance section is built from (for the report's digest)."""
    found = [_inputs.input_file(run_dir, name) for name in (PROVENANCE_FILE, CONFIG_FILE)]
    return [path for path in found if path is not None] + _inputs.stage_records(run_dir)


def provenance_summary(found: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) lines of the provenance section, 'not recorded' where the run folder does not say."""
    recorded, times = found["recorded"], found["stage_times"]
    missing = "not recorded (no provenance.json: run from Python or by pacs 0.6)"
    git = recorded.get("git") if isinstance(recorded.get("git"), dict) else None
    commit = (f"{git.get('commit')}{' (with uncommitted changes)' if git.get('dirty') else ''}" if git
              else "not a git checkout" if "git" in recorded else missing)
    machine_record = recorded.get("machine") if isinstance(recorded.get("machine"), dict) else None
    machine_text = (", ".join(f"{k.replace('_', ' ')} {v}" for k, v in machine_record.items()) if machine_record
                    else missing)
    date = recorded.get("finished") or times.get("last_end") or "not recorded"
    wall = recorded.get("wall_seconds")
    wall_text = f"{wall:.0f} s (this invocation)" if isinstance(wall, (int, float)) else missing
    if times:
        wall_text += (f"; the stages' records: {times['stage_seconds']:.0f} s over {times['stages']} stages, from "
                      f"{times['first_start']} to {times['last_end']}")
    stages = recorded.get("stages") if isinstance(recorded.get("stages"), dict) else {}
    lines = [("pacs version", str(recorded.get("pacs_version") or missing)), ("git commit", commit),
             ("command", str(recorded.get("command") or missing)), ("date", str(date)), ("wall time", wall_text),
             ("machine", machine_text), ("seeds", ", ".join(map(str, found["seeds"])) or "not recorded")]
    if stages:
        lines.append(("stages", "; ".join(f"{k}: {', '.join(map(str, v)) or 'none'}" for k, v in stages.items()
                                          if isinstance(v, list))))
    return lines


def provenance_json(found: dict[str, Any]) -> str:
    """The recorded provenance as indented JSON (for the page's details)."""
    return json.dumps(found["recorded"], indent=2, sort_keys=True)
