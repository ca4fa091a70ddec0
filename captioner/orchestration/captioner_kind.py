"""The recipe's `captioner:` section: pacs' own captioner (default) or a transformers image-to-text folder.

`kind: transformers` with `checkpoint: FOLDER` (a BLIP, GIT or LLaVA-style folder `pacs caption` loads) makes
`pacs train` run its stages on that model (`pacs.captioner.orchestration.captioner_stages.TransformersCaptioner`):
optional XE fine-tuning on the references (`xe: true`), SCST with every reward of `rewards`, evaluation. With
`init:` instead (the sizes of `pacs.captioner.modeling.hf_random_init.RandomCaptionerConfig` and the images'
`image_size`), stage `init` first builds that model from random weights over the training captions' words (the
demo's transformers captioner). The other keys are `pacs.captioner.modeling.hf_policy.HFTrainOptions` (prompt,
full or LoRA fine-tuning, vision tower, checkpointing).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Le

from pacs.captioner.modeling.hf_policy import HFTrainOptions
from pacs.captioner.modeling.hf_random_init import RandomCaptionerConfig
from pacs.metric.common.config import PositiveFloat, PositiveInt
from pacs.metric.common.errors import InputError


@dataclass
class CaptionerInitConfig(RandomCaptionerConfig):
    """A recipe's `captioner.init`: the random-weight model's sizes and the side its processor resizes images to."""

    image_size: Annotated[PositiveInt, Le(2048)] = 224

    def validate(self) -> None:
        """The sizes' checks, and patches that fit the images."""
        super().validate()
        if self.patch_size > self.image_size:
            raise InputError(f"captioner.init.patch_size={self.patch_size}: expected <= captioner.init.image_size "
                             f"({self.image_size})")


@dataclass
class CaptionerKindConfig:
    """Which captioner the pipeline trains (module docstring)."""

    kind: Literal["pacs", "transformers"] = "pacs"
    checkpoint: str = ""  # the transformers folder (kind: transformers)
    # or a model built from random weights in stage `init` (kind: transformers; no pretrained folder: the demo world)
    init: CaptionerInitConfig | None = None
    prompt: str | None = None  # as `pacs caption --prompt` (required by instruction-tuned models)
    xe: bool = True  # XE fine-tuning on the references before SCST (false: SCST starts from `checkpoint`)
    finetune: Literal["full", "lora"] = "full"
    lora_r: Annotated[PositiveInt, Le(1024)] = 8
    lora_alpha: PositiveFloat = 16.0
    train_vision: bool = False  # the vision tower is frozen unless true
    gradient_checkpointing: bool = False

    def validate(self) -> None:
        """A transformers kind has one starting model (`checkpoint` or `init`); pacs' captioner neither."""
        if self.kind == "transformers" and not self.checkpoint and self.init is None:
            raise InputError("captioner.kind=transformers needs captioner.checkpoint=FOLDER (a transformers "
                             "image-to-text folder) or captioner.init (a model built from random weights)",
                             parameter="captioner.checkpoint")
        if self.checkpoint and self.init is not None:
            raise InputError(f"captioner.checkpoint={self.checkpoint!r} and captioner.init both name the starting "
                             "model; keep one", parameter="captioner.init")
        if self.kind == "pacs" and (self.checkpoint or self.init is not None):
            key = "checkpoint" if self.checkpoint else "init"
            raise InputError(f"captioner.{key} is for captioner.kind=transformers (pacs' captioner starts from "
                             "its own XE)", parameter=f"captioner.{key}")

    def options(self) -> HFTrainOptions:
        """The policy's training options."""
        return HFTrainOptions(prompt=self.prompt, finetune=self.finetune, lora_r=self.lora_r,
                              lora_alpha=self.lora_alpha, train_vision=self.train_vision,
                              gradient_checkpointing=self.gradient_checkpointing)
