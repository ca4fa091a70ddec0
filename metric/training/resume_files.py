"""Resume states are read without unpickling arbitrary objects (docs/train_metric.md "Resuming safely").

A training state folder written by accelerate's `save_state` holds pickle-based files (`optimizer.bin`,
`scheduler.bin`, `random_states_<rank>.pkl`, pacs's `extra_state_<rank>.pt`) next to safetensors and JSON.
accelerate 1.x reads the model, optimizer, scheduler and RNG files with `torch.load(weights_only=True)` but
swallows any error of the RNG file (the run would resume with other random numbers), and it reads objects
registered with `register_for_checkpointing` (`custom_checkpoint_<n>.pkl`) with `weights_only=False`, which
runs whatever the pickle says. pacs therefore registers no object with accelerate (its own trainer state is JSON +
safetensors; with no registered object, accelerate raises on a `custom_checkpoint_<n>.pkl` before it would read
it), never passes `load_kwargs`, and checks every file of a folder before accelerate reads it: each pickle-based
file with `torch.load(weights_only=True)` (a file holding anything but tensors, numbers, strings and plain
containers, or numpy's RNG arrays, is refused in one line naming it, and nothing in it runs), JSON and
safetensors files for being readable.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file
from pacs.metric.models.weights_only import quiet_pickle_protocol_warning, torch_load_error

#: suffixes of the files of a state folder that torch reads as pickles (everything else is JSON or safetensors)
PICKLE_SUFFIXES = frozenset({".bin", ".pkl", ".pt", ".pth"})
#: keys accelerate's `random_states_<rank>.pkl` must hold for a bit-exact resume (it ignores the file otherwise)
RNG_KEYS = ("random_state", "numpy_random_seed", "torch_manual_seed")
#: a state file that pacs 0.5 wrote and accelerate would read with weights_only=False
CUSTOM_CHECKPOINT_PREFIX = "custom_checkpoint_"


def check_resume_step(step: Any, path: str | os.PathLike, max_steps: int | None = None) -> int:
    """`step` read from the resume state file `path`; InputError naming the file unless it is an integer in
    `0..max_steps` (the run's step count; `0..` when None): a state claiming step 10**12 would end the stage with
    the weights of an early step, and step -5 would train from -5."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0 or (max_steps is not None and step > max_steps):
        top, limit = ("", "a count of steps") if max_steps is None else (max_steps, f"this run's {max_steps} steps")
        raise InputError(f"{os.fspath(path)}: step {step!r} is outside 0..{top} ({limit}): the resume state was "
                         "altered, or written by a run with more steps; remove it, or resume from another one")
    return step


@contextmanager
def _numpy_rng_globals() -> Iterator[None]:
    """Allow numpy's RNG-state arrays (accelerate's own allow-list) for the length of the block."""
    import torch
    from accelerate.utils.other import TORCH_SAFE_GLOBALS

    with torch.serialization.safe_globals(list(TORCH_SAFE_GLOBALS)), quiet_pickle_protocol_warning():
        yield


def load_weights_only(path: str | os.PathLike, mmap: bool = False) -> Any:
    """`torch.load(path, weights_only=True)` on the CPU; InputError naming the file when it is refused or unreadable."""
    import torch

    try:
        with _numpy_rng_globals():
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:  # noqa: BLE001 - torch.load raises many types for unsafe / corrupt files
        raise torch_load_error(path, error) from None


def check_state_folder(folder: str | os.PathLike) -> None:
    """Refuse, in one line naming the file, a state folder that accelerate's `load_state` could not read safely.

    Every pickle-based file is loaded once with `torch.load(weights_only=True)` (memory-mapped: no tensor data is
    copied); an RNG file must hold the states accelerate restores; a `custom_checkpoint_<n>.pkl` (which accelerate
    reads with `weights_only=False`) is refused outright; JSON files must parse and safetensors headers be readable.
    """
    folder = Path(folder)
    for path in sorted(folder.iterdir()):
        if path.name.startswith(CUSTOM_CHECKPOINT_PREFIX):
            raise InputError(f"{path}: a pickled trainer state (pacs 0.5 or another program), which pacs does not "
                             "load: pacs 0.6 keeps its trainer state in trainer_state.json + safetensors; start "
                             "the run again")
        if not path.is_file():
            continue
        if path.suffix == ".json":
            read_json_file(path, "training state")
            continue
        if path.suffix == ".safetensors":
            _check_safetensors(path)
            continue
        if path.suffix not in PICKLE_SUFFIXES:
            continue
        data = load_weights_only(path, mmap=_zip_file(path))
        if path.name.startswith("random_states_"):
            missing = [key for key in RNG_KEYS if not isinstance(data, dict) or key not in data]
            if missing:
                raise InputError(f"{path}: not an accelerate RNG state (lacks {', '.join(missing)}): the random "
                                 "numbers of the interrupted run cannot be restored")


def _check_safetensors(path: Path) -> None:
    """InputError naming `path` when its safetensors header cannot be read (tensor data is not read)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            handle.keys()
    except Exception as error:  # noqa: BLE001 - safetensors raises several types for corrupt files
        raise InputError(f"{path}: not a readable safetensors file ({str(error).splitlines()[0]})") from None


def _zip_file(path: Path) -> bool:
    """True for torch's zip format (memory-mappable); the legacy format is read whole."""
    with open(path, "rb") as handle:
        return handle.read(4) == b"PK\x03\x04"
