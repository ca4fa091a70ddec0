"""Writers of small real videos (PyAV) and frame folders for the video tests."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config


def build_tiny_backbone(family: str = "clip"):
    """A tiny random ViT CLIP (32x32 images, 2-layer text tower), always the same weights."""
    config = tiny_clip_config(vision_cfg={"image_size": 32, "patch_size": 8, "layers": 1, "width": 32,
                                          "head_width": 16})
    return build_backbone_from_config(config, seed=3, name="tiny-video", family=family)


def frame_array(index: int, size: tuple[int, int] = (48, 64)) -> np.ndarray:
    """A deterministic, clearly distinct RGB frame for `index` (stripes whose colour and width vary)."""
    height, width = size
    rng = np.random.default_rng(index)
    base = rng.integers(0, 256, size=(1, 1, 3))
    stripes = (np.arange(width)[None, :, None] // (4 + index % 5)) % 2
    frame = np.where(stripes, base, 255 - base) * np.ones((height, 1, 1))
    return frame.astype(np.uint8)


def write_video(path: Path, frames: Sequence[np.ndarray], fps: int = 4, codec: str = "mpeg4") -> Path:
    """Encode RGB frames into a real video file with PyAV."""
    import av

    height, width = frames[0].shape[:2]
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"qscale": "2"} if codec == "mpeg4" else {}
        for array in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_frame_folder(folder: Path, frames: Sequence[np.ndarray], pattern: str = "frame_{}.png") -> Path:
    """Write RGB frames as PNG images named by `pattern` (unpadded numbers, to exercise natural ordering)."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, array in enumerate(frames):
        Image.fromarray(array).save(folder / pattern.format(index))
    return folder


def write_vatex_eval(folder: Path, n_videos: int, per_video: int, n_refs: int, seed: int = 0,
                     videos_dir: Path | None = None, frames_per_video: int = 3) -> Path:
    """Write a small VATEX-EVAL release: numpy arrays pickled as EMScore's files, plus the train corpus.

    With `videos_dir`, also write one real video `<id>.mp4` per video id there.
    """
    import json
    import pickle

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    video_ids, candidates, references = [], [], []
    for v in range(n_videos):
        for c in range(per_video):
            video_ids.append(f"vid{v}")
            candidates.append(f"candidate {v}-{c} for vid{v}" + " again" * c)
            references.append([f"reference {r} of vid{v}" for r in range(n_refs)])
    n = len(candidates)
    human = rng.integers(1, 6, size=3 * n).astype(np.float64)  # annotator-major, as released
    files = {"candidates_list.pkl": np.array(candidates, dtype=object),
             "gts_list.pkl": np.array(references, dtype=object),
             "human_scores.pkl": human,
             "video_ids.pkl": np.array(video_ids, dtype=object)}
    for name, array in files.items():
        (folder / name).write_bytes(pickle.dumps(array, protocol=2))
    corpus = {"train_a": ["train caption one", "train caption two"], "train_b": ["another train caption"]}
    (folder / "vatex_train_en_annotations.json").write_text(json.dumps(corpus))
    if videos_dir is not None:
        for v in range(n_videos):
            write_video(videos_dir / f"vid{v}.mp4", [frame_array(10 * v + i) for i in range(frames_per_video)])
    return folder


def write_activitynet_foil(folder: Path, videos_dir: Path | None = None) -> Path:
    """Write a small ActivityNet-FOIL release (submissions, the two annotated paragraphs, train corpus)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    right = {"v_a": ["a man holds a ball", "a man throws a ball"], "v_b": ["a dog runs on grass"]}
    foil = {"v_a": ["a man holds a ball", "a man throws a cat"], "v_b": ["a horse runs on grass"]}
    test_1 = {"v_a": {"duration": 20.0, "timestamps": [[0, 10], [10, 20]], "sentences": right["v_a"]},
              "v_b": {"duration": 8.0, "timestamps": [[0, 2]], "sentences": right["v_b"]}}
    test_2 = {"v_a": {"duration": 20.0, "timestamps": [[0, 8], [9, 19]],
                      "sentences": ["a man picks up a ball", "he throws a ball far"]},
              "v_b": {"duration": 8.0, "timestamps": [[4, 6], [6, 8]], "sentences": ["a dog runs", "the dog sleeps"]}}
    for name, data in (("final_right_video_sentences.json", right), ("final_foil_video_sentences.json", foil)):
        results = {vid: [{"sentence": s, "timestamp": test_1[vid]["timestamps"][i]} for i, s in enumerate(sents)]
                   for vid, sents in data.items()}
        (folder / name).write_text(json.dumps({"version": "VERSION 1.0", "results": results}))
    (folder / "anet_entities_test_1.json").write_text(json.dumps(test_1))
    (folder / "anet_entities_test_2.json").write_text(json.dumps(test_2))
    long_sentence = " ".join(["word"] * 70)
    train = {"v_t": {"duration": 5.0, "timestamps": [[0, 1], [1, 2]],
                     "sentences": ["a short train sentence", long_sentence]}}
    (folder / "train.json").write_text(json.dumps(train))
    if videos_dir is not None:
        write_video(videos_dir / "v_a.mp4", [frame_array(i) for i in range(8)], fps=2)  # 4 s
        write_video(videos_dir / "v_b.mp4", [frame_array(20 + i) for i in range(4)], fps=2)
    return folder


def tau_b_by_pairs(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall tau-b by counting every pair (a second, plain implementation for the tests):
    `(concordant - discordant) / sqrt((n0 - ties_x) (n0 - ties_y))`."""
    concordant = discordant = ties_x = ties_y = 0
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            ties_x += dx == 0
            ties_y += dy == 0
            if dx * dy > 0:
                concordant += 1
            elif dx * dy < 0:
                discordant += 1
    n0 = n * (n - 1) / 2
    return (concordant - discordant) / ((n0 - ties_x) * (n0 - ties_y)) ** 0.5


def pair_accuracy_by_hand(right: Sequence[float], foil: Sequence[float]) -> float:
    """100 x share of items whose correct caption scores higher than the foil, a tie counting half."""
    wins = [1.0 if r > f else 0.5 if r == f else 0.0 for r, f in zip(right, foil)]
    return 100.0 * sum(wins) / len(wins)
