"""Corpus METEOR of any multiset of captions from their sufficient statistics (the bootstrap's METEOR).

pycocoevalcap's METEOR 1.5 jar, started in its `-stdio` mode (as `pycocoevalcap.meteor.Meteor` does), answers
`SCORE ||| ref ||| ... ||| hypothesis` with a caption's sufficient statistics and `EVAL ||| stats ||| ...` with
each caption's score and then the corpus score aggregated from the summed statistics. The alignment runs once per
caption (`stats`); every resample then costs one `EVAL` line (`corpus`), exactly the jar's corpus METEOR.
"""
from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from pacs.eval.java import require_java
from pacs.metric.common.errors import PacsError


class MeteorStats:
    """A running METEOR 1.5 jar: statistics of (tokenized) captions and corpus METEOR of lists of statistics."""

    def __init__(self) -> None:
        import pycocoevalcap.meteor.meteor as coco_meteor

        folder = Path(coco_meteor.__file__).resolve().parent
        java = require_java(["meteor"])
        self._process = subprocess.Popen([java, "-jar", "-Xmx2G", coco_meteor.METEOR_JAR, "-", "-", "-stdio",
                                          "-l", "en", "-norm"], cwd=folder, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def _ask(self, line: str) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(f"{line}\n".encode())
        self._process.stdin.flush()

    def _answer(self) -> str:
        assert self._process.stdout is not None
        text = self._process.stdout.readline().decode().strip()
        if not text:
            raise PacsError("the METEOR jar stopped answering")
        return text

    def stats(self, candidates: Sequence[str], references: Sequence[Sequence[str]]) -> list[str]:
        """The sufficient statistics of every caption against its references (one alignment each)."""
        out = []
        for candidate, refs in zip(candidates, references):
            hypothesis = candidate.replace("|||", "").replace("  ", " ")
            self._ask(" ||| ".join(("SCORE", " ||| ".join(refs), hypothesis)))
            out.append(self._answer())
        return out

    def corpus(self, stats: Sequence[str]) -> float:
        """The jar's corpus METEOR of captions with these statistics (repeats count)."""
        self._ask("EVAL ||| " + " ||| ".join(stats))
        for _ in stats:  # the per-caption scores come first
            self._answer()
        return float(self._answer())

    def close(self) -> None:
        """Stop the jar."""
        if self._process.poll() is None:
            if self._process.stdin is not None:
                self._process.stdin.close()
            self._process.kill()
        self._process.wait()
        for stream in (self._process.stdout,):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

