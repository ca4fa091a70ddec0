"""`pacs score-video`: PAC-S++ (or CLIP-S / PAC-S) video-caption scores, with the output contract of `pacs score`."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metric.commands.score import add_model_options, backbone_from_args, model_provenance
from metric.common.errors import InputError
from metric.common.io import write_json_atomic
from metric.common.provenance import provenance
from metric.common.seeding import seed_everything
from metric.scoring.registry import metric_spec
from metric.scoring.inputs import (Candidate, load_candidates, load_image_map, load_references, read_json,
                                 references_for)
from metric.video.frames import FrameSampling, find_videos

if TYPE_CHECKING:  # torch loads only when a command reads videos
    from metric.video.scorer import VideoScorer

logger = logging.getLogger(__name__)


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


def add_video_benchmark_options(container: Any) -> None:
    """Add `--videos` and the video options to `pacs correlate` (a parser or group; once, whichever benchmark asks)."""
    if "--videos" in container._option_string_actions:  # both video benchmarks share these options
        return
    container.add_argument("--videos", metavar="DIR",
                           help="video benchmarks: folder of <video_id>.{mp4,...} files or <video_id>/ frame "
                                "folders (default: --images)")
    _add_video_arguments(container, fps_default=None)


def sampling_from_args(args: argparse.Namespace, default: FrameSampling | None = None) -> FrameSampling:
    """The frame sampling named by `--fps --num-frames --max-frames` (`default` when neither rule is given)."""
    fps, num_frames = getattr(args, "fps", None), getattr(args, "num_frames", None)
    max_frames = getattr(args, "max_frames", None)
    if fps is None and num_frames is None and default is not None:
        return FrameSampling(fps=default.fps, num_frames=default.num_frames,
                             max_frames=max_frames if max_frames is not None else default.max_frames)
    return FrameSampling(fps=fps or None, num_frames=num_frames, max_frames=max_frames)


def video_scorer_from_args(args: argparse.Namespace, metric: str, sampling: FrameSampling | None = None,
                           progress: bool = True) -> VideoScorer:
    """Build a VideoScorer from the model and video options (`--w` defaults to 1: Eqs. 6-14 have no scale)."""
    from metric.video.scorer import VideoScorer

    backbone = backbone_from_args(args, metric)
    return VideoScorer(backbone, sampling or sampling_from_args(args),
                       batch_size=getattr(args, "batch_size", 64) or 64, device=getattr(args, "device", None),
                       cache_dir=getattr(args, "cache_dir", None), prompt=getattr(args, "prompt", "") or "",
                       w=args.w if getattr(args, "w", None) else 1.0, progress=progress)


def idf_corpus_from_args(args: argparse.Namespace, default: list[str] | None) -> tuple[list[str] | None, str]:
    """The IDF corpus chosen by `--no-idf` / `--idf-corpus` (else `default`), and a name for provenance."""
    if getattr(args, "no_idf", False):
        return None, "none"
    if getattr(args, "idf_corpus", None):
        return load_sentences(args.idf_corpus), str(args.idf_corpus)
    return default, "default"


def load_sentences(path: str | Path) -> list[str]:
    """An IDF corpus file: a JSON list of sentences, or any references file `pacs score` accepts."""
    data = read_json(path, "IDF corpus")
    if isinstance(data, list):
        for index, sentence in enumerate(data):
            if not isinstance(sentence, str):
                raise InputError(f"{path}: IDF corpus entry #{index} is not a string: {sentence!r}")
        return data
    return [sentence for group in load_references(path).values() for sentence in group]


def load_video_candidates(path: str | Path) -> list[Candidate]:
    """The `pacs score` candidate formats, plus a results list keyed by `video_id` instead of `image_id`."""
    data = read_json(path, "candidates")
    if not (isinstance(data, list) and data and all(isinstance(item, dict) and "video_id" in item
                                                    and "image_id" not in item for item in data)):
        return load_candidates(path)
    candidates = []
    for index, item in enumerate(data):
        video_id, caption = item["video_id"], item.get("caption")
        if not isinstance(video_id, (str, int)) or isinstance(video_id, bool):
            raise InputError(f"{path}: entry #{index} has a video_id that is not a string or integer: {video_id!r}")
        if not isinstance(caption, str):
            raise InputError(f"{path}: candidate #{index} (video id {video_id!r}) has no caption string")
        candidates.append(Candidate(video_id, caption))
    return candidates


def run_score_video(args: argparse.Namespace) -> int:
    """`pacs score-video`: score candidates against their videos, write the JSON atomically, print a summary."""
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
    if reference_table is not None:
        default_corpus = [s for group in reference_table.values() for s in group]
        default_name = f"references ({args.references})"
    else:
        default_corpus, default_name = [c.caption for c in candidates], "candidates"
    corpus, corpus_name = idf_corpus_from_args(args, default_corpus)
    corpus_name = default_name if corpus_name == "default" else corpus_name
    scorer = video_scorer_from_args(args, spec.name)  # a family mismatch exits 2 there (unless allowed)
    idf = scorer.idf(corpus)
    result = scorer.score([paths[c.key] for c in candidates], [c.caption for c in candidates], references,
                          idf=idf)
    mean = float(result.scores.mean())
    if result.n_truncated:
        logger.warning("%d caption(s) longer than %d tokens were truncated", result.n_truncated,
                       getattr(scorer.backbone, "context_length", 77))
    summary = (f"{spec.name} video (w={result.w:g}, {scorer.backbone.name}): mean {mean:.4f} over "
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
                   "recall": float(result.recall[index])}
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
                  "device": args.device}
        output = {
            "metric": spec.name, "w": result.w, "backbone": scorer.backbone.name, "mean": mean,
            "n": len(candidates), "n_videos": len(paths), "n_truncated": result.n_truncated,
            "n_empty": result.n_empty, "n_short_videos": len(scorer.short_videos),
            "short_videos": [{"video": short.source, "requested": short.requested, "distinct": short.distinct}
                             for short in scorer.short_videos],
            "per_instance": per_instance,
            "provenance": provenance(**model_provenance(scorer), w=result.w, seed=args.seed, config=config),
        }
        write_json_atomic(args.out, output)
        summary += f" -> {args.out}"
    print(summary)
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
    add_model_options(parser)
    parser.set_defaults(func=run_score_video)
