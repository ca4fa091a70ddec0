"""LoRA under bf16 autocast (issue 43 item 4): no fp32 copies of the inputs, the same scores; merged = unmerged."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch
from PIL import Image

from pacs.metric.models.lora import attach_lora, merge_lora, no_input_casting

IMAGES = [Image.new("RGB", (64, 64), colour) for colour in ("red", "green", "navy", "white")]
CAPTIONS = ["a red square", "a green field", "a dark blue night", "snow"]



def _lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [module for module in model.modules() if hasattr(module, "cast_input_dtype_enabled")]


def _scores(backbone, dtype: str) -> np.ndarray:
    from pacs.metric.scoring.scorer import Scorer

    return Scorer(backbone, progress=False, dtype=dtype, workers=0).score(IMAGES, CAPTIONS).scores


def test_lora_layers_feed_their_adapters_the_input_as_it_comes(adapted):
    layers = _lora_layers(adapted.model)
    assert layers and not any(layer.cast_input_dtype_enabled for layer in layers)
    seen: list[tuple[torch.dtype, torch.dtype]] = []
    handles = []
    for layer in layers:
        outer: dict[str, torch.dtype] = {}
        handles.append(layer.register_forward_pre_hook(lambda _m, args, outer=outer: outer.update(x=args[0].dtype)))
        handles.append(layer.lora_A["default"].register_forward_pre_hook(
            lambda _m, args, outer=outer: seen.append((outer["x"], args[0].dtype))))
    try:
        _scores(adapted, "bf16")
    finally:
        for handle in handles:
            handle.remove()
    assert (torch.bfloat16, torch.bfloat16) in seen  # some layers get bf16 inputs under autocast ...
    assert all(inner == outer for outer, inner in seen)  # ... and none is copied to fp32 on its way to the adapter


def test_skipping_the_copy_changes_no_score(adapted):
    fast = _scores(adapted, "bf16")
    for layer in _lora_layers(adapted.model):
        layer.cast_input_dtype_enabled = True  # peft's default: bf16 -> fp32 -> (autocast) bf16, the same values
    slow = _scores(adapted, "bf16")
    assert np.array_equal(fast, slow)
    assert no_input_casting(adapted.model) == len(_lora_layers(adapted.model))


def test_merged_weights_score_as_the_adapter_does(adapted):
    unmerged = {dtype: _scores(adapted, dtype) for dtype in ("fp32", "bf16")}
    merged_backbone = merge_lora(dataclasses.replace(adapted, model=copy.deepcopy(adapted.model)))
    merged = {dtype: _scores(merged_backbone, dtype) for dtype in ("fp32", "bf16")}
    # fp32: W + BA folded once instead of x·W + (x·A)·B: float rounding only
    np.testing.assert_allclose(merged["fp32"], unmerged["fp32"], rtol=0, atol=1e-5)
    # bf16: within the documented bf16 deviation from fp32 (docs/performance.md: max |Δ score| 2.5e-2, fixture A)
    assert np.abs(merged["bf16"] - unmerged["fp32"]).max() <= 2.5e-2
    assert np.abs(merged["bf16"] - unmerged["bf16"]).max() <= 2.5e-2
    assert not np.array_equal(unmerged["fp32"], _scores(dataclasses.replace(adapted, model=adapted.model.unload()),
                                                        "fp32"))  # the adapter does change the scores


def test_dropout_zero_takes_the_no_dropout_path(tiny_backbone):
    backbone = dataclasses.replace(tiny_backbone, model=copy.deepcopy(tiny_backbone.model))
    adapted = attach_lora(backbone, rank=2, dropout=0.0)
    dropouts = [layer.lora_dropout["default"] for layer in _lora_layers(adapted.model)]
    assert dropouts and all(isinstance(module, torch.nn.Identity) for module in dropouts)
