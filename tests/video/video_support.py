"""Writers of small real videos (PyAV) and frame folders for the video tests."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image


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
