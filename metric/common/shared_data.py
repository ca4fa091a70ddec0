"""Where the shared research data lives: one environment variable, PACS_SHARED."""
from __future__ import annotations

import os
from pathlib import Path

from pacs.metric.common.errors import MissingResourceError


def shared_dir(required: bool = True) -> Path | None:
    """Return the folder named by PACS_SHARED (holding data/ and fixtures/), or None when unset and optional."""
    value = os.environ.get("PACS_SHARED")
    if not value:
        if required:
            raise MissingResourceError("PACS_SHARED is not set: point it at the folder holding data/ and fixtures/")
        return None
    path = Path(value).expanduser().resolve()
    if not path.is_dir():
        raise MissingResourceError(f"PACS_SHARED={value} is not a folder")
    return path
