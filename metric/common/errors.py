"""User-facing errors: one clear message naming the offending item; the CLI turns them into exit status 2.

A library error names the Python parameter it is about (``checkpoint=``) and records it in `parameters`;
the command line rewrites ``checkpoint=`` into its flag (``--checkpoint``) when it prints the message
(`pacs.metric.commands.flags.cli_message`), so Python users read the names they passed and CLI users the flags.
"""
from __future__ import annotations

from collections.abc import Sequence


class PacsError(Exception):
    """An error caused by user input (files, options, data) that the CLI reports in one line."""

    def __init__(self, *args: object, parameter: str | Sequence[str] | None = None) -> None:
        super().__init__(*args)
        #: the Python parameter(s) the message names as ``name=`` (empty when it names none)
        self.parameters: tuple[str, ...] = ((parameter,) if isinstance(parameter, str)
                                            else tuple(parameter or ()))

    @property
    def parameter(self) -> str | None:
        """The first parameter the message names (None when it names none)."""
        return self.parameters[0] if self.parameters else None


class InputError(PacsError, ValueError):
    """Malformed or inconsistent user input (a file, a line, an id, a key)."""


class MissingResourceError(PacsError, FileNotFoundError):
    """A file, model weight or external tool that pacs needs and cannot find or download."""


class NonFiniteError(InputError):
    """A number that must be finite (a score, an embedding, a model weight, a value written to JSON) is NaN/inf."""


class TrainingDivergedError(PacsError):
    """Training produced a non-finite loss or non-finite weights; the stage stopped (lower the learning rate)."""
