"""One device rule for every command, recipe stage and demo stage.

A device is `auto` (the default everywhere: accelerate's process device, `cuda:<local rank>` under
`accelerate launch`, else `cuda:0`, `mps` or `cpu`) or an explicit torch device (`cpu`, `cuda`, `cuda:N`, `mps`),
checked here: an unknown name, `cuda` on a machine without a GPU, or a mixed precision the device cannot run is one
`InputError` line (exit 2 at the command line).

accelerate keeps one process-wide state: its device is fixed by the first `PartialState` / `Accelerator` of the
process, and an `Accelerator(cpu=True)` built after the state was set up on a GPU raises. So the state is created
in one place (`process_state`), and trainers build their `Accelerator` through `build_accelerator`, which never
passes flags of its own: every Accelerator of a run agrees with the process state.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pacs.metric.common.errors import InputError

if TYPE_CHECKING:  # torch and accelerate load only when a device is resolved
    import torch
    from accelerate import Accelerator, PartialState

AUTO = "auto"
DEVICE_HELP = ("torch device: auto (default: accelerate's process device, cuda:<local rank>, mps or cpu), cpu, "
               "cuda, cuda:N or mps")
KNOWN_TYPES = ("cpu", "cuda", "mps")
#: mixed-precision names: accelerate's (`no`, `bf16`, `fp16`) and the Scorer's (`fp32`, `bf16`, `fp16`)
FULL_PRECISION = ("no", "fp32")


def is_auto(device: object) -> bool:
    """Whether `device` asks for the process's device (`auto`, empty or None)."""
    return device is None or str(device).strip().lower() in ("", AUTO)


def _wants_cpu(device: object) -> bool:
    from accelerate.utils import parse_flag_from_env

    return (not is_auto(device) and check_device(device).type == "cpu") or parse_flag_from_env("ACCELERATE_USE_CPU")


def process_state(device: object = AUTO) -> PartialState:
    """accelerate's process state, created here on first use (on the CPU for `device` cpu or `ACCELERATE_USE_CPU`).

    Asking for the CPU once the state was set up on another device (by `accelerate launch` or an earlier stage of
    this process) is an `InputError`: accelerate cannot move a process's state.
    """
    from accelerate import PartialState

    wants_cpu = _wants_cpu(device)
    state = PartialState(cpu=wants_cpu)  # an already initialised state ignores the flag: checked below
    if wants_cpu and state.device.type != "cpu":
        raise InputError(f"device cpu: this process's accelerate state is already on {state.device} (set up by "
                         "`accelerate launch` or an earlier stage); use device auto, or start the process with "
                         "ACCELERATE_USE_CPU=1 (`accelerate launch --cpu`)", parameter="device")
    return state


def check_device(device: object) -> torch.device:
    """An explicit device as a `torch.device`, refused (InputError) when unknown or absent on this machine."""
    import torch

    text = str(device).strip()
    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        parsed = None
    if parsed is None or parsed.type not in KNOWN_TYPES:
        raise InputError(f"device={text!r}: unknown device (expected auto, cpu, cuda, cuda:N or mps)",
                         parameter="device")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device={text!r}: no CUDA GPU is available on this machine (use device auto or cpu)",
                             parameter="device")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise InputError(f"device={text!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s) "
                             f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})", parameter="device")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"device={text!r}: MPS is not available on this machine (use device auto or cpu)",
                         parameter="device")
    return parsed


def resolve_device(device: object = AUTO) -> str:
    """The device to use: `auto` (or None / empty) → the process state's device; an explicit one, checked."""
    if is_auto(device):
        return str(process_state().device)
    return str(check_device(device))


def check_precision(precision: str | None, device: object, setting: str = "mixed_precision") -> None:
    """Refuse (InputError) a mixed precision `device` cannot run: bf16 on a GPU without bfloat16, fp16 on the CPU.

    `precision` is accelerate's name (`no`, `bf16`, `fp16`) or the Scorer's (`fp32`, ...); full precision always
    passes. `setting` names the option in the message.
    """
    import torch

    if precision is None or str(precision) in FULL_PRECISION:
        return
    where = torch.device(resolve_device(device))
    if precision == "bf16" and where.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise InputError(f"{setting}=bf16: {torch.cuda.get_device_name(where)} ({where}) has no bfloat16 support "
                         f"(use fp16 or {FULL_PRECISION[0] if setting == 'mixed_precision' else 'fp32'})",
                         parameter=setting)
    if precision == "fp16" and where.type == "cpu" and setting == "mixed_precision":
        raise InputError(f"{setting}=fp16: accelerate does not autocast to float16 on the CPU (use bf16 or no)",
                         parameter=setting)


def accelerator_state(device: object = AUTO) -> PartialState:
    """The process state a trainer must run on for `device` (auto: whatever the state is; explicit: must match it)."""
    state = process_state(device)
    if not is_auto(device):
        wanted = check_device(device)
        if wanted.type != state.device.type or (wanted.index is not None and wanted.index != state.device.index):
            raise InputError(f"device={device!r}: this process's accelerate state is on {state.device}, and a "
                             "trainer runs where accelerate puts it; use device auto (choose the GPU with "
                             "CUDA_VISIBLE_DEVICES or `accelerate launch`)", parameter="device")
    return state


def build_accelerator(device: object = AUTO, mixed_precision: str = "no", **kwargs: Any) -> Accelerator:
    """An `Accelerator` on the process state's device (checked against `device`), with the state's flags.

    No `cpu=` flag is passed: the device was fixed when the state was created (`process_state`), so this can
    never contradict it. `mixed_precision` is checked against the device first (`check_precision`); a single
    process may change it between trainings (`allow_new_precision`).
    """
    from accelerate import Accelerator

    state = accelerator_state(device)
    check_precision(mixed_precision, state.device)
    allow_new_precision(mixed_precision)
    return Accelerator(mixed_precision=mixed_precision, **kwargs)


def allow_new_precision(mixed_precision: str) -> None:
    """Let a single-process caller run several trainings with different precisions in one Python process.

    accelerate keeps one process-wide state and refuses a second Accelerator with another mixed precision; when
    nothing is distributed that part of the state is safe to drop (the device, `PartialState`, is kept; under
    `accelerate launch` with several processes it is kept and must match).
    """
    from accelerate.state import AcceleratorState, PartialState

    shared = AcceleratorState._shared_state
    if shared and shared.get("_mixed_precision") != mixed_precision and PartialState().num_processes == 1:
        AcceleratorState._reset_state()


def autocast_dtype(precision: str | None) -> torch.dtype | None:
    """The autocast dtype of a precision name (bf16 / fp16), None for full precision."""
    import torch

    if precision is None or str(precision) in FULL_PRECISION:
        return None
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    if precision not in dtypes:
        raise InputError(f"precision={precision!r}: expected no/fp32, bf16 or fp16", parameter="precision")
    return dtypes[precision]
