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


#: modules whose parameters autocast casts to the low dtype on every call (their ops are on its low-precision list)
_AUTOCAST_MODULES = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
#: parameters held bare by a module and used only in a linear / matmul (open_clip's attention and projections)
_AUTOCAST_PARAMETERS = frozenset({"in_proj_weight", "in_proj_bias", "q_proj_weight", "k_proj_weight",
                                  "v_proj_weight", "proj", "text_projection"})


def cast_frozen_weights(model: torch.nn.Module, dtype: str) -> int:
    """Cast, in place and once, the weights that autocast to `dtype` would cast again on every call; the count.

    Autocast keeps a cast only for leaves that require grad, so a frozen model's fp32 Linear / conv weights are
    copied to bf16 at every forward pass (a torch.profiler trace of a bf16 scoring call: 46 such copies). Cast
    beforehand, they are the same bf16 values autocast would make, so the outputs are unchanged bit for bit; the
    parameters that meet other ops (embeddings, LayerNorm, class and positional embeddings, attention's bias_k /
    bias_v) stay fp32 as autocast's type promotion expects, and so do `nn.MultiheadAttention`'s in-projections
    (the module takes its fused kernel only when they match the query's dtype: another kernel, other roundings;
    its `out_proj` is a Linear and is cast), and so does the first block's `mlp.c_fc` of an open_clip transformer
    (its `get_cast_dtype`). Only for a model nobody else runs in fp32.
    """
    if dtype == "fp32":
        return 0
    low = DTYPES[dtype]
    # open_clip's transformers take their residual stream's dtype from the first block's c_fc weight
    # (`get_cast_dtype`): cast, it would turn the whole stream bf16
    kept = {id(module.resblocks[0].mlp.c_fc) for module in model.modules()
            if callable(getattr(module, "get_cast_dtype", None)) and _first_c_fc(module) is not None}
    cast = 0
    for module in model.modules():
        if isinstance(module, torch.nn.MultiheadAttention) or id(module) in kept:
            continue  # its fused fast path is chosen by query dtype == in_proj dtype: casting would switch kernels
        names = [name for name, _ in module.named_parameters(recurse=False)
                 if isinstance(module, _AUTOCAST_MODULES) or name in _AUTOCAST_PARAMETERS]
        for name in names:
            parameter = getattr(module, name)
            if parameter.is_floating_point() and parameter.dtype != low:
                parameter.data = parameter.data.to(low)
                cast += 1
    return cast


def _first_c_fc(module: torch.nn.Module) -> torch.nn.Module | None:
    blocks = getattr(module, "resblocks", None)
    return getattr(getattr(blocks[0], "mlp", None), "c_fc", None) if blocks is not None and len(blocks) else None


def weights_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The low dtype of the model's Linear / conv weights if any is not fp32 (e.g. cast), else fp32; None: none."""
    found = [module.weight.dtype for module in model.modules() if isinstance(module, _AUTOCAST_MODULES)]
    return next((dtype for dtype in found if dtype != torch.float32), found[0] if found else None)
