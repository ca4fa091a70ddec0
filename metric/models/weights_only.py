"""A torch file that `torch.load(..., weights_only=True)` refuses is one InputError naming it.

pacs reads torch pickles (official checkpoints, `--backbone NAME/FILE.pt`, a peft adapter's
`adapter_model.bin`) only with `weights_only=True`: tensors and plain containers. A file that needs anything
else (an `os.system` reference, a class of its own) is refused by torch with a long `pickle.UnpicklingError`
whose advice is to unpickle it anyway; pacs never does, and says so in one line instead.
"""
from __future__ import annotations

import os
import pickle
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from pacs.metric.common.errors import InputError

_REFUSED = "Weights only load failed"
_GLOBAL = re.compile(r"GLOBAL ([A-Za-z_][\w.]*)")
#: what torch.load raises for a file it cannot unpickle (besides the refusal itself)
LOAD_ERRORS = (pickle.UnpicklingError, EOFError)


def _first_line(error: BaseException) -> str:
    """The first line of an error message, ANSI escapes removed (torch colours some of its advice)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()
    return text.splitlines()[0] if text else type(error).__name__


def is_weights_only_refusal(error: BaseException) -> bool:
    """True when `error` is torch's refusal of a pickle that holds more than tensors and plain containers."""
    return isinstance(error, pickle.UnpicklingError) and _REFUSED in str(error)


def torch_load_error(path: str | os.PathLike, error: BaseException,
                     parameter: str | Sequence[str] | None = None) -> InputError:
    """The InputError for a torch file that `torch.load(weights_only=True)` refused or could not read."""
    if is_weights_only_refusal(error):
        found = _GLOBAL.search(str(error))
        holds = f" (it references {found.group(1)})" if found else ""
        return InputError(f"{path}: not a weights-only checkpoint{holds}: it holds Python objects other than "
                          "tensors and plain containers, and pacs never unpickles arbitrary objects (save a plain "
                          "state dict, or a .safetensors file)", parameter=parameter)
    return InputError(f"{path}: not a readable torch checkpoint ({_first_line(error)})", parameter=parameter)


@contextmanager
def quiet_pickle_protocol_warning() -> Iterator[None]:
    """Silence torch's "Detected pickle protocol N" warning (the refusal, if any, is reported as one error)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        yield
