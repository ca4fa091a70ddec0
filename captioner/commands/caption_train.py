"""`pacs` sub-commands of the captioner package: `pacs caption` and `pacs train`."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from pacs.metric.common.device import DEVICE_HELP
from pacs.metric.common.errors import InputError
from pacs.metric.common.terminal import escape_control

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this package's sub-commands to the `pacs` parser."""
    caption = subparsers.add_parser("caption", help="caption a folder of images with a trained captioner or a "
                                                    "transformers image-to-text model (BLIP, BLIP-2, GIT, LLaVA-style)")
    caption.add_argument("--checkpoint", required=True,
                         help="captioner folder (model.safetensors + captioner.json), or a transformers image-to-text "
                              "folder (config.json with a model_type; loaded offline)")
    caption.add_argument("--images", required=True, help="folder of .jpg/.jpeg/.png images (extensions in any case)")
    caption.add_argument("--ids", default="stem", metavar="stem|name|coco|FILE.json",
                         help="image ids of the results: the file stem (default), the file name (Flickr8k's ids: "
                              "1000268201_693b08cb0e.jpg), the integer of a COCO file name "
                              "(COCO_val2014_000000391895.jpg -> 391895), or a JSON file {file name: id}")
    caption.add_argument("--out", required=True, help="results JSON (COCO results format)")
    caption.add_argument("--beam-size", type=int, default=5, help="beam size (transformers: num_beams; default 5)")
    caption.add_argument("--min-length", type=int, default=0, metavar="N",
                         help="forbid the end token before N words (transformers: N new tokens, min_new_tokens; "
                              "default 0: the model decides; an under-trained captioner's most probable caption may "
                              "be empty, see docs/captioner.md)")
    caption.add_argument("--prompt", default=None, metavar="TEXT",
                         help="transformers models only: the prompt of a conditional (BLIP, GIT) or instruction-tuned "
                              "(LLaVA-style, required there) model; the prompt the model echoes is stripped")
    caption.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                         help="transformers models only: the most tokens generated after the prompt (default 30)")
    caption.add_argument("--batch-size", type=int, default=32)
    caption.add_argument("--device", default="auto", help=DEVICE_HELP)
    caption.set_defaults(func=run_caption)
    train = subparsers.add_parser("train", help="run the XE -> SCST -> evaluation recipe from a YAML config")
    train.add_argument("--config", default=None,
                       help="recipe YAML file or packaged config name (e.g. demo_smoke, coco_vitb32_pac-spp: "
                            "recipes/configs/; default: demo, the embedded demo)")
    train.add_argument("--force", action="append", default=[], metavar="STAGE",
                       help="re-run STAGE (and every stage below it) from scratch; repeatable "
                            "(e.g. xe, scst-pac-s++, features/train, eval for every evaluation)")
    train.add_argument("--dry-run", action="store_true",
                       help="print the stages in order, each reused, run, resumed or refused and why, and the checks "
                            "that ran; write nothing (no run folder, lock, log or stage record)")
    train.add_argument("overrides", nargs="*", help="key=value overrides (dotted keys)")
    train.set_defaults(func=run_train)


def list_images(folder: str | Path, ids: str = "stem") -> dict[Any, Path]:
    """{image id: path} of the images in `folder` (`pacs.metric.scoring.image_lookup`): ids by `stem`, `name`, `coco` or a JSON file.

    InputError when there is no image, two images get one id, or an image has no id.
    """
    from pacs.metric.scoring.image_lookup import id_mode, ids_for_files
    from pacs.metric.scoring.image_lookup import list_images as image_files

    if not Path(folder).is_dir():
        raise InputError(f"--images {folder} is not a folder")
    return ids_for_files(image_files(folder), id_mode(ids))


def empty_captions(captions: dict[Any, str]) -> list[Any]:
    """The ids whose caption is empty (or only spaces)."""
    return [image_id for image_id, caption in captions.items() if not caption.strip()]


