"""Corpus METEOR of any multiset of captions from their sufficient statistics (the bootstrap's METEOR).

pycocoevalcap's METEOR 1.5 jar, started in its `-stdio` mode (as `pycocoevalcap.meteor.Meteor` does), answers
`SCORE ||| ref ||| ... ||| hypothesis` with a caption's sufficient statistics and `EVAL ||| stats ||| ...` with
each caption's score and then the corpus score aggregated from the summed statistics. The alignment runs once per
caption (`stats`); every resample then costs one `EVAL` line (`corpus`), exactly the jar's corpus METEOR.
`compute_score` is pycocoevalcap's `Meteor.compute_score` over the same lines (the same values).

The jar is a child process that can die (its 2 GB heap runs out aligning a caption of tens of thousands of
words): a closed pipe or an answer that never comes because the process ended is one `PacsError` naming the
caption being scored and the jar's own reason (never a hang, never a `ValueError` traceback), and captions longer
than `MAX_METEOR_WORDS` are refused before the jar starts (`check_meteor_lengths`).
"""
from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from pacs.eval.java_runtime import require_java
from pacs.metric.common.errors import InputError, PacsError

MAX_METEOR_WORDS = 5_000
"""The most words of one caption (candidate or reference) METEOR is asked to align. Measured with the jar's
`-Xmx2G` (Java 17, one machine): a 5,000-word candidate is scored (in about 20 s) and so is a 10,000-word one
against a short reference (35 s); a 20,000- or 200,000-word candidate, or a 10,000-word one against 10,000-word
references, exhausts the heap (`java.lang.OutOfMemoryError`) and kills the jar."""

_STOP_SECONDS = 10.0  # how long a dying jar is given to exit (and finish writing its reason) before it is killed


def caption_label(ids: Sequence[object] | None, row: int) -> str:
    """How messages name row `row` of a call: `caption 'ID'` when the caller gave ids, else `candidate ROW`."""
    return f"caption {str(ids[row])!r}" if ids is not None and row < len(ids) else f"candidate {row}"


def check_meteor_lengths(candidates: Sequence[str], references: Sequence[Sequence[str]],
                         ids: Sequence[object] | None = None, limit: int | None = None) -> None:
    """InputError naming the first caption (by id) or reference with more than `limit` words (default
    `MAX_METEOR_WORDS`, METEOR's bound)."""
    limit = MAX_METEOR_WORDS if limit is None else limit
    for row, (candidate, refs) in enumerate(zip(candidates, references)):
        words = len(candidate.split())
        if words > limit:
            raise InputError(f"{caption_label(ids, row)}: {words} words, more than the {limit} METEOR can align "
                             "(its jar runs out of memory on longer captions): shorten it or drop meteor from the "
                             "metrics")
        for index, ref in enumerate(refs):
            words = len(ref.split())
            if words > limit:
                raise InputError(f"reference {index} of {caption_label(ids, row)}: {words} words, more than the "
                                 f"{limit} METEOR can align (its jar runs out of memory on longer captions): "
                                 "shorten it or drop meteor from the metrics")


def _one_line(text: str) -> str:
    """A caption as one protocol line: the jar reads one request per line (a newline would shift every answer)."""
    return " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text


