"""Frame sampling from real video files written with PyAV and from frame folders; the frame-embedding cache."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from pacs.metric.common.errors import InputError
from pacs.metric.video.frames import FrameSampling, ShortVideo, read_frames, source_digest, uniform_indices
from pacs.metric.video.scorer import VideoScorer

from .video_support import frame_array, write_frame_folder, write_video


def nearest_source_frame(image, n_frames: int) -> int:
    """Index of the written frame closest to a decoded image (identifies decoded frames despite compression)."""
    array = np.asarray(image.convert("RGB"), dtype=np.float64)
    errors = [np.abs(array - frame_array(i)).mean() for i in range(n_frames)]
    return int(np.argmin(errors))


def test_every_frame_is_decoded_in_order(make_video):
    video = make_video("clip.mp4", 8, fps=4)
    frames = read_frames(video, FrameSampling(fps=None))
    assert [f.index for f in frames] == list(range(8))
    assert [nearest_source_frame(f.image, 8) for f in frames] == list(range(8))
    assert [f.time for f in frames] == pytest.approx([i / 4 for i in range(8)])


@pytest.mark.parametrize("codec, suffix", [("mpeg4", ".mp4"), ("libx264", ".mp4"), ("libvpx", ".webm")])
def test_rate_sampling_by_time(tmp_path, codec, suffix):
    video = write_video(tmp_path / f"clip{suffix}", [frame_array(i) for i in range(10)], fps=4, codec=codec)  # 2.5 s
    one = read_frames(video, FrameSampling(fps=1.0))
    assert [f.index for f in one] == [0, 4, 8]
    assert [nearest_source_frame(f.image, 10) for f in one] == [0, 4, 8]
    two = read_frames(video, FrameSampling(fps=2.0))
    assert [f.index for f in two] == [0, 2, 4, 6, 8]


def test_uniform_count_and_cap(make_video):
    video = make_video("clip.mp4", 10, fps=4)
    assert uniform_indices(10, 4) == [0, 3, 6, 9]
    assert [f.index for f in read_frames(video, FrameSampling(num_frames=4))] == [0, 3, 6, 9]
    assert [f.index for f in read_frames(video, FrameSampling(fps=None, max_frames=3))] == [0, 4, 9]
    assert len(read_frames(video, FrameSampling(num_frames=20))) == 20  # repeats frames, as linspace does


def test_frame_folder_natural_order_and_count(tmp_path):
    folder = write_frame_folder(tmp_path / "frames", [frame_array(i) for i in range(12)])
    frames = read_frames(folder, FrameSampling(fps=1.0))  # a folder is already sampled: fps does not apply
    assert [nearest_source_frame(f.image, 12) for f in frames] == list(range(12))  # frame_10 after frame_9
    assert [f.index for f in read_frames(folder, FrameSampling(num_frames=3))] == [0, 5, 11]


def test_bad_inputs_name_the_item(tmp_path):
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video at all")
    with pytest.raises(InputError, match="broken.mp4"):
        read_frames(broken, FrameSampling())
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="empty"):
        read_frames(tmp_path / "empty", FrameSampling())
    with pytest.raises(InputError, match="missing.mp4"):
        read_frames(tmp_path / "missing.mp4", FrameSampling())
    with pytest.raises(InputError, match="fps"):
        FrameSampling(fps=0)


def test_frame_embeddings_cached_in_memory_and_on_disk(tiny_backbone, make_video, tmp_path):
    video = make_video("clip.mp4", 6, fps=4)
    scorer = VideoScorer(tiny_backbone, FrameSampling(fps=2.0), cache_dir=tmp_path / "cache", progress=False)
    first = scorer.embed_video(video)
    assert first.shape[0] == 3 and torch.allclose(first.norm(dim=-1), torch.ones(3), atol=1e-5)
    again = scorer.embed_video(video)
    assert again is first and scorer.stats["video_cache_hits"] == 1 and scorer.stats["frames_embedded"] == 3
    fresh = VideoScorer(tiny_backbone, FrameSampling(fps=2.0), cache_dir=tmp_path / "cache", progress=False)
    from_disk = fresh.embed_video(video)
    assert fresh.stats["disk_cache_hits"] == 1 and fresh.stats["frames_embedded"] == 0
    assert torch.equal(from_disk, first)
    other_rate = VideoScorer(tiny_backbone, FrameSampling(fps=4.0), cache_dir=tmp_path / "cache", progress=False)
    assert other_rate.embed_video(video).shape[0] == 6  # the sampling is part of the cache key
    assert len(list((tmp_path / "cache" / "video-frames").rglob("*.npy"))) == 2
    assert source_digest(video) != source_digest(make_video("other.mp4", 6, fps=4, first=1))


def test_video_and_frame_folder_agree(tiny_backbone, make_video, tmp_path):
    # the same frames as a lossless folder and as a compressed video: embeddings are close, not identical
    frames = [frame_array(i) for i in range(4)]
    folder = write_frame_folder(tmp_path / "f", frames)
    video = make_video("v.mp4", 4)
    scorer = VideoScorer(tiny_backbone, FrameSampling(fps=None), progress=False)
    a, b = scorer.embed_video(folder), scorer.embed_video(video)
    assert a.shape == b.shape
    assert float((a * b).sum(dim=-1).min()) > 0.95


def test_video_with_fewer_frames_than_requested_is_reported(tiny_backbone, make_video, tmp_path, caplog):
    short = make_video("short.mp4", 3, fps=4)
    long = make_video("long.mp4", 6, fps=4, first=10)
    folder = write_frame_folder(tmp_path / "two", [frame_array(20), frame_array(21)])
    sampling = FrameSampling(fps=None, num_frames=5)
    with caplog.at_level(logging.WARNING, logger="pacs.metric.video.frames"):
        frames = read_frames(short, sampling)
    # int(linspace(0, 2, 5)) = 0 0 1 1 2: five frames, three distinct
    assert [f.index for f in frames] == [0, 0, 1, 1, 2]
    assert f"{short} yields 3 distinct frame(s) of the 5 requested" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pacs.metric.video.frames"):
        read_frames(long, sampling)  # 0 1 2 3 5: nothing to report
    assert caplog.text == ""
    scorer = VideoScorer(tiny_backbone, sampling, cache_dir=tmp_path / "cache", progress=False)
    for video in (short, long, folder, short):
        scorer.embed_video(video)
    # the folder: int(linspace(0, 1, 5)) = 0 0 0 0 1, two distinct; the second `short` is a memory-cache hit
    assert scorer.short_videos == [ShortVideo(str(short), 5, 3), ShortVideo(str(folder), 5, 2)]
    assert scorer.stats["short_videos"] == 2
    fresh = VideoScorer(tiny_backbone, sampling, cache_dir=tmp_path / "cache", progress=False)
    for video in (short, long, folder):
        fresh.embed_video(video)
    assert fresh.stats["disk_cache_hits"] == 3 and fresh.stats["frames_embedded"] == 0
    assert fresh.short_videos == [ShortVideo(str(short), 5, 3), ShortVideo(str(folder), 5, 2)]
    by_rate = VideoScorer(tiny_backbone, FrameSampling(fps=1.0), progress=False)
    by_rate.embed_video(short)  # a rate requests no count
    assert by_rate.short_videos == []
