"""`--out FILE`, the one output flag of every command; an older spelling (`--json`) kept as a deprecated alias."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

OUT = "--out"


class DeprecatedAliasStore(argparse.Action):
    """Store the value; when given by a deprecated spelling, print one deprecation line on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, deprecated: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.deprecated = tuple(deprecated)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        """Set `dest`; name the flag to use instead when `option_string` is a deprecated one."""
        if option_string in self.deprecated:
            print(f"{parser.prog}: {option_string} is deprecated, use {OUT} (the same file is written)", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_out_option(parser: Any, help: str, dest: str = "out", deprecated: Sequence[str] = (),
                   metavar: str = "FILE") -> None:
    """Add `--out` (stored in `dest`) to `parser` (a parser or argument group), with `deprecated` aliases."""
    aliases = tuple(deprecated)
    suffix = f"; {', '.join(aliases)}: deprecated alias" if aliases else ""
    parser.add_argument(OUT, *aliases, dest=dest, metavar=metavar, action=DeprecatedAliasStore, deprecated=aliases,
                        help=help + suffix)
