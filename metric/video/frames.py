"""Frames of a video: sampled from a video file (PyAV) or read from a folder of frame images.

Two sampling rules (`FrameSampling`):
- a rate: `fps` frames per second of video, by presentation time (the first decoded frame is taken, then the
  first frame at or after every further multiple of `1/fps` seconds); `fps=None` keeps every decoded frame;
- a count: `num_frames` frames spread uniformly over all frames (indices `linspace(0, n-1, num_frames)` truncated
  to int, the EMScore protocol for VATEX-EVAL); when set it overrides `fps`.
A folder of frames is taken as already sampled: every image in natural name order (`frame_2` before `frame_10`),
then `num_frames` applies the same way.
`max_frames` caps a long video: when more frames than that were sampled, `max_frames` are kept uniformly.
A video that yields fewer distinct frames than `num_frames` asks for (a short video: the uniform indices repeat
frames; or frames that could not be decoded) is reported: `short_video` logs a warning naming it and the counts,
and `VideoScorer` counts it (`stats["short_videos"]`, `short_videos`).
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from pacs.metric.common.contained_paths import ConfinedRoot
from pacs.metric.common.errors import InputError, MissingResourceError

logger = logging.getLogger(__name__)

VIDEO_EXTENSIONS = (".mp4", ".avi", ".mkv", ".webm", ".mov", ".m4v", ".mpg", ".mpeg", ".gif")
FRAME_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


@dataclass
class FrameSampling:
    """How frames are taken from a video: a rate (`fps`) or a uniform count (`num_frames`), with a cap."""

    fps: float | None = 1.0
    num_frames: int | None = None
    max_frames: int | None = None

    def __post_init__(self) -> None:
        if self.fps is not None and not self.fps > 0:
            raise InputError(f"frame sampling: fps must be > 0 (got {self.fps})")
        if self.num_frames is not None and self.num_frames < 1:
            raise InputError(f"frame sampling: num_frames must be >= 1 (got {self.num_frames})")
        if self.max_frames is not None and self.max_frames < 1:
            raise InputError(f"frame sampling: max_frames must be >= 1 (got {self.max_frames})")

    def key(self) -> str:
        """A short string identifying this sampling (part of the frame-embedding cache key)."""
        if self.num_frames is not None:
            rule = f"n{self.num_frames}"
        else:
            rule = "all" if self.fps is None else f"fps{self.fps:g}"
        return rule + ("" if self.max_frames is None else f"-max{self.max_frames}")


@dataclass
class Frame:
    """One sampled frame: its position among all frames, its time in seconds (None for folders), the image."""

    index: int
    time: float | None
    image: Image.Image


@dataclass(frozen=True)
class ShortVideo:
    """A video that yielded fewer distinct frames than the sampling requested."""

    source: str
    requested: int
    distinct: int


def short_video(source: str | os.PathLike, sampling: FrameSampling, indices: Iterable[int]) -> ShortVideo | None:
    """Report a video whose sampled frame `indices` hold fewer distinct frames than `num_frames` (a warning).

    Only a count (`num_frames`) is a request; a rate (`fps`) takes what the video has. Returns None when the
    video yielded what was asked.
    """
    if sampling.num_frames is None:
        return None
    distinct = len(set(indices))
    if distinct >= sampling.num_frames:
        return None
    logger.warning("%s yields %d distinct frame(s) of the %d requested (num_frames): a shorter video repeats "
                   "frames, an undecodable one has fewer", source, distinct, sampling.num_frames)
    return ShortVideo(str(source), sampling.num_frames, distinct)


def uniform_indices(total: int, count: int) -> list[int]:
    """Return `count` indices spread uniformly over `range(total)` (EMScore: `int(linspace(0, total-1, count))`)."""
    if total <= 0:
        return []
    return [int(i) for i in np.linspace(0, total - 1, count)]


def natural_key(name: str) -> list:
    """Sort key that orders embedded numbers numerically (`f2.jpg` before `f10.jpg`)."""
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", name)]


def frame_files(folder: str | os.PathLike) -> list[Path]:
    """Return the frame images of a folder in natural name order (an error when there are none)."""
    folder = Path(folder)
    files = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in FRAME_EXTENSIONS]
    if not files:
        raise InputError(f"{folder}: frame folder holds no images ({', '.join(FRAME_EXTENSIONS)})")
    return sorted(files, key=lambda p: natural_key(p.name))


def is_video_source(path: str | os.PathLike) -> bool:
    """True for a frame folder or a file with a known video extension."""
    path = Path(path)
    return path.is_dir() or (path.is_file() and path.suffix.lower() in VIDEO_EXTENSIONS)


def cap_indices(count: int, max_frames: int | None) -> list[int]:
    """Indices kept of `count` sampled frames under the `max_frames` cap (all of them when under it)."""
    if max_frames is None or count <= max_frames:
        return list(range(count))
    return uniform_indices(count, max_frames)


def iter_folder_frames(folder: str | os.PathLike, sampling: FrameSampling) -> Iterator[Frame]:
    """Yield the sampled frames of a frame folder (all images, or `num_frames` uniformly), before the cap."""
    # imported here: torch/torchvision load only when frames are read
    from pacs.metric.models.preprocess import open_image

    files = frame_files(folder)
    indices = list(range(len(files)))
    if sampling.num_frames is not None:
        indices = uniform_indices(len(files), sampling.num_frames)
    for index in indices:
        yield Frame(index=index, time=None, image=open_image(files[index]))


def _import_av():
    try:
        import av
    except ImportError:  # pragma: no cover - depends on the environment
        raise MissingResourceError(
            "reading video files needs PyAV: pip install av (or pacs-captioning[video]); "
            "a folder of frame images works without it") from None
    return av


def _open_container(path: Path):
    """Open a video file with PyAV (an InputError naming the file when it is not a video)."""
    av = _import_av()
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError) as error:
        raise InputError(f"{path}: not a readable video ({error})") from None
    if not container.streams.video:
        container.close()
        raise InputError(f"{path}: no video stream")
    return container


def _count_frames(path: Path) -> int:
    """Number of frames of the first video stream (container metadata, else by demuxing packets)."""
    with _open_container(path) as container:
        stream = container.streams.video[0]
        if stream.frames:
            return int(stream.frames)
        return sum(1 for packet in container.demux(stream) if packet.size)


def _decode(path: Path) -> Iterator[tuple[int, float | None, object]]:
    """Yield (index, time in seconds, av.VideoFrame) for every frame of the first video stream."""
    av = _import_av()
    with _open_container(path) as container:
        stream = container.streams.video[0]
        rate = float(stream.average_rate) if stream.average_rate else None
        try:
            for index, frame in enumerate(container.decode(stream)):
                time = frame.time if frame.time is not None else (index / rate if rate else None)
                yield index, time, frame
        except av.FFmpegError as error:
            raise InputError(f"{path}: video decoding failed ({error})") from None


def _pick(path: Path, indices: list[int]) -> list[Frame]:
    """Decode a video and return the frames at `indices` (in that order; an index may repeat)."""
    wanted, last = set(indices), max(indices, default=-1)
    found: dict[int, Frame] = {}
    for index, time, frame in _decode(path):
        if index in wanted:
            found[index] = Frame(index=index, time=time, image=frame.to_image())
        if index >= last:
            break
    return [found[i] for i in indices if i in found]


def iter_video_frames(path: str | os.PathLike, sampling: FrameSampling) -> Iterator[Frame]:
    """Decode a video file with PyAV and yield its sampled frames (RGB PIL images), before the cap."""
    path = Path(path)
    if sampling.num_frames is not None:
        expected = _count_frames(path)
        frames = _pick(path, uniform_indices(expected, sampling.num_frames))
        if len(frames) != sampling.num_frames:  # metadata was wrong: select over the true count
            decoded = sum(1 for _ in _decode(path))
            logger.debug("%s: container says %d frames, decoded %d", path, expected, decoded)
            frames = _pick(path, uniform_indices(decoded, sampling.num_frames))
        if not frames:
            raise InputError(f"{path}: no frames could be decoded")
        yield from frames
        return
    step = None if sampling.fps is None else 1.0 / sampling.fps
    start, target, count = None, 0.0, 0
    for index, time, frame in _decode(path):
        if step is not None and time is not None:
            start = time if start is None else start
            relative = time - start
            if relative + 1e-6 < target:
                continue
            while target <= relative + 1e-6:
                target += step
        count += 1
        yield Frame(index=index, time=time, image=frame.to_image())
    if count == 0:
        raise InputError(f"{path}: no frames could be decoded")


def iter_frames(source: str | os.PathLike, sampling: FrameSampling) -> Iterator[Frame]:
    """Yield the sampled frames of a video file or a frame folder, before the `max_frames` cap."""
    source = Path(source)
    if source.is_dir():
        return iter_folder_frames(source, sampling)
    if not source.is_file():
        raise InputError(f"{source}: video not found")
    return iter_video_frames(source, sampling)


def read_frames(source: str | os.PathLike, sampling: FrameSampling) -> list[Frame]:
    """Return the sampled frames of a video file or a frame folder (`max_frames` applied; a short video logged)."""
    frames = list(iter_frames(source, sampling))
    short_video(source, sampling, (frame.index for frame in frames))
    return [frames[i] for i in cap_indices(len(frames), sampling.max_frames)]


def source_digest(source: str | os.PathLike) -> str:
    """sha256 identifying a video's content: the file's bytes, or a frame folder's names and bytes."""
    source = Path(source)
    digest = hashlib.sha256()
    files = frame_files(source) if source.is_dir() else [source]
    for file in files:
        if source.is_dir():
            digest.update(file.name.encode("utf-8") + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def find_video(videos_dir: str | os.PathLike | None, video_id: str,
               video_map: dict[str, str] | None = None) -> Path | None:
    """Locate a video: `video_map[id]`, else `DIR/<id>` (a file or frame folder), else `DIR/<id>.<video ext>`."""
    if video_map is not None and video_id in video_map:
        path = Path(video_map[video_id])
        return path if path.exists() else None
    if videos_dir is None:
        return None
    folder = ConfinedRoot(videos_dir, f"the video folder videos={videos_dir}")  # ids stay inside, symlinks resolved
    direct = folder.join(video_id, f"video id {video_id!r}", parameter="videos")
    if direct.is_dir() or direct.is_file():
        return direct
    for extension in VIDEO_EXTENSIONS:
        candidate = folder.join(f"{video_id}{extension}", f"video id {video_id!r}", parameter="videos")
        if candidate.is_file():
            return candidate
    return None


def find_videos(videos_dir: str | os.PathLike | None, video_ids: Iterable[str],
                video_map: dict[str, str] | None = None) -> tuple[dict[str, Path], list[str]]:
    """Locate every distinct video id; return the found paths and the ids not found (in first-seen order)."""
    found: dict[str, Path] = {}
    missing: list[str] = []
    for video_id in dict.fromkeys(video_ids):
        path = find_video(videos_dir, video_id, video_map)
        if path is None:
            missing.append(video_id)
        else:
            found[video_id] = path
    return found, missing
