"""GRPO with TRL on a tiny random vision-language model, rewarded by pacs (`pacs.rewards.trl.reward_function`).

Everything is built in code and offline: a word-level tokenizer made from Flickr8k captions, a CLIP image
processor, a `LlavaProcessor` with a small chat template, and a randomly initialised LLaVA (2-layer CLIP
vision tower + 2-layer Llama decoder). The dataset holds one row per Flickr8k training image: a
conversational `prompt`, the `image` (decoded by `datasets` to a PIL image, which the VLM sees and the reward
scores) and its `references` (read by reference-based rewards and CIDEr). `trl.GRPOTrainer` samples
`num_generations` captions per image, scores them with the pacs reward and takes a GRPO step; the reward
model is the tiny random CLIP of `pacs.metric.models.backbones` unless `--backbone NAME[/PRETRAINED]` or `--checkpoint`
names a real one.

    HF_HUB_OFFLINE=1 PACS_SHARED=/path/to/shared python recipes/grpo_vlm_example.py --steps 3 --reward pac-s++

`--out FILE` writes the reward the trainer logged at each step and the completions and image files the
reward scored (tests recompute the reward from them). `--aggregation normalize_then_sum` passes one reward
function per component of a mix (`pacs.rewards.trl.reward_functions`) with TRL's GDPO normalisation of each
component within the generations of a prompt; `--monitor-every N` adds pacs' completion monitor
(`pacs.rewards.monitor.CompletionMonitor`: length, Rep-n, distinct-n of the completions; a warning on gaming).
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from pacs.captioner.data import load_dataset
from pacs.metric.common.errors import PacsError
from pacs.metric.common.io import write_json_atomic
from pacs.metric.common.seeding import seed_everything
from pacs.metric.common.shared_data import shared_dir
from pacs.rewards.monitor import CompletionMonitor
from pacs.rewards.trl import PacsRewardFunction, reward_function, reward_functions

logger = logging.getLogger("grpo_vlm_example")

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
IMAGE_TOKEN = "<image>"
PROMPT = "Describe the image."
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")  # trl.GRPOConfig.multi_objective_aggregation
# A LLaVA-style template: image placeholders and text blocks of each user turn, then the assistant's turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image> "
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %} "
    "{% else %}ASSISTANT: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}</s> {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


@dataclass
class GRPOExampleConfig:
    """Settings of the example run (a few CPU steps by default)."""

    reward: str = "pac-s++"
    backbone: str = "tiny"
    checkpoint: str | None = None
    steps: int = 3
    images: int = 4
    batch_size: int = 8  # completions per step: batch_size / num_generations images
    num_generations: int = 4
    max_completion_length: int = 10
    image_size: int = 32
    lr: float = 1e-3
    seed: int = 0
    aggregation: str = "sum_then_normalize"  # TRL's multi_objective_aggregation; normalize_then_sum: per component
    monitor_every: int = 0  # > 0: the completion monitor compares windows of this many reward calls


def build_tokenizer(captions: Sequence[str]) -> Any:
    """A word-level `PreTrainedTokenizerFast` from `captions`, with `<image>` and the chat-template words."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    splitter = pre_tokenizers.Whitespace()
    words = Counter(word for text in [*captions, PROMPT, "USER: ASSISTANT:"]
                    for word, _ in splitter.pre_tokenize_str(text.lower()))
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS.values(), IMAGE_TOKEN])}
    for word in sorted(words):
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = splitter
    tokenizer.decoder = decoders.WordPiece()  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS, padding_side="left",
                                   extra_special_tokens={"image_token": IMAGE_TOKEN})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_processor(tokenizer: Any, image_size: int, patch_size: int) -> Any:
    """A `LlavaProcessor` (CLIP image processor + the word-level tokenizer) configured in code."""
    from transformers import CLIPImageProcessor, LlavaProcessor

    image_processor = CLIPImageProcessor(size={"shortest_edge": image_size},
                                         crop_size={"height": image_size, "width": image_size})
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=patch_size,
                          vision_feature_select_strategy="full", num_additional_image_tokens=1,
                          image_token=IMAGE_TOKEN, chat_template=CHAT_TEMPLATE)


def build_vlm(tokenizer: Any, image_size: int, patch_size: int, seed: int) -> Any:
    """A tiny random `LlavaForConditionalGeneration`: 2-layer CLIP vision tower, 2-layer Llama decoder."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    vision = CLIPVisionConfig(image_size=image_size, patch_size=patch_size, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=2, projection_dim=32)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)
    config = LlavaConfig(vision_config=vision, text_config=text,
                         image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
                         vision_feature_select_strategy="full", vision_feature_layer=-1)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


class RecordingReward:
    """Passes TRL's call on to a pacs reward function and keeps what it scored (for the `--out` record)."""

    def __init__(self, reward: PacsRewardFunction) -> None:
        self.reward = reward
        self.__name__ = reward.__name__
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> list[float | None]:
        """The wrapped reward's values; the completions and image files are recorded."""
        values = self.reward(**kwargs)
        self.calls.append({"completions": list(kwargs["completions"]), "image_paths": list(kwargs["image_path"]),
                           "references": list(kwargs["references"]), "rewards": values})
        return values


