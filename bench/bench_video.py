"""Benchmark: PAC-S++ video scoring — frame decoding and embedding (frames/s), scoring (videos/s), cached vs uncached.

Writes a few real videos with PyAV into a temporary folder and scores 6 captions per video (the VATEX-EVAL
layout) with a randomly initialised open_clip model (no download; ViT-B-32 by default, the paper's backbone).
Every row is timed in the same run (the cheap rows as the best of --repeats); ratios are against the uncached
end-to-end run (decode + embed + score):
- decoding only (PyAV, frames sampled at --fps);
- frame embedding only (preprocess + image tower, batches of --batch-size);
- scoring, uncached: a fresh VideoScorer (decode + embed frames + embed captions + Eqs. 6-14);
- scoring, disk cache: a fresh VideoScorer reading frame embeddings from --cache-dir (EmbeddingCache);
- scoring, memory cache: the same VideoScorer again (frames and caption tokens cached).

    python bench/bench_video.py [--videos 4] [--seconds 8] [--fps 1] [--backbone ViT-B-32] [--threads 2] [--repeats 3]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import av
import numpy as np
import torch
from timing import best_time

from pacs.metric.models.backbones import Backbone, build_backbone_from_config, tiny_clip_config
from pacs.metric.video.frames import FrameSampling, read_frames
from pacs.metric.video.scorer import VideoScorer


def write_videos(folder: Path, count: int, seconds: int, fps: int = 8, size: int = 256) -> list[Path]:
    """Write `count` synthetic H.264/MPEG-4 videos of moving gradients."""
    paths = []
    rng = np.random.default_rng(0)
    grid = np.linspace(0, 255, size, dtype=np.float32)
    for index in range(count):
        path = folder / f"video{index}.mp4"
        colour = rng.uniform(0.3, 1.0, size=3).astype(np.float32)
        with av.open(str(path), "w") as container:
            stream = container.add_stream("mpeg4", rate=fps)
            stream.width = stream.height = size
            stream.pix_fmt = "yuv420p"
            for frame_index in range(seconds * fps):
                shift = (grid[None, :] + 8 * frame_index + 40 * index) % 256
                image = (shift[..., None] * colour[None, None, :] + grid[:, None, None] * 0.2).clip(0, 255)
                frame = np.broadcast_to(image, (size, size, 3)).astype(np.uint8)
                for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        paths.append(path)
    return paths


def build_backbone(name: str) -> Backbone:
    """A random-weight backbone: an open_clip architecture by name, or `tiny`."""
    if name == "tiny":
        return build_backbone_from_config(tiny_clip_config(), seed=0, name="tiny")
    import open_clip

    config = open_clip.get_model_config(name)
    if config is None:
        raise SystemExit(f"unknown open_clip architecture {name!r}")
    return build_backbone_from_config(dict(config), seed=0, name=f"{name} (random)")


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--fps", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--backbone", default="ViT-B-32", help="open_clip architecture (random weights) or 'tiny'")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="best of N for the cheap rows (decode, cached)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    backbone = build_backbone(args.backbone)
    sampling = FrameSampling(fps=args.fps)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        videos = write_videos(tmp, args.videos, args.seconds)
        captions = [f"{adj} {noun} {verb} in the {place}" for adj in ("a young", "an old") for noun in ("man", "dog")
                    for verb in ("runs", "jumps") for place in ("park", "street")][:6]
        pairs = [(video, caption) for video in videos for caption in captions]
        pair_videos, pair_captions = [p[0] for p in pairs], [p[1] for p in pairs]

        t_decode, frames = best_time(lambda: [read_frames(v, sampling) for v in videos], args.repeats)
        n_frames = sum(len(f) for f in frames)
        images = [frame.image for video_frames in frames for frame in video_frames]
        embedder = VideoScorer(backbone, sampling, batch_size=args.batch_size, progress=False)
        embedder.embed_frames(images[:2])  # warm-up
        t_embed, _ = best_time(lambda: embedder.embed_frames(images))

        cold = VideoScorer(backbone, sampling, batch_size=args.batch_size, cache_dir=tmp / "cache", progress=False)
        idf = cold.idf(pair_captions)
        t_cold, cold_result = best_time(lambda: cold.score(pair_videos, pair_captions, idf=idf))
        def from_disk() -> object:
            disk = VideoScorer(backbone, sampling, batch_size=args.batch_size, cache_dir=tmp / "cache",
                               progress=False)
            result = disk.score(pair_videos, pair_captions, idf=idf)
            assert disk.stats["disk_cache_hits"] == len(videos) and disk.stats["frames_embedded"] == 0
            return result

        t_disk, disk_result = best_time(from_disk, args.repeats)
        t_memory, memory_result = best_time(lambda: cold.score(pair_videos, pair_captions, idf=idf), args.repeats)
        assert np.allclose(disk_result.scores, cold_result.scores, atol=1e-6)
        assert np.array_equal(memory_result.scores, cold_result.scores)

    print(f"PAC-S++ video: {len(videos)} videos x {args.seconds} s, {n_frames} frames at {args.fps:g} fps, "
          f"{len(pairs)} captions; backbone {backbone.name}; {args.threads} threads")
    rows = [
        ("decode only (PyAV)", t_decode, f"{n_frames / t_decode:9.1f} frames/s"),
        ("embed frames only", t_embed, f"{n_frames / t_embed:9.1f} frames/s"),
        ("score, uncached (baseline)", t_cold, f"{len(videos) / t_cold:9.2f} videos/s"),
        ("score, frame embeddings on disk", t_disk, f"{len(videos) / t_disk:9.2f} videos/s"),
        ("score, memory cache", t_memory, f"{len(videos) / t_memory:9.2f} videos/s"),
    ]
    print(f"{'step':<34} {'seconds':>9} {'rate':>19} {'vs baseline':>12}")
    for name, seconds, rate in rows:
        print(f"{name:<34} {seconds:9.3f} {rate:>19} {t_cold / seconds:11.1f}x")


if __name__ == "__main__":
    main()
