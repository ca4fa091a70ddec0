"""The recipe's `captioner:` section: pacs' own captioner (default) or a transformers image-to-text folder.

`kind: transformers` with `checkpoint: FOLDER` (a BLIP, GIT or LLaVA-style folder `pacs caption` loads) makes
`pacs train` run its stages on that model (`pacs.captioner.orchestration.captioner_stages.TransformersCaptioner`):
optional XE fine-tuning on the references (`xe: true`), SCST with every reward of `rewards`, evaluation. The other keys are
`pacs.captioner.modeling.hf_policy.HFTrainOptions` (prompt, full or LoRA fine-tuning, vision tower, checkpointing).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Le

from pacs.captioner.modeling.hf_policy import HFTrainOptions
from pacs.metric.common.config import PositiveFloat, PositiveInt
from pacs.metric.common.errors import InputError


@dataclass
class CaptionerKindConfig:
    """Which captioner the pipeline trains (module docstring)."""

    kind: Literal["pacs", "transformers"] = "pacs"
    checkpoint: str = ""  # the transformers folder (kind: transformers)
    prompt: str | None = None  # as `pacs caption --prompt` (required by instruction-tuned models)
    xe: bool = True  # XE fine-tuning on the references before SCST (false: SCST starts from `checkpoint`)
    finetune: Literal["full", "lora"] = "full"
    lora_r: Annotated[PositiveInt, Le(1024)] = 8
    lora_alpha: PositiveFloat = 16.0
    train_vision: bool = False  # the vision tower is frozen unless true
    gradient_checkpointing: bool = False

    def validate(self) -> None:
        """`checkpoint` is set exactly when `kind` is transformers."""
        if self.kind == "transformers" and not self.checkpoint:
            raise InputError("captioner.kind=transformers needs captioner.checkpoint=FOLDER (a transformers "
                             "image-to-text folder)", parameter="captioner.checkpoint")
        if self.kind == "pacs" and self.checkpoint:
            raise InputError(f"captioner.checkpoint={self.checkpoint!r} is for captioner.kind=transformers",
                             parameter="captioner.checkpoint")

    def options(self) -> HFTrainOptions:
        """The policy's training options."""
        return HFTrainOptions(prompt=self.prompt, finetune=self.finetune, lora_r=self.lora_r,
                              lora_alpha=self.lora_alpha, train_vision=self.train_vision,
                              gradient_checkpointing=self.gradient_checkpointing)
