"""The one-line error contract of the command line, checked on captured stderr."""
from __future__ import annotations

import pytest


def one_error_line(capsys: pytest.CaptureFixture, command: str, *, among_other_lines: bool = False) -> str:
    """The one `pacs COMMAND: error: ...` line on stderr, and no traceback.

    By default stderr holds nothing else; `among_other_lines` allows log lines beside it (a run that logged before
    it failed) as long as exactly one line is pacs' error.
    """
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    if among_other_lines:
        lines = [line for line in lines if line.startswith("pacs ")]
    assert len(lines) == 1 and lines[0].startswith(f"pacs {command}: error: "), err
    assert "Traceback" not in err, err
    return lines[0]
