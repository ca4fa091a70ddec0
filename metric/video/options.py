"""Video options (frame sampling, IDF corpus, prompt) as a dataclass, and the VideoScorer they build."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pacs.metric.common.errors import InputError
from pacs.metric.scoring.model_options import ModelOptions, load_model
from pacs.metric.video.frames import FrameSampling
from pacs.metric.video.inputs import load_sentences

if TYPE_CHECKING:  # torch loads only when videos are read
    from pacs.metric.video.scorer import VideoScorer


@dataclass
class VideoOptions:
    """Where the videos are and how they are read: frames, IDF weighting and a caption prompt."""

    videos: str | None = field(default=None, metadata={
        "metavar": "DIR",
        "help": "video benchmarks: folder of <video_id>.{mp4,...} files or <video_id>/ frame folders "
                "(default: --images)"})
    fps: float | None = field(default=None, metadata={
        "help": "frames per second taken from video files (default: the benchmark's protocol; 0 = every frame)"})
    num_frames: int | None = field(default=None, metadata={
        "help": "take this many frames spread uniformly over the video instead (EMScore uses 10)"})
    max_frames: int | None = field(default=None, metadata={"help": "cap on frames per video (uniform subsample)"})
    idf_corpus: str | None = field(default=None, metadata={
        "metavar": "FILE",
        "help": "IDF corpus: a JSON list of sentences or a references file (default: the references, else the "
                "candidates; for benchmarks their released train corpus or references)"})
    no_idf: bool = field(default=False, metadata={"help": "weigh every caption token equally"})
    prompt: str = field(default="", metadata={"help": "text prepended to every candidate (default: none)"})


def frame_sampling(options: VideoOptions, default: FrameSampling | None = None) -> FrameSampling:
    """The frame sampling named by `fps` / `num_frames` / `max_frames` (`default` when neither rule is given)."""
    fps, num_frames, max_frames = options.fps, options.num_frames, options.max_frames
    if fps is None and num_frames is None and default is not None:
        return FrameSampling(fps=default.fps, num_frames=default.num_frames,
                             max_frames=max_frames if max_frames is not None else default.max_frames)
    return FrameSampling(fps=fps or None, num_frames=num_frames, max_frames=max_frames)


def idf_corpus(options: VideoOptions, default: list[str] | None) -> tuple[list[str] | None, str]:
    """The IDF corpus chosen by `no_idf` / `idf_corpus` (else `default`), and a name for provenance."""
    if options.no_idf:
        return None, "none"
    if options.idf_corpus:
        return load_sentences(options.idf_corpus), str(options.idf_corpus)
    return default, "default"


def build_video_scorer(model: ModelOptions, metric: str, sampling: FrameSampling, prompt: str = "",
                       progress: bool = True) -> VideoScorer:
    """A VideoScorer for `metric` from the model options (w defaults to 1: Eqs. 6-14 have no scale)."""
    from pacs.metric.scoring.conventions import check_long_captions
    from pacs.metric.video.scorer import VideoScorer

    if check_long_captions(model.long_captions) != "truncate":
        raise InputError("video scores match every caption token with the frames (PAC-S++ Eqs. 8-12), where "
                         "sentence chunking is not defined: use long_captions= truncate", parameter="long_captions")
    if (model.dtype or "fp32") != "fp32":
        raise InputError(f"video scores are computed in fp32 only; dtype= {model.dtype} is not supported for video",
                         parameter="dtype")
    backbone = load_model(model, metric)
    return VideoScorer(backbone, sampling, batch_size=model.batch_size or 64, device=model.device,
                       cache_dir=model.cache_dir, prompt=prompt or "", w=model.w if model.w else 1.0,
                       progress=progress, score=model.score or "cosine",
                       long_captions=model.long_captions or "truncate")
