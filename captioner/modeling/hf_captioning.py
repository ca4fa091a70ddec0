"""Captions from a transformers image-to-text folder (BLIP, BLIP-2, GIT, LLaVA-style), for `pacs caption`.

A folder is a *pacs captioner* (`model.safetensors` + `captioner.json`) or a *transformers* one (`config.json`
with a `model_type`); `checkpoint_kind` tells which. A transformers folder loads offline (`local_files_only=True`,
no remote code) with `AutoModelForImageTextToText` when its `model_type` is one of that class's (blip, blip-2,
git, llava, ...), else with `AutoModelForCausalLM` when the type is a causal LM's and the folder holds an image
processor; `AutoProcessor` gives the processor. (`AutoModelForVision2Seq` no longer exists in transformers 5:
its model types are all `AutoModelForImageTextToText`'s; under transformers 4 it is the second choice.)

Decoding is the model's own `generate` (eval mode, `torch.no_grad`, `do_sample=False`, `num_beams`,
`max_new_tokens`, `min_new_tokens`). The inputs of one image are built alone and images whose inputs have
the same shapes are stacked, so a batch never pads: batching changes no caption (short of the rounding of
batched matrix products, which the tests never saw flip a token).

Prompts: BLIP gets the processor's `[CLS] prompt [SEP]` (its `generate` swaps `[CLS]` for its decoder start
and drops `[SEP]`); any other model gets the processor's tokens less a trailing end token the tokenizer appended
(GIT's `[SEP]`: a decoder-only model continues the prompt), and a processor with a chat template gets the prompt
as one user turn with the image (`add_generation_prompt=True`). The echoed prompt is stripped from the caption:
when the output starts with the input tokens exactly (decoder-only models: GIT, LLaVA) those tokens are dropped
before decoding; otherwise (BLIP) the output is decoded and the decoded prompt (the input tokens decoded with
`skip_special_tokens=True`, e.g. "a picture of" for "A picture of") is removed from its start when it is there.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pacs.captioner.modeling.hf_folder_checks import check_folder_files, check_tokenizer
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file
from pacs.metric.common.progress import FEW_STEPS, progress
from pacs.metric.models.preprocess import open_image, to_eight_bit
from pacs.metric.models.weights_only import LOAD_ERRORS, torch_load_error

logger = logging.getLogger(__name__)

PACS = "pacs"
TRANSFORMERS = "transformers"
#: model types that caption without a prompt (a prompt is optional: conditional captioning)
PROMPT_OPTIONAL = frozenset({"blip", "blip-2", "git", "vision-encoder-decoder"})
#: files that hold a transformers image processor (the condition for the AutoModelForCausalLM route)
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


@dataclass
class HFCaptionOptions:
    """Decoding settings of a transformers captioner (`min_length`: no end token before N new tokens)."""

    prompt: str | None = None
    max_new_tokens: int = 30
    beam_size: int = 5
    min_length: int = 0
    batch_size: int = 32
    device: str = "cpu"

    def validate(self) -> None:
        """InputError naming the first setting out of range."""
        for name, low in (("max_new_tokens", 1), ("beam_size", 1), ("batch_size", 1), ("min_length", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InputError(f"{name}={value!r}: must be an integer >= {low}", parameter=name)
        if self.min_length > self.max_new_tokens:
            raise InputError(f"min_length={self.min_length} is above max_new_tokens={self.max_new_tokens}",
                             parameter=("min_length", "max_new_tokens"))
        if self.prompt is not None and not self.prompt.strip():
            raise InputError("prompt= is empty: leave it out for unconditional captioning", parameter="prompt")


@dataclass
class HFCaptioner:
    """A loaded transformers captioner: model (eval mode, on its device), processor and folder facts."""

    model: Any
    processor: Any
    model_type: str
    folder: Path
    loader: str


def checkpoint_kind(folder: str | os.PathLike) -> str:
    """`"pacs"` (captioner.json) or `"transformers"` (config.json); InputError naming the folder otherwise."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"checkpoint={folder} is not a captioner checkpoint: no such folder (expected a pacs "
                         "captioner folder or a transformers image-to-text folder)", parameter="checkpoint")
    if (folder / "captioner.json").is_file():
        return PACS
    if (folder / "config.json").is_file():
        return TRANSFORMERS
    raise InputError(f"checkpoint={folder} is neither a pacs captioner folder (model.safetensors + captioner.json) "
                     "nor a transformers image-to-text folder (config.json with a model_type)", parameter="checkpoint")


def folder_model_type(folder: str | os.PathLike) -> str:
    """The `model_type` of a transformers folder's config.json (InputError naming the folder when absent)."""

    config = read_json_file(Path(folder) / "config.json", "transformers config")
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str) or not model_type:
        raise InputError(f"checkpoint={folder}: its config.json has no model_type", parameter="checkpoint")
    return model_type


