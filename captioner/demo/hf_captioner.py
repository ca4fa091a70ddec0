"""The demo's transformers captioner (`captioner.kind: transformers`, recipes/configs/demo_hf.yaml).

Per seed, instead of pacs' captioner over CLIP grid features:

- `init`: a tiny GIT-shaped model built from random weights (`captioner.family: git`): `GitForCausalLM` sized by
  the `captioner` section, its own ViT at the world's image size, a `GitProcessor` of a `CLIPImageProcessor` and a
  word-level tokenizer whose vocabulary is the world's caption vocabulary (every word of the train references,
  sorted; deterministic from the world), saved as a plain transformers folder;
- `xe`: `pacs.captioner.modeling.hf_train_xe.train_hf_xe` on the train references (the `xe` section's steps, batch,
  schedule and validation), every weight trained (`captioner.train_vision`: the vision tower too);
- `scst-*`: `train_scst` with an `HFPolicy` (`captioning.run_scst` loads it); the test captions come from the
  model's own `generate` (`evaluate.beam_size`; 1: greedy).

The metric stages, the rewards, the evaluation table, the seeds' aggregation and the findings are the main
demo's (`pacs.captioner.demo.pipeline`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pacs.captioner.demo.config import DemoConfig, recorded_xe
from pacs.captioner.demo.data import DemoData
from pacs.captioner.demo.xe_settings import finish_xe, xe_trainer_config
from pacs.captioner.modeling import hf_random_init as random_init
from pacs.captioner.modeling.hf_captioning import HFCaptionOptions, generate_captions, load_hf_captioner
from pacs.captioner.modeling.hf_policy import HFPolicy, HFTrainOptions
from pacs.captioner.modeling.hf_train_xe import train_hf_xe
from pacs.captioner.modeling.training_setup import process_state
from pacs.captioner.orchestration.stage_fingerprints import NOT_DETERMINING, settings_of

HF_XE_DROPPED = frozenset({"d_model", "n_heads", "encoder_layers", "decoder_layers", "ffn_dim", "dropout"})
"""`model` keys that size pacs' captioner, in the XE stage's recorded settings (`recorded_xe`): not part of a
transformers XE stage's settings (the `captioner` section sizes the model; dropout is off in every `HFPolicy`)."""


def caption_words(data: DemoData) -> list[str]:
    """The world's caption vocabulary: every space-separated word of the train references, sorted."""
    return random_init.caption_words(caption for item in data.splits["train"] for caption in item.references)


def image_paths(data: DemoData, splits: tuple[str, ...] = ("train", "val")) -> dict[str, str]:
    """{image_id: PNG} of the splits a policy trains and validates on."""
    return {image_id: path for split in splits for image_id, path in data.image_paths(split).items()}


def build_model(config: DemoConfig, data: DemoData, folder: Path, seed: int) -> dict[str, Any]:
    """Stage `init`: the random-weight GIT-shaped captioner of `captioner` (seeded by `seed`) saved to `folder`."""
    return random_init.build_random_captioner(config.captioner, caption_words(data), config.world.image_size,
                                              config.model.max_length, seed, folder)


def train_options(config: DemoConfig) -> Any:
    """The `HFPolicy` training options of the `captioner` section (no prompt: GIT captions from its start token)."""

    section = config.captioner
    return HFTrainOptions(finetune=section.finetune, lora_r=section.lora_r, lora_alpha=section.lora_alpha,
                          train_vision=section.train_vision)


def load_policy(config: DemoConfig, data: DemoData, folder: Path, device: Any, seed: int) -> Any:
    """The transformers folder `folder` as a trainable `HFPolicy` over the train and validation images (`seed`:
    the initial LoRA adapters of `captioner.finetune: lora`)."""

    return HFPolicy.load(folder, image_paths(data), train_options(config), config.model.max_length, device=device,
                         seed=seed)


def captioner_settings(config: DemoConfig) -> dict[str, Any]:
    """What the `captioner` section adds to the settings of every transformers stage (its whole content)."""

    return {"captioner": settings_of(config.captioner)}


def xe_settings(config: DemoConfig) -> dict[str, Any]:
    """The `xe` section as a transformers XE stage's settings (without the keys that size pacs' captioner)."""

    return recorded_xe(config, NOT_DETERMINING | HF_XE_DROPPED)


def run_xe(config: DemoConfig, data: DemoData, init: Path, folder: Path, logs: Path, micro_batch_size: int,
           seed: int) -> dict:
    """Stage `xe` of a transformers captioner: `train_hf_xe` from the `init` folder on the train references,
    the best checkpoint by validation CIDEr-D of greedy captions (`xe.val_max_images`) in `folder/best`."""

    policy = load_policy(config, data, init, process_state().device, seed)
    pairs = [(item.image_id, caption) for item in data.splits["train"] for caption in item.references]
    val = {item.image_id: item.references for item in data.splits["val"]}
    result = train_hf_xe(xe_trainer_config(config, folder, micro_batch_size, seed), policy, pairs, val)
    return finish_xe(result, folder, logs)


def run_model_stages(config: DemoConfig, seed: int, prefix: str, data: DemoData, runner: Any, logs: Path,
                     micro_batch_size: int) -> str:
    """One seed's `init` and `xe` stages (folders `<prefix>init`, `<prefix>xe`); the XE stage's name."""
    init, xe = f"{prefix}init", f"{prefix}xe"
    section = captioner_settings(config)
    runner.run(init, lambda: build_model(config, data, runner.folder(init), seed), {"seed": seed, **section},
               upstream=["data"])
    runner.run(xe, lambda: run_xe(config, data, runner.folder(init), runner.folder(xe), logs, micro_batch_size,
                                  seed),
               {"seed": seed, "xe": xe_settings(config), **section}, upstream=[init], distributed=True)
    return xe


def caption_test_set(folder: Path, data: DemoData, config: DemoConfig) -> dict[str, str]:
    """Captions of every test image by the transformers model in `folder`: its own `generate`, beam
    `evaluate.beam_size` (1: greedy), at most `model.max_length` new tokens."""

    device = str(process_state().device)
    options = HFCaptionOptions(beam_size=config.evaluate.beam_size, max_new_tokens=config.model.max_length,
                               batch_size=100, device=device)
    return generate_captions(load_hf_captioner(folder, device), data.image_paths("test"), options)
