"""User-facing errors: one clear message naming the offending item; the CLI turns them into exit status 2."""
from __future__ import annotations


class PacsError(Exception):
    """An error caused by user input (files, options, data) that the CLI reports in one line."""


class InputError(PacsError, ValueError):
    """Malformed or inconsistent user input (a file, a line, an id, a key)."""


class MissingResourceError(PacsError, FileNotFoundError):
    """A file, model weight or external tool that pacs needs and cannot find or download."""
