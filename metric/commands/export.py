"""`pacs export`: write a PAC-S / PAC-S++ model that pacs trained in the official layout or as a folder.

Only argparse is imported here; the library (`pacs.metric.training.export`, open_clip, torch) loads when the command runs.
"""
from __future__ import annotations

import argparse

from pacs.metric.common.device import DEVICE_HELP

FORMATS = ("folder", "official")  # pacs.metric.training.export.EXPORT_FORMATS (kept here so `--help` imports nothing heavy)
DTYPES = ("fp32", "fp16")  # pacs.metric.training.export.OFFICIAL_DTYPES


def run_export(args: argparse.Namespace) -> int:
    """Run `pacs export` with parsed arguments; print what was written."""
    from pacs.metric.training.export import export_model

    result = export_model(args.checkpoint, args.out, fmt=args.format, overwrite=args.overwrite, dtype=args.dtype,
                          w=args.w, allow_nonstandard_arch=args.allow_nonstandard_arch, device=args.device)
    what = "official checkpoint" if result.format == "official" else "folder"
    print(f"wrote {result.family} {what} {result.path} ({result.n_tensors} tensors); "
          f"score it with: pacs score --metric {result.family} {result.load_hint}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `pacs export` to the `pacs` parser."""
    parser = subparsers.add_parser(
        "export", help="export a pacs-trained PAC-S / PAC-S++ model (official checkpoint layout or a folder)",
        description="Export a PAC-S / PAC-S++ model written by `pacs train-metric` (checkpoint.safetensors or "
                    "adapter/ folder). --format official writes the official checkpoint layout (every LoRA delta "
                    "merged, zero LoRA tensors); --format folder writes safetensors + open_clip_config.json + "
                    "README.md, which --checkpoint FOLDER reloads bit-identically.")
    parser.add_argument("--checkpoint", metavar="PATH", required=True,
                        help="checkpoint.safetensors or adapter/ folder written by pacs train-metric")
    parser.add_argument("--out", metavar="PATH", required=True,
                        help="output file (--format official) or folder (--format folder); written atomically")
    parser.add_argument("--format", choices=FORMATS, default="folder",
                        help="folder (default): safetensors + config + model card; official: PAC-S / PAC-S++ .pth")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32",
                        help="tensor dtype of --format official (fp32 default: exact; fp16 as the shared fixtures)")
    parser.add_argument("--w", type=float, default=None,
                        help="w recorded in the folder's config and model card (default: the family's)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--allow-nonstandard-arch", action="store_true",
                        help="write --format official even when the official code would build another model "
                             "(e.g. heads != width // 64); the export also writes OUT_STEM.arch.json next to it, "
                             "which pacs loads it with (--arch OUT_STEM.arch.json, as the printed hint says)")
    parser.add_argument("--device", default="auto", help=f"{DEVICE_HELP}; used while loading")
    parser.set_defaults(func=run_export)