def model_loader(folder: str | os.PathLike, model_type: str) -> str:
    """The transformers auto class that loads `model_type` as a captioner (InputError naming folder and type)."""
    from transformers.models.auto import modeling_auto

    if model_type in modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return "AutoModelForImageTextToText"
    if model_type in getattr(modeling_auto, "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES", {}):  # transformers 4 only
        return "AutoModelForVision2Seq"
    has_processor = any((Path(folder) / name).is_file() for name in PROCESSOR_FILES)
    if model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and has_processor:
        return "AutoModelForCausalLM"
    why = (" (a causal LM type, but the folder holds no image processor: " + " / ".join(PROCESSOR_FILES) + ")"
           if model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else "")
    raise InputError(f"checkpoint={folder}: model_type {model_type!r} is not an image-to-text model that "
                     f"transformers can load{why}; AutoModelForImageTextToText knows e.g. blip, blip-2, git, llava",
                     parameter="checkpoint")


def check_folder(folder: str | os.PathLike, prompt: str | None) -> tuple[str, str]:
    """(model_type, auto class) of a transformers folder, refused before loading when unknown, missing a prompt or
    failing a check of `pacs.captioner.modeling.hf_folder_checks` (sizes, token ids, weights, tokenizer, files)."""
    model_type = folder_model_type(folder)
    loader = model_loader(folder, model_type)
    check_folder_files(folder)
    check_prompt(folder, model_type, prompt)
    return model_type, loader


def load_hf_captioner(folder: str | os.PathLike, device: str = "cpu") -> HFCaptioner:
    """Load a transformers image-to-text folder offline (`local_files_only=True`, no remote code), in eval mode."""
    import transformers

    folder = Path(folder)
    model_type = folder_model_type(folder)
    loader = model_loader(folder, model_type)
    check_folder_files(folder)  # sizes, token ids, weights, tokenizer and files, before anything is built
    try:
        processor = transformers.AutoProcessor.from_pretrained(folder, local_files_only=True,
                                                               trust_remote_code=False)
        if getattr(processor, "tokenizer", None) is not None:
            check_tokenizer(folder, processor.tokenizer)
        model = getattr(transformers, loader).from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except InputError:
        raise
    except LOAD_ERRORS as error:  # a pytorch_model.bin that torch.load(weights_only=True) refused: nothing ran
        bins = sorted(folder.glob("pytorch_model*.bin"))
        raise torch_load_error(bins[0] if len(bins) == 1 else folder, error, parameter="checkpoint") from None
    except (OSError, ValueError, KeyError, ImportError, AttributeError, TypeError) as error:
        # ImportError: a quantization method's package; AttributeError / TypeError: a file of the wrong JSON shape
        raise InputError(f"checkpoint={folder}: transformers cannot load this {model_type} folder: "
                         f"{(str(error).strip() or type(error).__name__).splitlines()[0]}",
                         parameter="checkpoint") from None
    if getattr(processor, "tokenizer", None) is None:
        raise InputError(f"checkpoint={folder}: its processor ({type(processor).__name__}) has no tokenizer to "
                         "decode captions with", parameter="checkpoint")
    model.to(device).eval()
    logger.info("loaded %s (%s, model_type %s) with %s", folder, type(model).__name__, model_type, loader)
    return HFCaptioner(model, processor, model_type, folder, loader)


def check_prompt(folder: str | os.PathLike, model_type: str, prompt: str | None) -> None:
    """InputError when an instruction-tuned model (a type outside `PROMPT_OPTIONAL`) gets no prompt."""
    if prompt is None and model_type not in PROMPT_OPTIONAL:
        raise InputError(f"checkpoint={folder}: model_type {model_type!r} is an instruction-tuned model: pass "
                         "prompt= (e.g. \"Describe the image in one sentence.\")", parameter=("checkpoint", "prompt"))


def prompt_text(captioner: HFCaptioner, prompt: str | None) -> str | None:
    """The text given to the processor: the prompt, as one chat turn with the image when there is a template."""
    check_prompt(captioner.folder, captioner.model_type, prompt)
    if prompt is None:
        return None
    if getattr(captioner.processor, "chat_template", None):
        turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        return captioner.processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    return prompt


def _drop_appended_end(captioner: HFCaptioner, inputs: dict[str, Any], text: str) -> dict[str, Any]:
    """Remove an end token the tokenizer appended to the prompt (not for BLIP, whose generate drops it)."""
    tokenizer = captioner.processor.tokenizer
    ids = inputs.get("input_ids")
    if captioner.model_type == "blip" or ids is None or ids.shape[-1] < 2:
        return inputs
    ends = {tokenizer.sep_token_id, tokenizer.eos_token_id} - {None}
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    if int(ids[0, -1]) in ends and (not plain or plain[-1] != int(ids[0, -1])):
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            if key in inputs and torch.is_tensor(inputs[key]) and inputs[key].shape[-1] == ids.shape[-1]:
                inputs[key] = inputs[key][..., :-1]
    return inputs


def model_inputs(model: Any) -> frozenset[str]:
    """The input names the model's `forward` and `generate` take by name."""
    import inspect

    return frozenset(name for method in (model.forward, model.generate)
                     for name in inspect.signature(method).parameters)


