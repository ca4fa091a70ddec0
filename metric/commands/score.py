"""`pacs score`, and the model options shared by every command that embeds images or text."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from pacs.metric.common.device import DEVICE_HELP
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import write_json_atomic
from pacs.metric.common.output_paths import Folder, check_outputs, model_inputs
from pacs.metric.common.parallel import DECODE_HELP, DECODES, WORKERS_HELP, workers_option
from pacs.metric.common.provenance import provenance
from pacs.metric.common.seeding import seed_everything
from pacs.metric.common.terminal import escape_control
from pacs.metric.models.families import ARCH_PRESETS, FAMILIES, LORA_MODES
from pacs.metric.scoring.conventions import LONG_CAPTION_MODES, SCORE_KINDS
from pacs.metric.scoring.image_lookup import IMAGE_SUFFIXES, ImageFinder
from pacs.metric.scoring.model_options import DEFAULT_CLIP_BACKBONE, ModelOptions, build_scorer, model_provenance
from pacs.metric.scoring.registry import metric_spec
from pacs.metric.scoring.score_inputs import (
    load_candidates,
    load_image_map,
    load_references,
    references_for,
)

logger = logging.getLogger(__name__)

__all__ = ["add_model_options", "register", "run_score"]


#: `--w`'s help: each default with the value the official code uses (the official PAC-S / PAC-S++ evaluation scripts
#: call their scoring function with w = 2.0 for every checkpoint; the papers state 2.5 / 3.0 for PAC-S++)
W_HELP = ("score weight w; default: clip-s 2.5 (CLIP-S's own), pac-s 2.0 (as the paper and the official scripts), "
          "pac-s++ 2.5 for ViT-B/32 and 3.0 for ViT-L/14 (as the paper; the official evaluation scripts use 2.0: "
          "--w 2.0 reproduces their numbers)")


def add_model_options(parser: argparse.ArgumentParser, w_help: str = W_HELP) -> None:
    """Add `--checkpoint --backbone --arch --w --device --batch-size --cache-dir` (and `--lora-mode`)."""
    group = parser.add_argument_group("model options")
    group.add_argument("--checkpoint", metavar="PATH",
                       help="official PAC-S / PAC-S++ file, open_clip state dict, pacs checkpoint, adapter or export "
                            "folder, open_clip local-dir folder, or transformers CLIP/SigLIP/Siglip2 folder")
    group.add_argument("--backbone", metavar="NAME[/PRETRAINED]",
                       help="open_clip NAME[/TAG or /FILE] (SigLIP: tokenizer files next to FILE) or "
                            f"local-dir:FOLDER (default for clip-s: {DEFAULT_CLIP_BACKBONE})")
    group.add_argument("--arch", metavar="FILE|PRESET",
                       help="architecture override for --checkpoint: an open_clip model-config JSON or an arch.json "
                            "with 'open_clip_equivalent'; or a preset on the shapes' architecture: "
                            + "; ".join(f"{p.name} = {p.description}" for p in ARCH_PRESETS.values()))
    group.add_argument("--family", choices=FAMILIES, default=None,
                       help="the checkpoint's family where its metadata, LoRA keys or official file name do not "
                            "establish it (it must agree with them where they do)")
    group.add_argument("--allow-family-mismatch", action="store_true",
                       help="score even when the metric contradicts the checkpoint's established family "
                            "(otherwise exit 2)")
    group.add_argument("--w", type=float, default=None, help=w_help)
    group.add_argument("--device", default="auto", help=DEVICE_HELP)
    group.add_argument("--batch-size", type=int, default=64, help="images / texts per forward pass")
    group.add_argument("--cache-dir", metavar="DIR",
                       help="persistent image-embedding cache (keyed by model fingerprint + image file hash)")
    group.add_argument("--lora-mode", choices=LORA_MODES, default="official",
                       help="PAC-S++ LoRA deltas: as the official inference applies them (conv1 + attention), "
                            "all of them, or none")
    group.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                       help="compute precision of the towers (torch.autocast for bf16/fp16; default fp32, as the "
                            "official code)")
    group.add_argument("--score", choices=SCORE_KINDS, default="cosine",
                       help="score convention: cosine = w·max(cos, 0), range [0, w], the papers' (default); sigmoid "
                            "= the model's calibrated sigmoid(scale·cos + bias), range (0, 1), for models with a "
                            "logit bias (SigLIP / SigLIP2); Ref- variants: the harmonic mean of the mapped terms")
    group.add_argument("--long-captions", choices=LONG_CAPTION_MODES, default="truncate",
                       help="captions longer than the text context: truncate (default, as the papers; the end token "
                            "kept) or chunk (split at sentence boundaries into pieces that fit, prompt included; "
                            "the mean of their normalised embeddings; references are chunked the same way)")
    group.add_argument("--workers", type=workers_option, default="auto", metavar="N|auto", help=WORKERS_HELP)
    group.add_argument("--decode", choices=DECODES, default="cpu", help=DECODE_HELP)


def run_score(args: argparse.Namespace) -> int:
    """`pacs score`: score candidates, write the per-instance JSON (atomically) and print a summary line."""
    outputs = [("--out", args.out)]
    model_files, model_folders = model_inputs(args)
    check_outputs(outputs, [("--candidates", args.candidates), ("--references", args.references),
                            ("--image-map", args.image_map), *model_files],
                  [Folder("--images", args.images, IMAGE_SUFFIXES), *model_folders])  # before any work
    seed_everything(args.seed)
    spec = metric_spec(args.metric)
    candidates = load_candidates(args.candidates)
    references = None
    if spec.reference_based:
        if not args.references:
            raise InputError(f"{spec.name} is reference-based: pass --references FILE")
        references = references_for(candidates, load_references(args.references), args.references)
    elif args.references:
        logger.info("--references ignored: %s is reference-free", spec.name)
    images_dir = Path(args.images) if args.images else None
    if images_dir is not None and not images_dir.is_dir():
        raise InputError(f"--images folder not found: {images_dir}")
    image_map = load_image_map(args.image_map) if args.image_map else None
    if images_dir is None and image_map is None:
        raise InputError("pass --images DIR (or --image-map FILE) to locate the images")
    finder = ImageFinder(images_dir, image_map)  # one lookup rule for every command (pacs.metric.scoring.image_lookup)
    paths = {}
    for candidate in candidates:
        if candidate.key not in paths:
            paths[candidate.key] = finder.resolve(candidate.key)
    check_outputs(outputs, [(f"image {key!r}", path) for key, path in paths.items()])  # --image-map's files too
    scorer = build_scorer(spec.name, ModelOptions.from_mapping(args))  # a family mismatch exits 2 there (unless allowed)
    result = scorer.score([str(paths[c.key]) for c in candidates], [c.caption for c in candidates],
                          references, names=[c.key for c in candidates])  # keyed by path: each file encoded once
    if result.n_truncated:
        logger.warning("%d caption(s) longer than %d tokens were truncated", result.n_truncated,
                       scorer.backbone.context_length)
    weight = f"w={result.w:g}" if result.score_kind == "cosine" else "sigmoid"
    summary = (f"{spec.name} ({weight}, {scorer.backbone.name}): mean {result.mean:.4f} over "
               f"{len(candidates)} captions, {len(paths)} images; {result.n_truncated} truncated"
               f"{f', {result.n_chunked} chunked' if result.long_captions == 'chunk' else ''}, "
               f"{result.n_empty} empty")
    if args.out:
        output = {
            "metric": spec.name,
            "score": result.score_kind,
            "long_captions": result.long_captions,
            "w": result.w,
            "backbone": scorer.backbone.name,
            "mean": result.mean,
            "n": len(candidates),
            "n_images": len(paths),
            "n_truncated": result.n_truncated,
            "n_truncated_references": result.n_truncated_references,
            "n_chunked": result.n_chunked,
            "n_empty": result.n_empty,
            "per_instance": [{"image_id": c.image_id, "caption": c.caption, "score": float(score),
                              "truncated": bool(cut)}
                             for c, score, cut in zip(candidates, result.scores, result.truncated)],
            "provenance": provenance(
                **model_provenance(scorer), w=result.w, seed=args.seed,
                config={"metric": spec.name, "candidates": str(args.candidates), "references": args.references,
                        "images": args.images, "image_map": args.image_map, "batch_size": scorer.batch_size,
                        "prompt": scorer.prompt, "lora_mode": args.lora_mode, "arch": args.arch,
                        "family": args.family, "allow_family_mismatch": args.allow_family_mismatch,
                        "device": str(scorer.device), "dtype": scorer.dtype, "score": result.score_kind,
                        "long_captions": result.long_captions}),
        }
        write_json_atomic(args.out, output)
        summary += f" -> {args.out}"
    print(escape_control(summary))  # paths and names are the user's text
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this package's sub-commands to the `pacs` parser."""
    parser = subparsers.add_parser("score", help="score captions with CLIP-S / PAC-S / PAC-S++ (and Ref- variants)",
                                   description="Score candidate captions against their images (and references).")
    parser.add_argument("--metric", required=True,
                        help="clip-s, ref-clip-s, pac-s, ref-pac-s, pac-s++ or ref-pac-s++ (case-insensitive)")
    parser.add_argument("--images", metavar="DIR", help="image folder: DIR/<image_id> or DIR/<image_id>.{jpg,jpeg,png} (extensions in any case)")
    parser.add_argument("--candidates", metavar="FILE", required=True,
                        help='{"image_id": "caption"} or [{"image_id": ..., "caption": ...}]')
    parser.add_argument("--references", metavar="FILE",
                        help='{"image_id": ["ref", ...]} or {"annotations": [{"image_id", "caption"}]}')
    parser.add_argument("--image-map", metavar="FILE", help='{"image_id": "path"} (overrides --images)')
    parser.add_argument("--out", metavar="FILE", help="output JSON (written atomically)")
    parser.add_argument("--seed", type=int, default=0, help="seed recorded in the provenance (and set globally)")
    add_model_options(parser)
    parser.set_defaults(func=run_score)
