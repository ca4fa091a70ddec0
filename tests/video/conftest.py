"""Fixtures of the video tests: a tiny random CLIP backbone and writers of small real videos and frame folders."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .video_support import build_tiny_backbone, frame_array, write_video


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """Keep the CPU use of the video tests small."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_backbone():
    """The tiny random backbone of the video tests (family "clip")."""
    return build_tiny_backbone()


@pytest.fixture
def make_video(tmp_path):
    """Factory: `make_video(name, n_frames, fps=4, first=0)` writes `tmp_path/name` and returns its path."""
    def factory(name: str, n_frames: int, fps: int = 4, first: int = 0, folder: Path | None = None) -> Path:
        target = (folder or tmp_path) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        return write_video(target, [frame_array(first + i) for i in range(n_frames)], fps=fps)
    return factory
