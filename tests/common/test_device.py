"""The one device rule (pacs.metric.common.device, issue 30 item 1): auto is accelerate's process device, an explicit
device is checked (unknown, `cuda` without a GPU, bf16 on a GPU without it: one line, exit 2), and every
Accelerator is built with the process state's flags."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState, PartialState
from PIL import Image

from pacs import cli as pacs_cli
from pacs.metric.common import device as devices
from pacs.metric.common.errors import InputError


@pytest.fixture
def fresh_state():
    """accelerate's process-wide state emptied for the test and put back afterwards (other tests' state kept)."""
    saved = [(cls, dict(cls._shared_state)) for cls in (PartialState, AcceleratorState, GradientState)]
    for cls, _ in saved:
        cls._shared_state.clear()
    yield
    for cls, state in saved:
        cls._shared_state.clear()
        cls._shared_state.update(state)


def test_auto_is_the_process_states_device(fresh_state) -> None:
    assert devices.resolve_device("auto") == str(PartialState().device)
    assert devices.resolve_device(None) == devices.resolve_device("") == str(PartialState().device)


def test_explicit_devices_are_checked() -> None:
    assert devices.resolve_device("cpu") == "cpu"
    for bad in ("gpu", "cuda:x", "meta", "tpu0"):
        with pytest.raises(InputError, match=r"unknown device \(expected auto, cpu, cuda, cuda:N or mps\)"):
            devices.check_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_refused() -> None:
    with pytest.raises(InputError, match="device='cuda': no CUDA GPU is available on this machine"):
        devices.resolve_device("cuda")
    with pytest.raises(InputError, match="no CUDA GPU"):
        devices.check_device("cuda:1")


def test_bf16_on_a_gpu_without_bfloat16_and_fp16_training_on_the_cpu_are_refused(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100")
    with pytest.raises(InputError, match=r"mixed_precision=bf16: Tesla V100 \(cuda:0\) has no bfloat16 support"):
        devices.check_precision("bf16", "cuda:0")
    with pytest.raises(InputError, match="dtype=bf16: Tesla V100"):
        devices.check_precision("bf16", "cuda", setting="dtype")
    with pytest.raises(InputError, match="this machine has 1 CUDA GPU"):
        devices.check_device("cuda:3")
    devices.check_precision("fp16", "cuda:0")  # float16 runs on any CUDA GPU
    devices.check_precision("no", "cuda:0")
    devices.check_precision("bf16", "cpu")  # CPU autocast knows bfloat16
    with pytest.raises(InputError, match="mixed_precision=fp16: accelerate does not autocast to float16 on the CPU"):
        devices.check_precision("fp16", "cpu")


def test_cpu_after_the_state_was_set_up_elsewhere_is_one_line(fresh_state, monkeypatch) -> None:
    PartialState()
    monkeypatch.setitem(PartialState._shared_state, "device", torch.device("cuda", 0))  # as a GPU machine's
    with pytest.raises(InputError, match=r"device cpu: this process's accelerate state is already on cuda:0"):
        devices.process_state("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(InputError, match=r"device='cuda:1': this process's accelerate state is on cuda:0"):
        devices.accelerator_state("cuda:1")
    assert devices.accelerator_state("cuda").device == torch.device("cuda", 0)  # any index: the state's


def test_accelerators_are_built_with_the_state_flags(fresh_state) -> None:
    state = devices.process_state("cpu")
    accelerator = devices.build_accelerator("cpu", "no")
    assert accelerator.device == state.device == torch.device("cpu")
    assert accelerator.mixed_precision == "no"


def test_a_bad_device_at_the_command_line_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (8, 8)).save(images / "1.png")
    code = pacs_cli.main(["caption", "--checkpoint", str(tmp_path / "none"), "--images", str(images),
                          "--out", str(tmp_path / "out.json"), "--device", "gpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "unknown device" in err[0] and "'gpu'" in err[0], err
    assert not (tmp_path / "out.json").exists()
