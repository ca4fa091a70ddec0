"""A transformers image-to-text folder (BLIP, GIT, LLaVA-style) as an SCST / XE policy (`pacs.captioner.modeling.policy`).

Inputs follow `pacs caption` (`pacs.captioner.modeling.hf_captioning`): the processor's inputs of each image, the
prompt as `pacs caption` gives it. Every caption continues a *prefix* of token ids, the one the model's own
`generate` starts from: BLIP's `[bos] prompt` (its `[CLS]` swapped for the decoder start, the `[SEP]` dropped);
any other model's prompt tokens less an appended end token, or `[bos]` without a prompt. The prefix is never part
of a caption (the echo rule of `pacs caption`), so token ids `[B, k, T]` are the continuation only, ending with
the end token (BLIP: `sep_token_id`; otherwise the generation config's `eos_token_id`) and padded with it.

`token_log_probs` runs the model on `prefix + caption` and reads the logits of the caption's positions (the last
`T + 1` positions of the output, less one: GIT prepends image tokens, LLaVA expands them inside the ids), so the
end token's log-probability is in every sum. Dropout is switched off in the whole model when the policy is built
(as TRL does for RL fine-tuning): the samples, the log-probabilities and their gradients do not depend on which
process or micro-batch an image lands in, and the KL guard is exactly 0 while the weights are the reference's.
Sampling draws each image's tokens from its own generator (`pacs.captioner.modeling.example_rng`), decoding without
a key-value cache (one forward of the whole prefix per token: exact, and short captions keep it cheap);
`samples: beam` uses the model's own `generate` (`num_beams = num_return_sequences = k`).

Fine-tuning (`HFTrainOptions`): `finetune: full` trains every weight outside the vision tower (`train_vision:
true` trains it too); `finetune: lora` wraps the language side with peft LoRA adapters on every `nn.Linear`
(and `Conv1D`) outside the vision tower, chosen by module type. `save` writes a plain transformers folder with the
adapters **merged** into the weights (`save_pretrained` + the processor), the adapter itself beside it in
`adapter/` (peft's `adapter_config.json` + `adapter_model.safetensors`) and `pacs_training.json` (provenance).
"""
from __future__ import annotations

import copy
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from annotated_types import Le

from pacs.captioner.modeling.checkpoints import _atomic_dir_replace
from pacs.captioner.modeling.example_rng import ExampleRNG
from pacs.captioner.modeling.hf_captioning import (
    HFCaptioner,
    encode_image,
    load_hf_captioner,
    prompt_text,
    read_rgb,
    stack_without_padding,
)
from pacs.metric.common.config import PositiveFloat, PositiveInt
from pacs.metric.common.errors import InputError, NonFiniteError
from pacs.metric.common.io import chmod_like_umask, write_json_atomic
from pacs.metric.common.provenance import provenance
from pacs.metric.training.divergence import nonfinite_parameter

logger = logging.getLogger(__name__)

#: module-name parts of a vision tower (frozen unless `train_vision`; never given LoRA adapters): BLIP / BLIP-2's
#: `vision_model`, LLaVA's `vision_tower`, GIT's `image_encoder`; projectors and BLIP-2's Q-Former train
VISION_PARTS = ("vision_model", "vision_tower", "image_encoder", "vision_encoder")
ADAPTER_DIR = "adapter"
TRAINING_FILE = "pacs_training.json"
PREFIX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class HFTrainOptions:
    """How a transformers captioner is trained (the recipe's `captioner:` section, besides `kind` / `checkpoint`)."""

    prompt: str | None = None
    finetune: Literal["full", "lora"] = "full"
    lora_r: Annotated[PositiveInt, Le(1024)] = 8
    lora_alpha: PositiveFloat = 16.0
    train_vision: bool = False
    gradient_checkpointing: bool = False


def _is_vision(name: str) -> bool:
    return any(part in name.split(".") for part in VISION_PARTS)


