"""Compute precision of the towers: "fp32" (default, no autocast), "bf16" or "fp16" (`torch.autocast`)."""
from __future__ import annotations

import contextlib
import hashlib

import torch

from pacs.metric.common.errors import InputError

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_dtype(dtype: str | torch.dtype | None) -> str:
    """The canonical name ("fp32", "bf16", "fp16") of a compute dtype given by name or torch dtype; None is fp32."""
    if dtype is None:
        return "fp32"
    if isinstance(dtype, torch.dtype):
        for name, value in DTYPES.items():
            if value == dtype:
                return name
    elif str(dtype).strip().lower() in DTYPES:
        return str(dtype).strip().lower()
    raise InputError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")


def precision_context(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """`torch.autocast(device.type, dtype)` for bf16/fp16; no context at all for fp32."""
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[dtype])


def dtype_fingerprint(fingerprint: str, dtype: str) -> str:
    """The model fingerprint of embeddings computed in `dtype`: unchanged for fp32, sha256(fp|dtype) otherwise."""
    if dtype == "fp32":
        return fingerprint
    return hashlib.sha256(f"{fingerprint}|dtype={dtype}".encode()).hexdigest()
