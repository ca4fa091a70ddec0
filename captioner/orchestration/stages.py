"""Fingerprinted, process-aware stages shared by the recipe pipeline (`pacs.captioner.orchestration.pipeline`) and the demo.

Each stage records in `<run_dir>/stages/<name>.json` the three parts of its fingerprint: its settings (a nested
dict), its inputs (annotation files by path, size and mtime; model checkpoints by sha256; images are not
hashed) and the output ids of the stages it reads from. On a re-run:

- a finished stage with the same fingerprint is skipped when its outputs are what it made: its record lists every
  output file's size and digest (`pacs.captioner.orchestration.stage_outputs`), checked before the skip; a missing,
  truncated, rewritten or added file re-runs it (and everything below it) with a log line naming the file;
- an unreadable record (not JSON, not an object, not UTF-8) re-runs its stage;
- a finished stage with another fingerprint re-runs from scratch, with one log line naming what changed
  (`stage scst-pac-s++: re-running: scst.lr 5e-06 -> 1e-06`); every stage below it re-runs too, because a
  stage that ran gets a new output id, which is part of its dependants' fingerprints;
- an unfinished (interrupted) resumable stage (features, XE, SCST) resumes from its checkpoints when its
  fingerprint matches; when it does not, it is refused with an `InputError` naming the changes and the
  `--force STAGE` that discards it (unless the only change is an upstream stage re-run in this same run, which
  makes the old checkpoints worthless: it then re-runs from scratch, and so does one whose earlier start never
  took a step: no checkpoint in its `progress` folder). A non-resumable unfinished stage simply starts over;
- `force` names stages to re-run from scratch whatever their records say (`eval` names every `eval/...`).
- a file one stage makes and others read (a checkpoint; `makes`) makes that stage upstream of each reader, found
  in the reader's inputs.

`plan` (a runner made with `planning=True`: `pacs train --dry-run`) makes the same decision from the same
fingerprint without running, deleting or recording anything, and says why; a stage below one that would run
would run too ("upstream xe re-runs"), since its fingerprint needs an output that does not exist yet.

Under several processes (accelerate / torchrun) the main process decides for every stage and broadcasts its
decision (it alone reads the outputs it may then delete); only the main process deletes, creates and records
stage outputs. A `distributed` stage's body runs on every
process (it splits its own work); any other runs on the main process while the others wait.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pacs.captioner.orchestration.stage_outputs import manifest_problems, output_manifest
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import write_json_atomic
from pacs.metric.common.link_safety import check_no_links
from pacs.metric.common.provenance import sha256_file
from pacs.metric.common.suggest import did_you_mean

logger = logging.getLogger(__name__)

RECORDS = "stages"
HASHES = "hashes.json"


def file_input(path: str | os.PathLike) -> dict[str, Any]:
    """An annotation input: its resolved path, size and mtime (a folder: the files directly inside it)."""
    path = Path(path).expanduser().resolve()
    if path.is_dir():
        return {"path": str(path), "files": {child.name: _stat(child) for child in sorted(path.iterdir())
                                             if child.is_file()}}
    if not path.is_file():
        return {"path": str(path), "missing": True}
    return {"path": str(path), **_stat(path)}


def _stat(path: Path) -> dict[str, int]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


class HashCache:
    """sha256 of checkpoint files, remembered by (path, size, mtime) in `<records>/hashes.json`."""

    def __init__(self, path: Path, writer: bool) -> None:
        self.path = path
        self.writer = writer
        try:
            known = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):  # a cache: unreadable means empty
            known = {}
        self.known: dict[str, dict[str, Any]] = {key: value for key, value in known.items()
                                                  if isinstance(value, dict)} if isinstance(known, dict) else {}

    def file_sha256(self, path: Path) -> str:
        """The sha256 of one file, hashed only when its size or mtime changed since last time."""
        stat = _stat(path)
        entry = self.known.get(str(path))
        if entry and entry.get("size") == stat["size"] and entry.get("mtime_ns") == stat["mtime_ns"] \
                and isinstance(entry.get("sha256"), str):
            return entry["sha256"]
        self.known[str(path)] = {**stat, "sha256": sha256_file(path)}
        if self.writer:
            write_json_atomic(self.path, self.known)
        return self.known[str(path)]["sha256"]

    def checkpoint_input(self, path: str | os.PathLike) -> dict[str, Any]:
        """A model checkpoint input: sha256 of the file (a folder: of every file below it, by relative path)."""
        path = Path(path).expanduser().resolve()
        if path.is_file():
            return {"path": str(path), "sha256": self.file_sha256(path)}
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
            digest = hashlib.sha256()
            for file in files:
                digest.update(f"{file.relative_to(path)}\0{self.file_sha256(file)}\n".encode())
            return {"path": str(path), "sha256": digest.hexdigest()}
        return {"path": str(path), "missing": True}


@dataclass
class Fingerprint:
    """What determines a stage's output: settings, inputs and the output ids of its upstream stages."""

    settings: dict[str, Any]
    inputs: dict[str, Any] = field(default_factory=dict)
    upstream: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The JSON-ready parts (what a record stores)."""
        return json.loads(json.dumps({"settings": self.settings, "inputs": self.inputs, "upstream": self.upstream},
                                     sort_keys=True, default=str))

    def digest(self) -> str:
        """sha256 (16 hex digits) over the three parts."""
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _flatten(data: Any, prefix: str) -> dict[str, Any]:
    if isinstance(data, Mapping) and data:
        flat: dict[str, Any] = {}
        for key, value in data.items():
            flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: data}


def fingerprint_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Readable differences between two recorded fingerprints ('scst.lr 5e-06 -> 1e-06', 'upstream xe re-ran')."""
    changes = []
    for part in ("settings", "inputs"):
        before, after = _flatten(old.get(part, {}), ""), _flatten(new.get(part, {}), "")
        for key in sorted(set(before) | set(after)):
            if before.get(key, "<unset>") != after.get(key, "<unset>"):
                label = key if part == "settings" else f"input {key}"
                changes.append(f"{label} {_short(before.get(key, '<unset>'))} -> {_short(after.get(key, '<unset>'))}")
    before, after = old.get("upstream", {}), new.get("upstream", {})
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            changes.append(f"upstream {name} re-ran" if name in before and name in after else f"upstream {name} "
                           + ("added" if name in after else "removed"))
    return changes


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def matches(force: str, stage: str) -> bool:
    """Whether a `--force` name selects `stage` (its exact name, or a prefix ending at '/': `eval`, `features`)."""
    return stage == force or stage.startswith(force.rstrip("/") + "/")


