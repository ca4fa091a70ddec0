"""`pacs` sub-commands defined in metric/video_cli.py."""
from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add these sub-commands to the `pacs` parser."""
