"""The demo on a GPU machine (issue 30 item 1): its stages build every Accelerator with the process state's flags.

On an H200, `accelerate launch recipes/scst_pacs.py --config recipes/configs/demo_smoke.yaml` stopped at stage
`pacs` with accelerate's "AcceleratorState has already been initialized and cannot be changed ... pass cpu=True"
because the metric stages built their trainer with `cpu=True` after the process state was set up on CUDA. On a
CPU-only machine both agree, so the test makes accelerate's one consistency check (`_check_initialized`) see what
it sees on a GPU machine: a state set up without `cpu=True` is on `cuda:0` there. The tensors stay on the CPU.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState, PartialState

from pacs.captioner.demo.pipeline import REPO_CONFIGS, run_demo


@pytest.fixture
def gpu_like_state(monkeypatch):
    """A fresh accelerate state whose consistency check sees the device a GPU machine would give it."""
    saved = [(cls, dict(cls._shared_state)) for cls in (PartialState, AcceleratorState, GradientState)]
    for cls, _ in saved:
        cls._shared_state.clear()
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    check = AcceleratorState._check_initialized
    seen = []

    def as_on_a_gpu(self, mixed_precision=None, cpu=None):
        seen.append(cpu)
        real = self.__dict__.get("device")
        swap = self.initialized and real is not None and not self.__dict__.get("_cpu", False)
        if swap:  # (a state not yet initialised must stay equal to PartialState's: `initialized` compares them)
            self.__dict__["device"] = torch.device("cuda", 0)  # where PartialState(cpu=False) is on a GPU machine
        try:
            return check(self, mixed_precision, cpu)
        finally:
            if swap:
                self.__dict__["device"] = real

    monkeypatch.setattr(AcceleratorState, "_check_initialized", as_on_a_gpu)
    yield seen
    for cls, state in saved:
        cls._shared_state.clear()
        cls._shared_state.update(state)


@pytest.mark.slow
def test_the_demos_metric_stages_run_on_a_gpu_state(tmp_path: Path, gpu_like_state) -> None:
    result = run_demo(str(REPO_CONFIGS / "demo_smoke.yaml"), [f"runs_dir={tmp_path}", "threads=1", "captioning=false"])
    assert {"clip", "pacs"} <= set(result["ran"])
    assert len(gpu_like_state) >= 2 and not any(gpu_like_state)  # both trainers: no Accelerator asked for cpu=True
    assert not PartialState._shared_state["_cpu"]  # the demo left the state where accelerate put it (device auto)
