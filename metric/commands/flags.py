"""Library parameter names -> command-line flags: the one table the CLI uses to print library errors."""
from __future__ import annotations

import re

from pacs.metric.common.errors import PacsError

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
