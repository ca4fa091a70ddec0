"""User text on a terminal: control characters shown as escapes, so an id, caption or name cannot drive it.

Ids, captions, system names and paths come from the user's files; a NUL, an ESC sequence or a carriage return in
one of them would otherwise reach the terminal raw when an error line, a warning or a table echoes it (issue 31).
`escape_control` is the one helper every such echo goes through: the CLI's error line (`pacs.cli.main`), its log
handler (`TerminalFormatter`) and the tables the commands print.
"""
from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path

# C0 controls but tab and newline, DEL, C1 controls (CSI 0x9b ...), the line and paragraph separators and the
# bidirectional overrides and isolates (text that reads in another order than it is stored)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_OR_NEWLINE = re.compile("[\n" + _CONTROL.pattern[1:])


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_control(text: str, newlines: bool = True) -> str:
    """`text` with every control character written as ``\\x..`` (``\\u....`` above 0xff); tabs stay.

    `newlines=False` keeps ``\\n`` as it is (a multi-line log message); by default it is escaped too, so an error
    stays one line whatever the user's text holds.
    """
    return (_CONTROL_OR_NEWLINE if newlines else _CONTROL).sub(_escape, str(text))


class TerminalFormatter(logging.Formatter):
    """A logging formatter whose message has its control characters escaped (`escape_control`, newlines kept)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The record's line with the user text in its message escaped."""
        return escape_control(super().formatMessage(record), newlines=False)


class BarSafeHandler(logging.StreamHandler):
    """A stream handler that writes through tqdm when tqdm is loaded, so a log line never breaks a progress bar
    (the bar is cleared, the line written, the bar redrawn)."""

    def emit(self, record: logging.LogRecord) -> None:
        """Write `record` above this process's progress bars."""
        bars = sys.modules.get("tqdm")  # not loaded: no bar can be on the screen, and importing it costs start-up
        if bars is None:
            super().emit(record)
            return
        try:
            bars.tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging's contract: a failing handler reports, never raises
            self.handleError(record)


class TerminalFilter(logging.Filter):
    """What reaches the terminal: not the per-checkpoint chatter, and each repeated warning once.

    Records of `QUIET_LOGGERS` below WARNING (accelerate's five lines per saved checkpoint) and records logged
    with ``extra={"terminal": False}`` go to the run's log file only (`run_log`). A warning whose message
    template was already shown by this process is counted, not shown again; `repeats` holds the counts; `run_log`
    names them in one line each when its block ends.
    """

    QUIET_LOGGERS = ("accelerate",)

    def __init__(self) -> None:
        super().__init__()
        self.repeats: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """True when `record` is shown on the terminal."""
        if getattr(record, "terminal", True) is False:
            return False
        if record.levelno < logging.WARNING:
            return not any(record.name == name or record.name.startswith(name + ".") for name in self.QUIET_LOGGERS)
        key = (record.name, str(record.msg))
        if key in self.repeats:
            self.repeats[key] += 1
            return False
        self.repeats[key] = 0
        return True


TERMINAL_FILTER = TerminalFilter()
"""The one filter of the terminal handler (`setup_terminal_logging`), shared so `run_log` can read its counts."""


def setup_terminal_logging(level: int = logging.INFO, tag: str = "") -> None:
    """Log to stderr through `TerminalFormatter`, Python warnings (`warnings.warn`, pacs' and the libraries') too:
    a warning that echoes user text (a config path, a key) cannot drive the terminal either.

    Lines go above the progress bars (`BarSafeHandler`) and through `TERMINAL_FILTER`. `tag` (e.g. ``seed 1``,
    in a seed's own process) is written in brackets after the level.
    """
    handler = BarSafeHandler()
    prefix = f"[{escape_control(tag)}] " if tag else ""
    handler.setFormatter(TerminalFormatter(f"%(levelname)s {prefix}%(name)s: %(message)s"))
    handler.addFilter(TERMINAL_FILTER)
    logging.basicConfig(level=level, handlers=[handler])  # a no-op where the root has handlers (pytest, an app)
    logging.captureWarnings(True)


@contextlib.contextmanager
def run_log(path: Path) -> Iterator[Path]:
    """Every log record of the block, at INFO and above, appended to the file `path` (the run's log): what the
    terminal leaves out (`TerminalFilter`) is kept there. At the end, the warnings the terminal showed once but
    that repeated are named with their counts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)
    before = dict(TERMINAL_FILTER.repeats)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        handler.close()
        for (name, message), count in TERMINAL_FILTER.repeats.items():
            if count > before.get((name, message), 0):
                logging.getLogger(name).info("a warning was repeated %d more time(s), all in %s: %s",
                                             count - before.get((name, message), 0), path,
                                             escape_control(message)[:100])