def encode_image(captioner: HFCaptioner, image: Any, text: str | None) -> dict[str, Any]:
    """The processor's inputs of one image (batch of 1), with the prompt `text` when there is one.

    Outputs the model does not take (GIT's `token_type_ids` from a BERT tokenizer) are left out.
    """
    kwargs: dict[str, Any] = {"images": [image], "return_tensors": "pt"}
    if text is not None:
        kwargs["text"] = [text]
    try:
        inputs = dict(captioner.processor(**kwargs))
    except (ValueError, TypeError) as error:
        raise InputError(f"checkpoint={captioner.folder}: its processor refused the prompt {text!r}: "
                         f"{str(error).splitlines()[0]}", parameter=("checkpoint", "prompt")) from None
    except BaseException as error:  # a panic of the Rust tokenizer (a BaseException) on this prompt
        if type(error).__name__ != "PanicException":
            raise
        raise InputError(f"checkpoint={captioner.folder}: its tokenizer failed on the prompt {text!r} (a panic in "
                         f"the tokenizers library): {str(error).splitlines()[0]}", parameter="checkpoint") from None
    accepted = model_inputs(captioner.model)
    inputs = {key: value for key, value in inputs.items() if key in accepted}
    return _drop_appended_end(captioner, inputs, text) if text is not None else inputs


def _signature(inputs: Mapping[str, Any]) -> tuple:
    """What must be equal for two images' inputs to be stacked without padding (shapes, dtypes, other values)."""
    return tuple(sorted((key, (tuple(value.shape), str(value.dtype)) if torch.is_tensor(value) else repr(value))
                        for key, value in inputs.items()))


def stack_without_padding(encoded: Sequence[Mapping[str, Any]]) -> list[tuple[list[int], dict[str, Any]]]:
    """Groups `(positions, stacked inputs)` of the inputs with one signature, in order of first appearance."""
    groups: dict[tuple, list[int]] = {}
    for position, inputs in enumerate(encoded):
        groups.setdefault(_signature(inputs), []).append(position)
    stacked = []
    for positions in groups.values():
        first = encoded[positions[0]]
        stacked.append((positions, {key: torch.cat([encoded[p][key] for p in positions]) if torch.is_tensor(value)
                                    else value for key, value in first.items()}))
    return stacked


def strip_prompt(captioner: HFCaptioner, output: torch.Tensor, input_ids: torch.Tensor | None) -> str:
    """Decode one generated sequence without the prompt it echoes (see the module docstring)."""
    tokenizer = captioner.processor.tokenizer
    if input_ids is None:
        return tokenizer.decode(output, skip_special_tokens=True).strip()
    n = input_ids.shape[-1]
    if output.shape[-1] >= n and torch.equal(output[:n].cpu(), input_ids.cpu()):
        return tokenizer.decode(output[n:], skip_special_tokens=True).strip()
    text = tokenizer.decode(output, skip_special_tokens=True).strip()
    echoed = tokenizer.decode(input_ids, skip_special_tokens=True).strip()
    return text[len(echoed):].strip() if echoed and text.startswith(echoed) else text


def read_rgb(path: str | os.PathLike) -> Any:
    """An image as pacs reads it everywhere (16-bit scaled to 8 bits, alpha dropped, no EXIF rotation), RGB."""

    return to_eight_bit(open_image(path)).convert("RGB")


def generate_captions(captioner: HFCaptioner, images: Mapping[Any, str | os.PathLike],
                      options: HFCaptionOptions) -> dict[Any, str]:
    """Caption `images` ({id: path}) with the model's own `generate` (deterministic), the echoed prompt stripped."""
    options.validate()
    text = prompt_text(captioner, options.prompt)
    device = next(captioner.model.parameters()).device
    settings = {"num_beams": options.beam_size, "max_new_tokens": options.max_new_tokens, "do_sample": False}
    if options.min_length:
        settings["min_new_tokens"] = options.min_length
    ids = list(images)
    captions: dict[Any, str] = {}
    starts = range(0, len(ids), options.batch_size)  # a monitor's few batches get no bar (it would flash by)
    for start in progress(starts, desc="captioning", leave=False, disable=len(starts) < FEW_STEPS):
        chunk = ids[start:start + options.batch_size]
        encoded = [encode_image(captioner, read_rgb(images[image_id]), text) for image_id in chunk]
        for positions, inputs in stack_without_padding(encoded):
            inputs = {key: value.to(device) if torch.is_tensor(value) else value for key, value in inputs.items()}
            prompt_ids = inputs.get("input_ids")
            prompt_ids = prompt_ids.clone() if prompt_ids is not None else None  # BLIP's generate edits its input
            with torch.no_grad():
                outputs = captioner.model.generate(**inputs, **settings)
            for row, position in enumerate(positions):
                given = prompt_ids[row] if prompt_ids is not None else None
                captions[chunk[position]] = strip_prompt(captioner, outputs[row], given)
    return {image_id: captions[image_id] for image_id in ids}
