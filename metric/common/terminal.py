"""User text on a terminal: control characters shown as escapes, so an id, caption or name cannot drive it.

Ids, captions, system names and paths come from the user's files; a NUL, an ESC sequence or a carriage return in
one of them would otherwise reach the terminal raw when an error line, a warning or a table echoes it (issue 31).
`escape_control` is the one helper every such echo goes through: the CLI's error line (`pacs.cli.main`), its log
handler (`TerminalFormatter`) and the tables the commands print.
"""
from __future__ import annotations

import logging
import re

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


def setup_terminal_logging(level: int = logging.INFO) -> None:
    """Log to stderr through `TerminalFormatter`, Python warnings (`warnings.warn`, pacs' and the libraries') too:
    a warning that echoes user text (a config path, a key) cannot drive the terminal either."""
    handler = logging.StreamHandler()
    handler.setFormatter(TerminalFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    logging.captureWarnings(True)