class MeteorStats:
    """A running METEOR 1.5 jar: statistics of (tokenized) captions and corpus METEOR of lists of statistics."""

    def __init__(self) -> None:
        import pycocoevalcap.meteor.meteor as coco_meteor

        folder = Path(coco_meteor.__file__).resolve().parent
        java = require_java(["meteor"])
        # the jar's stderr: never a pipe that fills up and blocks it; closed by `close`
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self._process = subprocess.Popen([java, "-jar", "-Xmx2G", coco_meteor.METEOR_JAR, "-", "-", "-stdio",
                                              "-l", "en", "-norm"], cwd=folder, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=self._errors)
        except BaseException:
            self._errors.close()
            raise

    def _ask(self, line: str, what: str) -> None:
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(f"{line}\n".encode())
            self._process.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):  # the jar is gone (ValueError: the pipe was closed)
            self._died(what)

    def _answer(self, what: str) -> str:
        assert self._process.stdout is not None
        try:
            text = self._process.stdout.readline().decode(errors="replace").strip()
        except (OSError, ValueError):
            text = ""
        if not text:  # end of file: the jar closed its output, i.e. it died
            self._died(what)
        return text

    def _number(self, what: str) -> float:
        text = self._answer(what)
        try:
            return float(text)
        except ValueError:
            raise PacsError(f"the METEOR jar answered {text[:80]!r} instead of a score while scoring {what}") from None

    def _died(self, what: str) -> None:
        """PacsError naming `what` was being scored and the jar's reason (the Java exception it printed)."""
        try:
            self._process.wait(timeout=_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        reason = self._reason()
        code = self._process.returncode
        raise PacsError(f"the METEOR jar died while scoring {what} ({reason or f'exit status {code}'})")

    def _reason(self) -> str:
        """The Java exception the jar printed (`java.lang.OutOfMemoryError: Java heap space`), if any."""
        try:
            self._errors.seek(0)
            lines = self._errors.read(1 << 16).decode(errors="replace").splitlines()
        except (OSError, ValueError):
            return ""
        for line in lines:
            if line.startswith("Exception in thread"):  # `Exception in thread "main" java.lang.OutOfMemoryError: ...`
                return line.split('" ', 1)[-1].strip()[:200]
        return next((line.strip() for line in lines if line.strip()), "")[:200]

    def stats(self, candidates: Sequence[str], references: Sequence[Sequence[str]],
              labels: Sequence[str] | None = None) -> list[str]:
        """The sufficient statistics of every caption against its references (one alignment each); `labels` name
        the captions in an error (default: `candidate ROW`)."""
        out = []
        for row, (candidate, refs) in enumerate(zip(candidates, references)):
            hypothesis = _one_line(candidate).replace("|||", "").replace("  ", " ")
            what = labels[row] if labels is not None else f"candidate {row}"
            self._ask(" ||| ".join(("SCORE", " ||| ".join(_one_line(ref) for ref in refs), hypothesis)), what)
            out.append(self._answer(what))
        return out

    def scores(self, stats: Sequence[str]) -> tuple[float, list[float]]:
        """The jar's corpus METEOR of captions with these statistics and each caption's own METEOR."""
        what = f"the corpus score of {len(stats)} captions"
        self._ask("EVAL ||| " + " ||| ".join(stats), what)
        per = [self._number(what) for _ in stats]  # the per-caption scores come first
        return self._number(what), per

    def corpus(self, stats: Sequence[str]) -> float:
        """The jar's corpus METEOR of captions with these statistics (repeats count)."""
        return self.scores(stats)[0]

    def compute_score(self, gts: Mapping[object, Sequence[str]], res: Mapping[object, Sequence[str]],
                      labels: Mapping[object, str] | None = None) -> tuple[float, list[float]]:
        """pycocoevalcap's `Meteor.compute_score(gts, res)` (corpus score, per-key scores in `gts` order) through
        this jar; `labels[key]` names a caption in an error."""
        keys = list(gts)
        if set(keys) != set(res) or any(len(res[key]) != 1 for key in keys):
            raise ValueError("gts and res must have the same keys and one hypothesis each")
        names = [labels[key] if labels is not None and key in labels else f"candidate {key}" for key in keys]
        stats = self.stats([res[key][0] for key in keys], [gts[key] for key in keys], names)
        return self.scores(stats)

    def close(self) -> None:
        """Stop the jar."""
        if self._process.poll() is None:
            if self._process.stdin is not None:
                try:
                    self._process.stdin.close()
                except OSError:  # the jar died with unread input in the pipe
                    pass
            self._process.kill()
        self._process.wait()
        for stream in (self._process.stdout, self._errors):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