def check_force(force: Iterable[str], stages: Sequence[str]) -> None:
    """InputError when a `force` name (`--force`) selects none of `stages` (the message lists them)."""
    for name in force:
        if not any(matches(name, stage) for stage in stages):
            hint = did_you_mean(name, stages)
            raise InputError(f"force= {name}: no such stage{'; ' + hint if hint else ''}; the stages of this run "
                             f"are: {', '.join(stages)}", parameter="force")


def upstream_reason(names: Sequence[str], listed: int = 3) -> str:
    """Why a planned stage runs: 'upstream xe re-runs' ('upstream a, b, c and 4 more re-run')."""
    shown = ", ".join(names[:listed]) + (f" and {len(names) - listed} more" if len(names) > listed else "")
    return f"upstream {shown} re-run{'s' if len(names) == 1 else ''}"


class _Single:
    """The process state of a plain single-process run."""

    is_main_process = True
    num_processes = 1

    def wait_for_everyone(self) -> None:
        """Nothing to wait for."""


class StageRunner:
    """Runs fingerprinted stages into a run directory (see the module docstring for the rules)."""

    def __init__(self, run_dir: str | os.PathLike, force: Iterable[str] = (), state: Any = None,
                 planning: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.force = list(force)
        self.state = state if state is not None else _Single()
        self.planning = planning  # `plan` only: nothing is created, deleted or recorded
        self.records = self.run_dir / RECORDS
        check_no_links(self.run_dir, self.records)  # records are never written through a planted link
        if self.state.is_main_process and not planning:
            self.records.mkdir(parents=True, exist_ok=True)
        self.hashes = HashCache(self.records / HASHES, writer=self.state.is_main_process and not planning)
        self.planned: list[tuple[str, str, str]] = []  # (stage, verdict, why) of every `plan`
        self.ids: dict[str, str] = {}
        self.ran: list[str] = []
        self.resumed: list[str] = []
        self.skipped: list[str] = []
        self.seconds: dict[str, float] = {}
        self._started: dict[str, tuple[float, str]] = {}
        self.made: dict[Path, str] = {}  # file -> the stage of this run that makes it (`makes`)

    def makes(self, stage: str, path: str | os.PathLike) -> None:
        """Record that stage `stage` makes file `path`: any later stage whose inputs name that file reads it from
        `stage`, which becomes its upstream (it re-runs, and plans to, whenever `stage` does)."""
        self.made[Path(path).expanduser().resolve()] = stage

    def with_makers(self, upstream: Sequence[str], inputs: Mapping[str, Any] | None) -> list[str]:
        """`upstream` plus the stages that make a file `inputs` names (`makes`), in the order they were recorded."""
        if not self.made:
            return list(upstream)
        named: set[Path] = set()

        def walk(value: Any) -> None:
            if isinstance(value, Mapping):
                path = value.get("path")
                if isinstance(path, str):
                    named.add(Path(path))
                for child in value.values():
                    walk(child)

        walk(inputs or {})
        makers = [stage for path, stage in self.made.items() if path in named]
        return [*upstream, *dict.fromkeys(stage for stage in makers if stage not in upstream)]

    def folder(self, name: str) -> Path:
        """The default output folder of stage `name` (`<run_dir>/<name>`)."""
        return self.run_dir / name

    def record_path(self, name: str) -> Path:
        """Where stage `name` records its fingerprint and status."""
        return self.records / f"{name}.json"

    def record(self, name: str) -> dict[str, Any] | None:
        """The record of stage `name`, or None when it has none (or an unreadable one: not JSON, not an object)."""
        try:
            record = json.loads(self.record_path(name).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):  # ValueError: bad JSON or bytes that are not UTF-8
            return None
        return record if isinstance(record, dict) else None

    def checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """A checkpoint input (sha256, cached by path, size and mtime)."""
        return self.hashes.checkpoint_input(path)

    def run(self, name: str, body: Callable[[], Mapping[str, Any] | None], settings: Mapping[str, Any],
            inputs: Mapping[str, Any] | None = None, upstream: Sequence[str] = (),
            outputs: Sequence[Path] | None = None, resumable: bool = False, distributed: bool = False,
            progress: Path | None = None) -> str:
        """Run (or skip, or resume) stage `name`; return what happened: 'skipped', 'ran' or 'resumed'.

        `body()` writes the stage's `outputs` (default: its folder, created empty before a fresh run) and may
        return a JSON-ready summary; `upstream` names stages this runner has already run or skipped. A
        `distributed` body runs on every process, any other on the main process while the others wait.
        `progress`: the checkpoint folder of a resumable stage; with no `step-*` checkpoint in it, an unfinished
        run of the stage never took a step, so other settings start it over instead of refusing it.
        """
        action = self.begin(name, settings, inputs, upstream, outputs, resumable, progress)
        if action == "skipped":
            return action
        summary: Mapping[str, Any] | None = None
        if distributed or self.state.is_main_process:
            summary = body()
        self.finish(name, summary)
        return action

    def begin(self, name: str, settings: Mapping[str, Any], inputs: Mapping[str, Any] | None = None,
              upstream: Sequence[str] = (), outputs: Sequence[Path] | None = None, resumable: bool = False,
              progress: Path | None = None) -> str:
        """Decide about stage `name` and prepare its outputs: 'skipped', 'ran' (outputs deleted) or 'resumed'.

        Unless skipped, the caller produces the outputs and then calls `finish(name)` (`run` does both).
        """
        upstream = self.with_makers(upstream, inputs)
        missing = [u for u in upstream if u not in self.ids]
        if missing:
            raise ValueError(f"stage {name}: upstream stages {missing} have not run")
        outputs = list(outputs) if outputs is not None else [self.folder(name)]
        fingerprint = Fingerprint(dict(settings), dict(inputs or {}), {u: self.ids[u] for u in upstream})
        digest, parts = fingerprint.digest(), fingerprint.as_dict()
        for path in outputs:  # on every process: a link planted in the run directory is one error everywhere
            check_no_links(self.run_dir, path)
        action = self._decide_everywhere(name, digest, parts, outputs, resumable, progress)
        if action == "skip":
            if self.state.is_main_process:
                logger.info("stage %s: unchanged, skipped", name)
            self.skipped.append(name)
            self.seconds[name] = 0.0
            self.ids[name] = self.record(name)["output_id"]
            return "skipped"
        if self.state.is_main_process:
            if action == "fresh":
                for path in outputs:
                    _remove(path)
            if outputs == [self.folder(name)]:
                self.folder(name).mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.record_path(name), {"stage": name, "status": "running", "fingerprint": digest,
                                                       **parts, "started": time.time()})
        self.state.wait_for_everyone()
        self._started[name] = (time.time(), "resumed" if action == "resume" else "ran", outputs)
        return self._started[name][1]

    def plan(self, name: str, settings: Mapping[str, Any],
             inputs: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None, upstream: Sequence[str] = (), outputs: Sequence[Path] | None = None, resumable: bool = False,
             progress: Path | None = None) -> str:
        """What `begin` would decide about stage `name`, without executing, deleting or recording anything.

        Returns the verdict, 'reuse', 'run', 'resume' or 'refused', and adds `(name, verdict, why)` to `planned`
        (`why`: the setting that changed, as the run logs it). A stage that would run or resume gets a new
        would-be output id, so the stages below it say 'run' because of it.
        """
        missing = [u for u in upstream if u not in self.ids]
        if missing:
            raise ValueError(f"stage {name}: upstream stages {missing} have not been planned")
        if self.made:  # the files it reads may be made by a stage of this run: their makers are upstream too
            inputs = inputs() if callable(inputs) else inputs
            upstream = self.with_makers(upstream, inputs)
        rerun = [u for u in upstream if u in self.ran + self.resumed]
        if rerun and not any(matches(force, name) for force in self.force):
            # its fingerprint needs what the upstream stage would make: it runs, whatever its record says
            return self.plan_unknown(name, upstream_reason(rerun))
        outputs = list(outputs) if outputs is not None else [self.folder(name)]
        inputs = inputs() if callable(inputs) else inputs  # a callable: hashed only when it decides
        fingerprint = Fingerprint(dict(settings), dict(inputs or {}), {u: self.ids[u] for u in upstream})
        try:
            action, why = self._decide(name, fingerprint.digest(), fingerprint.as_dict(), outputs, resumable,
                                       progress)
        except InputError as error:
            self.planned.append((name, "refused", str(error)))
            self.ids[name] = f"refused-{name}"
            self.ran.append(name)
            return "refused"
        if action == "skip":
            self.planned.append((name, "reuse", "finished with the same fingerprint, its outputs verified"))
            self.skipped.append(name)
            self.ids[name] = self.record(name)["output_id"]
            return "reuse"
        verdict = "resume" if action == "resume" else "run"
        if not why:
            why = "no record: it has not run here" if self.record(name) is None else "re-running"
        self.planned.append((name, verdict, why.removeprefix(f"stage {name}: ")))
        self.ids[name] = f"planned-{name}"
        (self.resumed if action == "resume" else self.ran).append(name)
        return verdict

    def plan_unknown(self, name: str, why: str) -> str:
        """Plan stage `name` as 'run' when its fingerprint cannot be known before something upstream has run."""
        self.planned.append((name, "run", why))
        self.ids[name] = f"planned-{name}"
        self.ran.append(name)
        return "run"

    def finish(self, name: str, summary: Mapping[str, Any] | None = None) -> None:
        """Record stage `name` (begun with `begin`) as finished, with a new output id, on every process."""
        started, action, outputs = self._started.pop(name)
        self.state.wait_for_everyone()
        self.seconds[name] = time.time() - started
        if self.state.is_main_process:
            record = self.record(name) or {}
            record.update(status="finished", output_id=f"{record.get('fingerprint')}-{uuid.uuid4().hex[:8]}",
                          seconds=round(self.seconds[name], 2),
                          summary=json.loads(json.dumps(summary or {}, default=str)),
                          outputs=output_manifest(outputs, self.run_dir))
            write_json_atomic(self.record_path(name), record)
            logger.info("stage %s: done in %.1fs", name, self.seconds[name])
        self.state.wait_for_everyone()
        self.ids[name] = self.record(name)["output_id"]
        (self.resumed if action == "resumed" else self.ran).append(name)

    def _info(self, message: str, *args: Any) -> None:
        if self.state.is_main_process:
            logger.info(message, *args)

    def _decide_everywhere(self, name: str, digest: str, parts: Mapping[str, Any], outputs: Sequence[Path],
                           resumable: bool, progress: Path | None = None) -> str:
        """The main process decides (it alone reads the outputs it may then delete); every rank gets its answer."""
        if self.state.num_processes <= 1:
            return self._decided(name, digest, parts, outputs, resumable, progress)
        from accelerate.utils import broadcast_object_list

        answer: list[Any] = [None]
        if self.state.is_main_process:
            try:
                answer = [("ok", self._decided(name, digest, parts, outputs, resumable, progress))]
            except InputError as error:
                answer = [("error", str(error))]
        broadcast_object_list(answer, from_process=0)
        kind, value = answer[0]
        if kind == "error":
            raise InputError(value)
        return value

    def _decided(self, name: str, digest: str, parts: Mapping[str, Any], outputs: Sequence[Path],
                 resumable: bool, progress: Path | None = None) -> str:
        """`_decide`'s action, its reason logged (main process)."""
        action, why = self._decide(name, digest, parts, outputs, resumable, progress)
        if why:
            self._info("%s", why)
        return action

    def _decide(self, name: str, digest: str, parts: Mapping[str, Any], outputs: Sequence[Path],
                resumable: bool, progress: Path | None = None) -> tuple[str, str]:
        """('skip', 'resume' (keep the outputs) or 'fresh' (delete them first), the log line saying why, or '');
        InputError when refused. Reads only: `begin` acts on it, `plan` reports it."""
        if any(matches(force, name) for force in self.force):
            return "fresh", f"stage {name}: re-running (--force)"
        record = self.record(name)
        if record is None and self.record_path(name).exists():
            return "fresh", f"stage {name}: its record {self.record_path(name)} is unreadable, re-running"
        if record is None or "fingerprint" not in record:
            present = [str(p) for p in outputs if p.exists() and not (p.is_dir() and not any(p.iterdir()))]
            reran = [u for u in parts.get("upstream", {}) if u in self.ran + self.resumed]
            if present and resumable and reran:
                return "fresh", f"stage {name}: output without a stage record below re-run stage {reran[0]}, starting over"
            if present and resumable:
                raise InputError(f"stage {name}: {present[0]} holds output but no stage record (written by an "
                                 f"older pacs or by hand), so its settings are unknown; pass --force {name} to "
                                 "replace it, or use another run directory")
            return "fresh", ""
        finished = record.get("status") == "finished" and "output_id" in record
        if record["fingerprint"] == digest:
            if finished:
                problems = self._output_problems(record, outputs)
                if not problems:
                    return "skip", ""
                return "fresh", f"stage {name}: re-running: its outputs are not as it made them ({'; '.join(problems)})"
            if resumable:
                return "resume", f"stage {name}: interrupted with the same settings, resuming"
            return "fresh", f"stage {name}: interrupted, starting over"
        changes = fingerprint_changes(record, parts)
        if finished or not resumable:
            return "fresh", f"stage {name}: re-running: {'; '.join(changes) or 'fingerprint changed'}"
        reran_upstream = {f"upstream {u} re-ran" for u in self.ran + self.resumed}
        if changes and all(change in reran_upstream for change in changes):
            return "fresh", f"stage {name}: interrupted, re-running from scratch: {'; '.join(changes)}"
        if progress is not None and not any(progress.glob("step-*")):
            return "fresh", (f"stage {name}: an earlier start under other settings never took a step, starting "
                             f"over: {'; '.join(changes) or 'fingerprint changed'}")
        raise InputError(f"stage {name} was interrupted under other settings and cannot resume with these "
                         f"({'; '.join(changes)}); restore them to resume, or pass --force {name} to discard "
                         "its checkpoints and re-run it")


    def _output_problems(self, record: Mapping[str, Any], outputs: Sequence[Path]) -> list[str]:
        """Why a finished stage's outputs cannot be reused (empty: verified as recorded)."""
        manifest = record.get("outputs")
        if not isinstance(manifest, Mapping):
            return ["no record of its outputs (finished by pacs 0.3 or older)"]
        return manifest_problems(manifest, outputs, self.run_dir)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
