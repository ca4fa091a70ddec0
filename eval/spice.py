"""SPICE through pycocoevalcap's jar, without editing site-packages.

SPICE needs the Stanford CoreNLP 3.6.0 jars (`stanford-corenlp-3.6.0.jar` and
`stanford-corenlp-3.6.0-models.jar`, about 400 MB, from stanford-corenlp-full-2015-12-09.zip). pacs looks for
them in `--spice-corenlp DIR` / $PACS_SPICE_CORENLP, then in pycocoevalcap's `spice/lib/`. The jar is started
with an explicit class path (so the CoreNLP jars may live anywhere) and, on Java >= 16, without SPICE's LMDB
parse cache (its lmdbjni step crashes there) and with the module opens that its serialisation needs.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pycocoevalcap.spice.spice as coco_spice

from pacs.eval.java_runtime import java_major_version, require_java
from pacs.metric.common.errors import MissingResourceError, PacsError

log = logging.getLogger(__name__)

SPICE_DIR = Path(coco_spice.__file__).resolve().parent
SPICE_JAR = SPICE_DIR / coco_spice.SPICE_JAR
CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
CORENLP_ENV = "PACS_SPICE_CORENLP"
CORENLP_URL = "http://nlp.stanford.edu/software/stanford-corenlp-full-2015-12-09.zip"
JAVA16_OPENS = ("java.base/java.lang", "java.base/java.util", "java.base/java.io", "java.base/java.nio",
                "java.base/sun.nio.ch", "java.base/java.lang.reflect", "java.base/java.text",
                "java.base/java.math", "java.base/java.util.concurrent", "java.base/java.net")


class SpiceUnavailable(MissingResourceError):
    """SPICE cannot run here (missing CoreNLP jars); the message says what is missing and how to get it."""


def find_corenlp(corenlp_dir: str | os.PathLike | None = None) -> Path:
    """Folder holding both CoreNLP 3.6.0 jars, or SpiceUnavailable explaining how to provide them."""
    candidates = [Path(p) for p in (corenlp_dir, os.environ.get(CORENLP_ENV)) if p] + [SPICE_DIR / "lib"]
    for folder in candidates:
        if all((folder / jar).is_file() for jar in CORENLP_JARS):
            return folder
    looked = ", ".join(str(folder) for folder in candidates)
    raise SpiceUnavailable(
        f"SPICE is unavailable: the Stanford CoreNLP 3.6.0 jars {' and '.join(CORENLP_JARS)} were not found "
        f"(looked in {looked}). Download {CORENLP_URL}, extract those two jars into a folder and pass it with "
        f"--spice-corenlp DIR or the {CORENLP_ENV} environment variable")


def spice_command(java: str, java_version: int, corenlp_dir: Path, input_file: str, output_file: str,
                  cache_dir: str | None = None, memory: str = "8G") -> list[str]:
    """The SPICE command line; on Java >= 16 the LMDB cache is off and java.base packages are opened."""
    classpath = os.pathsep.join([str(SPICE_JAR), str(SPICE_DIR / "lib" / "*"),
                                 *(str(corenlp_dir / jar) for jar in CORENLP_JARS)])
    command = [java, f"-Xmx{memory}"]
    if java_version >= 16:
        for package in JAVA16_OPENS:
            command += ["--add-opens", f"{package}=ALL-UNNAMED"]
    command += ["-cp", classpath, "edu.anu.spice.SpiceScorer", input_file, "-out", output_file, "-subset",
                "-silent"]
    if cache_dir is not None and java_version < 16:
        command[-2:-2] = ["-cache", cache_dir]
    return command


@dataclass
class SpiceResult:
    """Corpus SPICE (mean F over the captions SPICE scored), per-caption F-scores (NaN where it failed) and the
    indices of the captions it failed on."""

    corpus: float
    per_caption: np.ndarray
    failed: tuple[int, ...] = ()

    @property
    def n_failed(self) -> int:
        """How many captions SPICE failed to score (excluded from `corpus`)."""
        return len(self.failed)


def _item_score(item: object) -> float:
    """The `All` F-score of one SPICE output item; NaN when it is missing, null or not a finite number."""
    try:
        value = item["scores"]["All"]["f"]  # type: ignore[index]
        value = float(value)
    except (KeyError, TypeError, ValueError):
        return float("nan")
    return value if np.isfinite(value) else float("nan")


def parse_spice_output(items: Sequence[dict], n: int) -> SpiceResult:
    """Per-caption SPICE F of captions `0..n-1` from SPICE's output JSON; failures are counted, never averaged away.

    A caption fails when SPICE wrote no item for it or its `All` F-score is null / NaN. The corpus value is the
    mean over the captions that succeeded, the failed indices are kept in the result and logged as a warning;
    when every caption failed it is a PacsError.
    """
    by_id: dict[int, float] = {}
    for item in items:
        try:
            by_id[int(item["image_id"])] = _item_score(item)
        except (KeyError, TypeError, ValueError):
            raise PacsError(f"SPICE output item without an integer image_id: {str(item)[:200]}") from None
    scores = np.array([by_id.get(i, float("nan")) for i in range(n)], dtype=np.float64)
    failed = tuple(int(i) for i in np.flatnonzero(~np.isfinite(scores)))
    if n and len(failed) == n:
        raise PacsError(f"SPICE failed on all {n} captions (no finite score in its output)")
    if failed:
        shown = ", ".join(str(i) for i in failed[:20]) + (", ..." if len(failed) > 20 else "")
        log.warning("SPICE failed on %d of %d caption(s) (items %s); the corpus SPICE is the mean over the "
                    "other %d", len(failed), n, shown, n - len(failed))
    corpus = float(np.mean(scores[np.isfinite(scores)])) if n else float("nan")
    return SpiceResult(corpus, scores, failed)


def compute_spice(candidates: Sequence[str], references: Sequence[Sequence[str]],
                  corenlp_dir: str | os.PathLike | None = None) -> SpiceResult:
    """SPICE F-score per caption (tokenized inputs); raises SpiceUnavailable when the jars are missing."""
    folder = find_corenlp(corenlp_dir)
    java = require_java(["spice"])
    version = java_major_version(java)
    with tempfile.TemporaryDirectory(prefix="pacs-spice-") as tmp:
        in_file, out_file = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        data = [{"image_id": i, "test": c, "refs": list(r)} for i, (c, r) in enumerate(zip(candidates, references))]
        Path(in_file).write_text(json.dumps(data, allow_nan=False), encoding="utf-8")
        command = spice_command(java, version, folder, in_file, out_file, os.path.join(tmp, "cache"))
        log.info("running SPICE on %d captions (Java %d)", len(data), version)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise PacsError(f"SPICE failed (exit {result.returncode}): {result.stderr.strip()[-800:]}")
        items = json.loads(Path(out_file).read_text(encoding="utf-8"))
    return parse_spice_output(items, len(data))