def reward_model_options(config: GRPOExampleConfig) -> dict[str, Any]:
    """The reward model of `reward_function`: a tiny random CLIP, an open_clip name or a checkpoint."""
    if config.checkpoint:
        return {"checkpoint": config.checkpoint}
    if config.backbone == "tiny":
        from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config

        return {"backbone": build_backbone_from_config(tiny_clip_config(), seed=config.seed)}
    return {"backbone": config.backbone}


def build_train_dataset(data: Path, n_images: int) -> Any:
    """Rows of `prompt` (conversational), `image` (PIL via datasets), `image_path` and `references`."""
    import datasets

    items = [item for item in load_dataset("flickr8k", data).split("train").items if item.image_path][:n_images]
    if not items:
        raise PacsError(f"no Flickr8k training images with files under {data}")
    rows = {"prompt": [[{"role": "user", "content": PROMPT}] for _ in items],
            "image": [str(item.image_path) for item in items],
            "image_path": [str(item.image_path) for item in items],
            "references": [list(item.captions) for item in items]}
    return datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())


def run(config: GRPOExampleConfig, data: Path, output_dir: Path) -> dict[str, Any]:
    """Train `config.steps` GRPO steps; returns the logged reward per step and the reward calls."""
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    seed_everything(config.seed)
    dataset = build_train_dataset(data, config.images)
    tokenizer = build_tokenizer([caption for refs in dataset["references"] for caption in refs])
    patch_size = config.image_size // 4
    processor = build_processor(tokenizer, config.image_size, patch_size)
    model = build_vlm(tokenizer, config.image_size, patch_size, config.seed)
    monitor = CompletionMonitor(every=config.monitor_every) if config.monitor_every else None
    options = {"train_references": dataset["references"], "monitor": monitor, **reward_model_options(config)}
    if config.aggregation == "normalize_then_sum":  # one function per component: TRL normalises each, then weights
        functions, weights = reward_functions(config.reward, **options)
    else:
        functions, weights = [reward_function(config.reward, name="pacs", **options)], [1.0]
    rewards = [RecordingReward(function) for function in functions]
    args = GRPOConfig(output_dir=str(output_dir), max_steps=config.steps, per_device_train_batch_size=config.batch_size,
                      num_generations=config.num_generations, max_completion_length=config.max_completion_length,
                      learning_rate=config.lr, beta=0.0, logging_steps=1, save_strategy="no", report_to="none",
                      use_cpu=True, bf16=False, activation_checkpointing=False, seed=config.seed,
                      dataloader_num_workers=0, disable_tqdm=True, reward_weights=weights,
                      multi_objective_aggregation=config.aggregation)
    trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=args, train_dataset=dataset,
                          processing_class=processor)
    trainer.remove_callback(PrinterCallback)  # main() prints its own per-step summary
    trainer.train()
    steps = [{"step": entry["step"], "reward": entry["reward"], "loss": entry.get("loss"),  # the weighted sum
              "grad_norm": entry.get("grad_norm")} for entry in trainer.state.log_history if "reward" in entry]
    return {"config": asdict(config), "steps": steps, "reward_calls": rewards[0].calls,
            "component_calls": {reward.__name__: reward.calls for reward in rewards}, "weights": weights,
            "monitor": {"rows": monitor.rows, "warnings": monitor.warnings} if monitor else None,
            "images_encoded": functions[0].n_encoded}


def main(argv: list[str] | None = None) -> int:
    """Command line: a few GRPO steps of a tiny random LLaVA with a pacs reward."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = GRPOExampleConfig()
    parser.add_argument("--data", type=Path, default=None,
                        help="raw Flickr8k folder (default: $PACS_SHARED/data/flickr8k)")
    parser.add_argument("--out", type=Path, default=None, help="write the per-step rewards and reward calls (JSON)")
    for field_name in ("reward", "backbone", "checkpoint", "steps", "images", "batch_size", "num_generations",
                       "max_completion_length", "lr", "seed", "aggregation", "monitor_every"):
        default = getattr(defaults, field_name)
        parser.add_argument("--" + field_name.replace("_", "-"), default=default,
                            type=type(default) if default is not None else str)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = GRPOExampleConfig(**{key: value for key, value in vars(args).items() if key not in ("data", "out")})
    if config.aggregation not in AGGREGATIONS:
        parser.error(f"--aggregation {config.aggregation}: expected one of {', '.join(AGGREGATIONS)}")
    torch.set_num_threads(1)
    try:
        data = args.data or shared_dir() / "data" / "flickr8k"
        with tempfile.TemporaryDirectory(prefix="grpo_vlm_") as output_dir:
            result = run(config, data, Path(output_dir))
    except PacsError as error:
        print(f"grpo_vlm_example: error: {error}", file=sys.stderr)
        return 2
    for step in result["steps"]:
        print(f"step {step['step']}: mean pacs reward ({config.reward}) {step['reward']:.4f}  "
              f"grad norm {step['grad_norm']:.3f}")
    scored = sum(len(call["completions"]) for call in result["reward_calls"])
    print(f"{scored} completions scored; images encoded by the reward: {result['images_encoded']}")
    if result["monitor"]:
        last = result["monitor"]["rows"][-1]
        print(f"completion monitor: length {last['length']:.2f}  rep2 {last['rep2']:.2f}  distinct2 "
              f"{last['distinct2']:.2f}; {len(result['monitor']['warnings'])} gaming warning(s)")
    if args.out:
        write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
