"""`pacs score-video`: PAC-S++ (or CLIP-S / PAC-S) video-caption scores, with the output contract of `pacs score`."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from pacs.metric.commands.score import add_model_options
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import write_json_atomic
from pacs.metric.common.output_paths import Folder, check_outputs, model_inputs, path_inputs
from pacs.metric.common.provenance import provenance
from pacs.metric.common.seeding import seed_everything
from pacs.metric.common.terminal import escape_control
from pacs.metric.scoring.model_options import ModelOptions, model_provenance
from pacs.metric.scoring.registry import metric_spec
from pacs.metric.scoring.score_inputs import load_image_map, load_references, references_for
from pacs.metric.video.frames import FRAME_EXTENSIONS, VIDEO_EXTENSIONS, find_videos
from pacs.metric.video.inputs import load_video_candidates
from pacs.metric.video.options import VideoOptions, build_video_scorer, frame_sampling, idf_corpus

logger = logging.getLogger(__name__)

__all__ = ["add_sampling_options", "register", "run_score_video", "video_options_from_args"]


def _add_video_arguments(container: Any, fps_default: float | None) -> None:
    fps_help = f"default {fps_default:g}" if fps_default is not None else "default: the benchmark's protocol"
    container.add_argument("--fps", type=float, default=fps_default,
                           help=f"frames per second taken from video files ({fps_help}; 0 = every frame)")
    container.add_argument("--num-frames", type=int, default=None,
                           help="take this many frames spread uniformly over the video instead (EMScore uses 10)")
    container.add_argument("--max-frames", type=int, default=None, help="cap on frames per video (uniform subsample)")
    container.add_argument("--idf-corpus", metavar="FILE",
                           help="IDF corpus: a JSON list of sentences or a references file (default: the references, "
                                "else the candidates; for benchmarks their released train corpus or references)")
    container.add_argument("--no-idf", action="store_true", help="weigh every caption token equally")
    container.add_argument("--prompt", default="", help="text prepended to every candidate (default: none)")


def add_sampling_options(parser: argparse.ArgumentParser, fps_default: float | None = 1.0) -> None:
    """Add the group `--fps --num-frames --max-frames --idf-corpus --no-idf --prompt` to a parser."""
    _add_video_arguments(parser.add_argument_group("video options"), fps_default)


def video_options_from_args(args: argparse.Namespace) -> VideoOptions:
    """The video options of a parsed command line (absent ones keep the dataclass defaults)."""
    values = {name: getattr(args, name) for name in ("videos", "fps", "num_frames", "max_frames", "idf_corpus",
                                                     "no_idf", "prompt") if getattr(args, name, None) is not None}
    return VideoOptions(**values)


def run_score_video(args: argparse.Namespace) -> int:
    """`pacs score-video`: score candidates against their videos, write the JSON atomically, print a summary."""
    outputs = [("--out", args.out)]
    model_files, model_folders = model_inputs(args)
    check_outputs(outputs, [("--candidates", args.candidates), ("--references", args.references),
                            ("--video-map", args.video_map), ("--idf-corpus", getattr(args, "idf_corpus", None)),
                            *model_files],
                  [Folder("--videos", args.videos, VIDEO_EXTENSIONS + FRAME_EXTENSIONS), *model_folders])
    seed_everything(args.seed)
    spec = metric_spec(args.metric)
    candidates = load_video_candidates(args.candidates)
    reference_table = load_references(args.references) if args.references else None
    references = None
    if spec.reference_based:
        if reference_table is None:
            raise InputError(f"{spec.name} is reference-based: pass --references FILE")
        references = references_for(candidates, reference_table, args.references)
    videos_dir = Path(args.videos) if args.videos else None
    if videos_dir is not None and not videos_dir.is_dir():
        raise InputError(f"--videos folder not found: {videos_dir}")
    video_map = {k: str(v) for k, v in load_image_map(args.video_map).items()} if args.video_map else None
    if videos_dir is None and video_map is None:
        raise InputError("pass --videos DIR (or --video-map FILE) to locate the videos")
    paths, missing = find_videos(videos_dir, [c.key for c in candidates], video_map)
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise InputError(f"no video file or frame folder for video id(s) {', '.join(map(repr, missing[:3]))}{more} "
                         f"in {videos_dir or args.video_map}")
    for key, path in paths.items():  # a video file, or a frame folder whose frames are inputs (--video-map's too)
        files, folders = path_inputs(f"video {key!r}", path, FRAME_EXTENSIONS)
        check_outputs(outputs, files, folders)
    if reference_table is not None:
        default_corpus = [s for group in reference_table.values() for s in group]
        default_name = f"references ({args.references})"
    else:
        default_corpus, default_name = [c.caption for c in candidates], "candidates"
    video = video_options_from_args(args)
    corpus, corpus_name = idf_corpus(video, default_corpus)
    corpus_name = default_name if corpus_name == "default" else corpus_name
    scorer = build_video_scorer(ModelOptions.from_mapping(args), spec.name, frame_sampling(video),
                                prompt=args.prompt or "")  # a family mismatch exits 2 there (unless allowed)
    idf = scorer.idf(corpus)
    result = scorer.score([paths[c.key] for c in candidates], [c.caption for c in candidates], references,
                          idf=idf)
    mean = float(result.scores.mean())
    if result.n_truncated:
        logger.warning("%d caption(s) longer than %d tokens were truncated", result.n_truncated,
                       getattr(scorer.backbone, "context_length", 77))
    weight = f"w={result.w:g}" if result.score_kind == "cosine" else "sigmoid"
    summary = (f"{spec.name} video ({weight}, {scorer.backbone.name}): mean {mean:.4f} over "
               f"{len(candidates)} captions, {len(paths)} videos, {scorer.stats['frames_embedded']} frames embedded; "
               f"{result.n_truncated} truncated, {result.n_empty} empty")
    if scorer.short_videos:
        summary += f", {len(scorer.short_videos)} video(s) short of --num-frames"
    if args.out:
        per_instance: list[dict[str, Any]] = []
        for index, candidate in enumerate(candidates):
            row = {"video_id": candidate.image_id, "caption": candidate.caption,
                   "score": float(result.scores[index]), "coarse": float(result.coarse[index]),
                   "fine": float(result.fine[index]), "precision": float(result.precision[index]),
                   "recall": float(result.recall[index]), "truncated": bool(result.truncated[index])}
            if result.ref_terms is not None:
                row["video_score"] = float(result.video_scores[index])
                row["ref_term"] = float(result.ref_terms[index])
            per_instance.append(row)
        sampling = scorer.sampling
        config = {"metric": spec.name, "candidates": str(args.candidates), "references": args.references,
                  "videos": args.videos, "video_map": args.video_map, "batch_size": scorer.batch_size,
                  "prompt": scorer.prompt, "fps": sampling.fps, "num_frames": sampling.num_frames,
                  "max_frames": sampling.max_frames, "idf_corpus": corpus_name,
                  "idf_documents": idf.n_documents, "lora_mode": args.lora_mode, "arch": args.arch,
                  "device": str(scorer.device), "score": result.score_kind, "long_captions": scorer.long_captions}
        output = {
            "metric": spec.name, "score": result.score_kind, "long_captions": scorer.long_captions,
            "w": result.w, "backbone": scorer.backbone.name, "mean": mean,
            "n": len(candidates), "n_videos": len(paths), "n_truncated": result.n_truncated,
            "n_empty": result.n_empty, "n_short_videos": len(scorer.short_videos),
            "short_videos": [{"video": short.source, "requested": short.requested, "distinct": short.distinct}
                             for short in scorer.short_videos],
            "per_instance": per_instance,
            "provenance": provenance(**model_provenance(scorer), w=result.w, seed=args.seed, config=config),
        }
        write_json_atomic(args.out, output)
        summary += f" -> {args.out}"
    print(escape_control(summary))  # paths and names are the user's text
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add these sub-commands to the `pacs` parser."""
    parser = subparsers.add_parser(
        "score-video", help="score video captions with PAC-S++ (coarse + fine-grained, Ref- variants)",
        description="Score candidate captions against their videos (video files or frame folders), "
                    "PAC-S++ Eqs. 6-14.")
    parser.add_argument("--metric", required=True,
                        help="pac-s++, ref-pac-s++ (also clip-s, pac-s and their ref- variants; case-insensitive)")
    parser.add_argument("--videos", metavar="DIR",
                        help="DIR/<video_id> (video file or frame folder) or DIR/<video_id>.{mp4,avi,mkv,webm,...}")
    parser.add_argument("--video-map", metavar="FILE", help='{"video_id": "path"} (overrides --videos)')
    parser.add_argument("--candidates", metavar="FILE", required=True,
                        help='{"video_id": "caption"} or [{"video_id" (or "image_id"): ..., "caption": ...}]')
    parser.add_argument("--references", metavar="FILE",
                        help='{"video_id": ["ref", ...]} or {"annotations": [...]}: the references of ref- metrics '
                             "and the default IDF corpus")
    parser.add_argument("--out", metavar="FILE", help="output JSON (written atomically)")
    parser.add_argument("--seed", type=int, default=0, help="seed recorded in the provenance (and set globally)")
    add_sampling_options(parser)
    add_model_options(parser, w_help="score weight w (default 1: PAC-S++ Eqs. 6-14 carry no w; it multiplies the "
                                     "final score and changes no ranking)")
    parser.set_defaults(func=run_score_video)
