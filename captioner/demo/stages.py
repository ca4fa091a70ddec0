"""Cached pipeline stages: each stage writes into `<run_dir>/<stage>/` and marks completion last.

A stage is skipped when its folder holds `stage.json` with the same key: a hash of the stage's own
configuration and the keys of the stages it depends on (so a changed upstream stage re-runs everything below).
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from metric.common.io import write_json_atomic

logger = logging.getLogger(__name__)

MARKER = "stage.json"


def stage_key(config: Any, upstream: list[str]) -> str:
    """The identity of a stage's result: sha256 over its config (JSON) and its upstream keys."""
    payload = json.dumps({"config": config, "upstream": upstream}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


class StageRunner:
    """Runs stages into a run directory, skipping those whose cached result has the same key."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.keys: dict[str, str] = {}
        self.ran: list[str] = []
        self.skipped: list[str] = []
        self.seconds: dict[str, float] = {}

    def folder(self, name: str) -> Path:
        """The output folder of stage `name`."""
        return self.run_dir / name

    def run(self, name: str, config: Any, upstream: list[str], body: Callable[[Path], dict[str, Any] | None]) -> Path:
        """Run `body(folder)` unless a finished result with the same key exists; return the folder."""
        key = stage_key(config, [self.keys[u] for u in upstream])
        self.keys[name] = key
        folder = self.folder(name)
        marker = folder / MARKER
        if marker.is_file():
            try:
                recorded = json.loads(marker.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                recorded = {}
            if recorded.get("key") == key:
                logger.info("stage %s: cached in %s, skipped", name, folder)
                self.skipped.append(name)
                self.seconds[name] = 0.0
                return folder
        if folder.exists():
            logger.info("stage %s: stale or unfinished output in %s, recomputing", name, folder)
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        started = time.time()
        summary = body(folder) or {}
        self.seconds[name] = time.time() - started
        write_json_atomic(marker, {"stage": name, "key": key, "seconds": round(self.seconds[name], 2),
                                   "summary": summary})
        self.ran.append(name)
        logger.info("stage %s: done in %.1fs", name, self.seconds[name])
        return folder
