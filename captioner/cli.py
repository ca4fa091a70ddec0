"""`pacs` sub-commands of the captioner package."""
from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this package's sub-commands to the `pacs` parser."""