def zero_dropout(model: torch.nn.Module) -> None:
    """Switch off every dropout of `model` (modules and the float rates attention layers read)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for attr in ("dropout", "attention_dropout", "dropout_prob", "attn_dropout"):
            if isinstance(getattr(module, attr, None), float):
                setattr(module, attr, 0.0)


def lora_targets(model: torch.nn.Module) -> list[str]:
    """Names of the layers LoRA adapts: every `nn.Linear` / transformers `Conv1D` outside the vision tower and
    the output head (chosen by module type, as `pacs.metric.models.lora` does for the metric's towers)."""
    from transformers.pytorch_utils import Conv1D

    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [name for name, module in model.named_modules()
            if isinstance(module, (torch.nn.Linear, Conv1D)) and module is not output and not _is_vision(name)]


def end_token_ids(captioner: HFCaptioner) -> list[int]:
    """The token ids that end a caption (what the model's `generate` stops at)."""
    config = captioner.model.config
    if captioner.model_type == "blip":
        return [int(config.text_config.sep_token_id)]
    ends = getattr(captioner.model.generation_config, "eos_token_id", None)
    if ends is None:
        ends = getattr(config, "eos_token_id", None) or getattr(getattr(config, "text_config", None),
                                                                "eos_token_id", None)
    if ends is None:
        raise InputError(f"checkpoint={captioner.folder}: no end token (generation_config / config eos_token_id)",
                         parameter="checkpoint")
    return [int(e) for e in (ends if isinstance(ends, (list, tuple)) else [ends])]


def start_token_id(captioner: HFCaptioner) -> int:
    """The token a caption without a prompt starts from (generation config / config `bos_token_id`)."""
    config = captioner.model.config
    for source in (captioner.model.generation_config, config, getattr(config, "text_config", None)):
        value = getattr(source, "bos_token_id", None) if source is not None else None
        if value is not None:
            return int(value)
    raise InputError(f"checkpoint={captioner.folder}: no start token (bos_token_id) for captions without a prompt",
                     parameter="checkpoint")


def caption_mask(tokens: torch.Tensor, ends: Sequence[int]) -> torch.Tensor:
    """1.0 up to and including the first end token of each row `[N, T]`, 0.0 after it."""
    is_end = torch.isin(tokens, torch.as_tensor(list(ends), device=tokens.device))
    return ((is_end.long().cumsum(1) - is_end.long()) == 0).float()


class HFPolicy:
    """A transformers captioner as a `CaptionPolicy` (module docstring)."""

    kind = "transformers"

    def __init__(self, captioner: HFCaptioner, image_paths: Mapping[str, Any], options: HFTrainOptions,
                 max_length: int = 30, trainable: bool = True, seed: int = 0) -> None:
        """`seed`: the LoRA adapters' initialisation (`finetune: lora`); the training's own seed is the trainer's."""
        self.captioner, self.options, self.paths = captioner, options, image_paths
        self.text = prompt_text(captioner, options.prompt)
        self.tokenizer = captioner.processor.tokenizer
        self.ends = end_token_ids(captioner)
        self.start = start_token_id(captioner)
        self.max_length = int(max_length)
        model = captioner.model
        zero_dropout(model)
        if not trainable:
            model.requires_grad_(False)
            self.module = model.eval()
            return
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(options.train_vision or not _is_vision(name))
        if options.gradient_checkpointing and getattr(model, "supports_gradient_checkpointing", False):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if options.finetune == "lora":
            from peft import LoraConfig, get_peft_model

            targets = lora_targets(model)
            if not targets:
                raise InputError(f"checkpoint={captioner.folder}: no nn.Linear layer outside the vision tower "
                                 "for LoRA", parameter="captioner.finetune")
            vision = [n for n, p in model.named_parameters() if p.requires_grad and _is_vision(n)]
            with torch.random.fork_rng(devices=sorted({p.device.index or 0 for p in model.parameters()
                                                       if p.device.type == "cuda"})):
                torch.manual_seed(seed)  # peft draws the adapters' A matrices from the global generator: without
                # a seed of their own every run (and every process count) would start from other adapters
                model = get_peft_model(model, LoraConfig(r=options.lora_r, lora_alpha=options.lora_alpha,
                                                         lora_dropout=0.0, target_modules=targets))
            if vision:  # train_vision with LoRA: the vision tower's own weights train fully
                for name, parameter in model.named_parameters():
                    parameter.requires_grad_(parameter.requires_grad or any(name.endswith(v) for v in vision))
        self.module = model.eval()  # the SCST / XE loops switch to train mode for the gradient pass (gradient
        # checkpointing runs only in train mode); dropout is off either way

    @classmethod
    def load(cls, folder: str | os.PathLike, image_paths: Mapping[str, Any], options: HFTrainOptions,
             max_length: int = 30, trainable: bool = True, device: str | torch.device = "cpu",
             seed: int = 0) -> HFPolicy:
        """Load the transformers folder `folder` (offline) as a policy over `image_paths` ({id: path})."""
        return cls(load_hf_captioner(folder, str(device)), image_paths, options, max_length, trainable, seed)

    # -- inputs --------------------------------------------------------------------------------------------
    def missing_images(self, image_ids: Iterable[str]) -> list[str]:
        """Ids without an image path."""
        return [str(i) for i in image_ids if str(i) not in self.paths]

    def batch(self, image_ids: Sequence[str], device: torch.device | str) -> dict[str, Any]:
        """`{"image": model inputs of the images [B, ...], "prefix": token ids [B, P]}` (one shape for all)."""
        encoded = [encode_image(self.captioner, read_rgb(self.paths[str(i)]), self.text) for i in image_ids]
        groups = stack_without_padding(encoded)
        if len(groups) != 1:
            raise InputError(f"checkpoint={self.captioner.folder}: the processor gives images of different "
                             "shapes; training needs one input shape for every image", parameter="checkpoint")
        inputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in groups[0][1].items()}
        prefix = inputs.get("input_ids")
        if prefix is None:
            prefix = torch.full((len(image_ids), 1), self.start, dtype=torch.long, device=device)
        elif self.captioner.model_type == "blip":  # as BlipForConditionalGeneration.generate does
            prefix = prefix.clone()
            prefix[:, 0] = self.captioner.model.config.text_config.bos_token_id
            prefix = prefix[:, :-1]
        image = {k: v for k, v in inputs.items() if k not in PREFIX_INPUTS}
        return {"image": image, "prefix": prefix}

    @staticmethod
    def _repeat(batch: dict[str, Any], repeats: int) -> dict[str, Any]:
        if repeats == 1:
            return batch
        image = {k: v.repeat_interleave(repeats, 0) if torch.is_tensor(v) else v for k, v in batch["image"].items()}
        return {"image": image, "prefix": batch["prefix"].repeat_interleave(repeats, 0)}

    def _logits(self, model: Any, batch: dict[str, Any], sequence: torch.Tensor) -> torch.Tensor:
        """Logits `[N, L, V]` of the text positions of `sequence` `[N, L]` (prefix + caption)."""
        mask = torch.ones_like(sequence)
        out = model(**batch["image"], input_ids=sequence, attention_mask=mask, use_cache=False)  # whole sequence:
        # no key-value cache (one is also what breaks recomputation under gradient checkpointing)
        return out.logits[:, -sequence.shape[1]:]

    # -- decoding ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _decode_loop(self, module: Any, batch: dict[str, Any], k: int, max_length: int,
                     rng: ExampleRNG | None, temperature: float = 1.0, top_k: int = 0) -> torch.Tensor:
        rows = self._repeat(batch, k)
        sequence = rows["prefix"]
        n = sequence.shape[0]
        ends = torch.as_tensor(self.ends, device=sequence.device)
        finished = torch.zeros(n, dtype=torch.bool, device=sequence.device)
        chosen = []
        for _ in range(max_length):
            logits = self._logits(module, rows, sequence)[:, -1].float()
            if rng is None:
                choice = logits.argmax(-1)
            else:
                logits = logits / temperature
                if top_k and top_k < logits.shape[-1]:
                    threshold = logits.topk(top_k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < threshold, float("-inf"))
                choice = rng.multinomial(logits.softmax(-1))
            choice = torch.where(finished, ends[0], choice)
            chosen.append(choice)
            finished = finished | torch.isin(choice, ends)
            sequence = torch.cat([sequence, choice[:, None]], 1)
            if bool(finished.all()):
                break
        return torch.stack(chosen, 1).view(len(batch["prefix"]), k, -1)

    def sample(self, module: Any, batch: dict[str, Any], config: Any, rng: ExampleRNG) -> torch.Tensor:
        """k multinomial samples per image (own generator per image), or k beams of the model's `generate`."""
        if config.samples == "beam":
            return self.beams(module, batch, config.k, config.max_length)
        return self._decode_loop(module, batch, config.k, config.max_length, rng, config.temperature, config.top_k)

    def greedy(self, module: Any, batch: dict[str, Any], max_length: int) -> torch.Tensor:
        """Argmax decoding `[B, 1, T]`."""
        return self._decode_loop(module, batch, 1, max_length, None)

    @torch.no_grad()
    def beams(self, module: Any, batch: dict[str, Any], k: int, max_length: int) -> torch.Tensor:
        """The k beams of the model's own `generate` `[B, k, T]` (the prefix cut off, padded with the end token)."""
        model = module.get_base_model() if hasattr(module, "get_base_model") else module
        prefix = batch["prefix"]
        inputs = dict(batch["image"])
        if self.captioner.model_type == "blip":  # BLIP's generate rebuilds its prefix from [CLS] prompt [SEP]
            inputs["input_ids"] = torch.cat([prefix, prefix[:, :1]], 1)
        elif prefix.shape[1] > 1 or self.text is not None:
            inputs["input_ids"] = prefix
        out = model.generate(**inputs, num_beams=k, num_return_sequences=k, do_sample=False,
                             max_new_tokens=max_length)
        tokens = out[:, prefix.shape[1]:]
        end = self.ends[0]
        tokens = torch.where(caption_mask(tokens, self.ends) > 0, tokens, torch.full_like(tokens, end))
        return tokens.reshape(prefix.shape[0], k, -1)

    # -- scoring -------------------------------------------------------------------------------------------
    def token_log_probs(self, model: Any, module: Any, batch: dict[str, Any], tokens: torch.Tensor, repeats: int,
                        dropout: ExampleRNG | None = None) -> torch.Tensor:
        """Teacher-forced `log π(y_t | prefix, y_<t, image)` `[N, T]`, the end token included, zero after it."""
        rows = self._repeat(batch, repeats)
        tokens = tokens.to(rows["prefix"].device)
        sequence = torch.cat([rows["prefix"], tokens], 1)
        logits = self._logits(model, rows, sequence)[:, -tokens.shape[1] - 1:-1]
        gathered = logits.float().log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return gathered * caption_mask(tokens, self.ends)

    def encode_captions(self, captions: Sequence[str]) -> torch.Tensor:
        """Token ids `[N, T]` of reference captions (no special tokens), each ending with the end token."""
        rows = [self.tokenizer(c, add_special_tokens=False)["input_ids"][:self.max_length - 1] + [self.ends[0]]
                for c in captions]
        width = max(len(r) for r in rows)
        return torch.tensor([r + [self.ends[0]] * (width - len(r)) for r in rows], dtype=torch.long)

    def decode(self, tokens: torch.Tensor) -> list[list[str]]:
        """Caption strings `[B][k]` (special tokens skipped, the prefix never included)."""
        mask = caption_mask(tokens.view(-1, tokens.shape[-1]), self.ends).view_as(tokens)
        return [[self.tokenizer.decode(row[m > 0].tolist(), skip_special_tokens=True).strip()
                 for row, m in zip(image, image_mask)] for image, image_mask in zip(tokens, mask)]

    # -- reference and saving ------------------------------------------------------------------------------
    def reference(self, folder: str | os.PathLike, device: torch.device | str) -> HFReference:
        """The frozen model of `folder` (same processor and prompt)."""
        frozen = HFPolicy.load(folder, self.paths, self.options, self.max_length, trainable=False, device=device)
        if len(frozen.tokenizer) != len(self.tokenizer):
            raise InputError(f"scst.kl_reference={str(folder)!r}: its vocabulary size differs from the SCST model's",
                             parameter="scst.kl_reference")
        return HFReference(frozen, str(folder))

    def save(self, folder: str | os.PathLike, module: Any, extra: dict[str, Any]) -> Path:
        """A transformers folder: merged weights + processor, `adapter/` (LoRA) and `pacs_training.json`."""

        folder = Path(folder)
        bad = nonfinite_parameter(module.named_parameters())
        if bad is not None:
            raise NonFiniteError(f"refusing to save a captioner with non-finite weights ({bad!r}) to {folder}")
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = folder.with_name(f".{folder.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            if hasattr(module, "merge_and_unload"):  # peft: the adapter beside, the merged model as the folder
                module.save_pretrained(tmp / ADAPTER_DIR)
                merged = copy.deepcopy(module).merge_and_unload()
            else:
                merged = module
            merged.save_pretrained(tmp)
            self.captioner.processor.save_pretrained(tmp)
            write_json_atomic(tmp / TRAINING_FILE, {"format": "pacs-hf-captioner", "base": str(self.captioner.folder),
                                                    "prompt": self.options.prompt,
                                                    "finetune": self.options.finetune,
                                                    "adapters": "merged" if merged is not module else None,
                                                    "provenance": provenance(**extra)})
            chmod_like_umask(tmp)
            _atomic_dir_replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return folder


class HFReference:
    """The KL guard's frozen transformers model (`PolicyReference`)."""

    def __init__(self, policy: HFPolicy, folder: str) -> None:
        self.policy, self.folder = policy, folder

    @torch.no_grad()
    def sequence_kl(self, policy: Any, batch: Any, tokens: torch.Tensor, repeats: int = 1) -> torch.Tensor:
        """`KL(y)` `[N]`: the policy's minus the reference's summed token log-probabilities of `tokens`."""
        mine = self.policy.token_log_probs(policy, policy, batch, tokens, repeats)
        theirs = self.policy.token_log_probs(self.policy.module, self.policy.module, batch, tokens, repeats)
        return (mine - theirs).sum(1)
