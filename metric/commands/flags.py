"""Library parameter names -> command-line flags: the one table the CLI uses to print library errors, and the
one table of the bounds of its numeric flags (`FLAG_BOUNDS`, the same types the configs give those settings)."""
from __future__ import annotations

import argparse
import re
from typing import Annotated, Any

from annotated_types import Ge, Le

from pacs.metric.common.config import (
    MAX_BEAM,
    MAX_LENGTH,
    MAX_MICRO_BATCH,
    MAX_RESAMPLES,
    Seed,
    describe_type,
    fits_type,
)
from pacs.metric.common.errors import InputError, PacsError

#: parameters whose flag is not ``--`` + the name with ``_`` -> ``-`` (every other one follows that rule)
FLAGS: dict[str, str] = {
    "fmt": "--format",
}


def flag(parameter: str) -> str:
    """The command-line flag of a library parameter (`FLAGS`, else ``--name-with-dashes``)."""
    return FLAGS.get(parameter, "--" + parameter.replace("_", "-"))


def cli_message(error: PacsError) -> str:
    """The error's message with every ``parameter=`` it names written as the CLI flag (``--parameter``)."""
    message = str(error)
    for parameter in getattr(error, "parameters", ()):
        named = rf"(?<![\w.-]){re.escape(parameter)}="
        message = re.sub(named + r"(?=[^\s,;)])", flag(parameter) + " ", message)  # name=VALUE -> --flag VALUE
        message = re.sub(named, flag(parameter), message)
    return message


#: parsed flag (its `dest`) -> (the annotated type its value must fit, what the bound is for), for every command
#: that has the flag: the bounds of the config keys of the same setting (`evaluate.beam_size`, `evaluate.bootstrap`,
#: `seed`, ...), so a flag cannot ask for what a config is refused (`pacs caption --beam-size 100000`)
FLAG_BOUNDS: dict[str, tuple[Any, str]] = {
    "beam_size": (Annotated[int, Ge(1), Le(MAX_BEAM)], "beam sizes, as in the configs"),
    "min_length": (Annotated[int, Ge(0), Le(MAX_LENGTH)], "caption lengths in tokens, as in the configs"),
    "max_new_tokens": (Annotated[int, Ge(1), Le(MAX_LENGTH)], "caption lengths in tokens, as in the configs"),
    "batch_size": (Annotated[int, Ge(1), Le(MAX_MICRO_BATCH)], "what one process encodes at once, as in the configs"),
    "bootstrap": (Annotated[int, Ge(0), Le(MAX_RESAMPLES)], "bootstrap resamples, as in the configs; 0: none"),
    "seed": (Seed, "random seeds, as in the configs"),
}


def check_flag_bounds(args: argparse.Namespace) -> None:
    """InputError `--flag VALUE: expected ...` for the first parsed flag of `FLAG_BOUNDS` out of its bounds."""
    for dest, (bound, what) in FLAG_BOUNDS.items():
        value = getattr(args, dest, None)
        if value is not None and not fits_type(bound, value):
            raise InputError(f"{flag(dest)} {value}: expected {describe_type(bound)} (the bound of {what})")