def caption_images(checkpoint: str | Path, images: dict[Any, Path], beam_size: int = 5, batch_size: int = 32,
                   device: str = "cpu", min_length: int = 0) -> dict[Any, str]:
    """Caption `images` ({id: path}) with the captioner folder `checkpoint` (features computed on the fly).

    Empty captions (the model ended a caption before its first word) are counted in a logged warning.
    """
    import torch
    from tqdm.auto import tqdm

    from pacs.captioner.modeling.checkpoints import load_captioner
    from pacs.captioner.modeling.decoding import beam_search
    from pacs.captioner.modeling.features import load_pixels
    from pacs.captioner.orchestration.backbone_source import load_source_backbone
    from pacs.metric.common.device import resolve_device
    from pacs.metric.models.grid import visual_grid_features

    device = resolve_device(device)  # auto: the process's device
    model, vocab, info = load_captioner(checkpoint, device)
    backbone = load_source_backbone(info.get("features", {}), device)
    fingerprint = info.get("features", {}).get("fingerprint")
    if fingerprint and getattr(backbone, "fingerprint", fingerprint) != fingerprint:
        raise InputError(f"{checkpoint}: the feature backbone now loads with fingerprint {backbone.fingerprint}, "
                         f"the captioner was trained on {fingerprint}")
    captions: dict[Any, str] = {}
    ids = list(images)
    for start in tqdm(range(0, len(ids), batch_size), desc="captioning"):
        chunk = ids[start:start + batch_size]
        with torch.no_grad():
            feats = visual_grid_features(backbone, load_pixels(backbone, images, chunk).to(device))
            decoded = beam_search(model, feats, beam_size=beam_size, return_k=1, min_length=min_length)
        for image_id, tokens in zip(chunk, decoded.tokens[:, 0]):
            captions[image_id] = vocab.decode(tokens.tolist())
    empty = empty_captions(captions)
    if empty:
        logger.warning("%d of %d captions are empty (e.g. %s): with beam size %d the captioner found ending at once "
                       "more probable than any caption (an under-trained model?); min_length=1 forbids it",
                       len(empty), len(captions), ", ".join(map(str, empty[:3])), beam_size)
    return captions


def transformers_captions(args: argparse.Namespace, images: dict[Any, Path]) -> dict[Any, str]:
    """Caption `images` with the transformers folder `--checkpoint` (pacs.captioner.modeling.hf_captioning)."""
    from pacs.captioner.modeling.hf_captioning import (
        HFCaptionOptions,
        check_folder,
        generate_captions,
        load_hf_captioner,
    )

    options = HFCaptionOptions(prompt=args.prompt, beam_size=args.beam_size, min_length=args.min_length,
                               batch_size=args.batch_size, device=args.device)
    if args.max_new_tokens is not None:
        options.max_new_tokens = args.max_new_tokens
    options.validate()  # before the model loads
    check_folder(args.checkpoint, options.prompt)
    return generate_captions(load_hf_captioner(args.checkpoint, args.device), images, options)


def run_caption(args: argparse.Namespace) -> int:
    """`pacs caption`: write COCO-format results for a folder of images, with the ids `--ids` gives."""
    from pacs.captioner.modeling.hf_captioning import TRANSFORMERS, checkpoint_kind
    from pacs.captioner.orchestration.evaluation import results_json
    from pacs.metric.common.device import resolve_device
    from pacs.metric.common.io import write_json_atomic

    images = list_images(args.images, args.ids)  # every id checked before the model is loaded
    args.device = resolve_device(args.device)  # auto: the process's device; a bad one refused before any model loads
    kind = checkpoint_kind(args.checkpoint)
    if kind != TRANSFORMERS:
        given = [flag for flag, value in (("--prompt", args.prompt), ("--max-new-tokens", args.max_new_tokens))
                 if value is not None]
        if given:
            raise InputError(f"{' and '.join(given)}: only for transformers models; --checkpoint {args.checkpoint} "
                             "is a pacs captioner")
    if kind == TRANSFORMERS:
        captions = transformers_captions(args, images)
    else:
        captions = caption_images(args.checkpoint, images, args.beam_size, args.batch_size, args.device,
                                  min_length=args.min_length)
    write_json_atomic(args.out, results_json(captions))
    empty = empty_captions(captions)
    hint = "--min-length N asks for at least N new tokens" if kind == TRANSFORMERS else "--min-length 1 forbids it"
    if empty and kind == TRANSFORMERS:
        logger.warning("%d of %d captions are empty (e.g. %s): the model ended them at once, or said nothing "
                       "after the prompt; %s", len(empty), len(captions), ", ".join(map(str, empty[:3])), hint)
    what = "the model" if kind == TRANSFORMERS else "the captioner"
    note = f" ({len(empty)} empty: {what} ended them at once; {hint})" if empty else ""
    print(escape_control(f"captioned {len(captions)} images -> {args.out}{note}"))
    return 0


def run_train(args: argparse.Namespace) -> int:
    """`pacs train`: the recipe of recipes/scst_pacs.py from the installed package."""
    from pacs.captioner.entry import plan_from_config, run_from_config, run_summary

    if args.dry_run:
        print(plan_from_config(args.config, list(args.overrides), force=list(args.force)))
        return 0
    summary = run_summary(run_from_config(args.config, list(args.overrides), force=list(args.force)))
    if summary:
        print(summary)
    return 0
