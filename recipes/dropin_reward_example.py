"""Drop-in rewards for another captioner: SCST on a Hugging Face VisionEncoderDecoderModel with `build_reward`.

The pacs reward protocol is all a training loop needs::

    reward = pacs.rewards.build_reward("cider:1,clip-s:1", backbone=..., image_paths=..., train_references=...)
    values = reward(image_ids, captions, references)   # list[str], list[list[str]] (B x k), list[list[str]]
    values.shape == (B, k)                              # float32 on the CPU, no gradient

This script shows it on a captioner that has nothing to do with pacs' own: a tiny randomly initialised
`VisionEncoderDecoderModel` (ViT encoder + GPT-2 decoder) with a word-level tokenizer built in code from
Flickr8k captions; nothing is downloaded. Each step samples k captions per image, scores them with the
reward, subtracts the mean reward of the image's k samples (the PAC-S++ baseline) and minimises
`-mean((r - b) * log p(caption))`. With `--backbone tiny` the contrastive terms use a tiny random CLIP;
pass an open_clip name (`ViT-B-32/openai`) or `--checkpoint` for a real reward model.

    PACS_SHARED=/path/to/shared python recipes/dropin_reward_example.py --steps 5 --reward cider:1,clip-s:1

Guards against reward hacking (docs/rewards.md "Guard rewards"): add the repetition / length penalties to the
spec (`--reward clip-s:1,rep-penalty:0.5,length-penalty:0.25`), and `--kl-coef BETA` keeps the policy near a
frozen copy of its starting weights: `scst_step_with_kl` subtracts `BETA·Σ_t (log π(y_t) − log π_ref(y_t))`
from each sampled caption's reward before the baseline (TRL's `beta`; with TRL's `GRPOTrainer` set
`GRPOConfig(beta=...)` instead, and pass the same spec to `pacs.rewards.trl.reward_function`).
"""
from __future__ import annotations

import argparse
import copy
import logging
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from pacs.captioner.data import CaptionDataset, load_dataset
from pacs.metric.common.errors import PacsError
from pacs.metric.common.seeding import seed_everything
from pacs.metric.common.shared_data import shared_dir
from pacs.rewards import build_reward

logger = logging.getLogger("dropin_reward_example")

SPECIAL_TOKENS = {"pad_token": "[PAD]", "bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]"}


@dataclass
class DropInConfig:
    """Settings of the example run."""

    reward: str = "cider:1,clip-s:1"
    backbone: str = "tiny"
    checkpoint: str | None = None
    steps: int = 3
    batch_size: int = 4
    k: int = 3
    max_length: int = 12
    image_size: int = 32
    lr: float = 1e-3
    images: int = 16
    seed: int = 0
    kl_coef: float = 0.0  # β of the KL penalty to the starting weights (0: off)


def build_tokenizer(captions: Sequence[str]) -> Any:
    """A word-level `PreTrainedTokenizerFast` (lower-cased, punctuation split off) built from `captions`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    splitter = pre_tokenizers.Whitespace()
    words = Counter(word for caption in captions
                    for word, _ in splitter.pre_tokenize_str(caption.lower()))
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS.values())}
    for word in sorted(words):
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = splitter
    tokenizer.decoder = decoders.WordPiece()  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS)


def build_captioner(tokenizer: Any, image_size: int = 32, seed: int = 0) -> Any:
    """A tiny random `VisionEncoderDecoderModel`: 2-layer ViT encoder + 2-layer GPT-2 decoder."""
    from transformers import GPT2Config, VisionEncoderDecoderConfig, VisionEncoderDecoderModel, ViTConfig

    encoder = ViTConfig(image_size=image_size, patch_size=8, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64)
    decoder = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id = tokenizer.bos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    torch.manual_seed(seed)
    model = VisionEncoderDecoderModel(config=config)
    model.generation_config.decoder_start_token_id = tokenizer.bos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def build_image_processor(image_size: int) -> Any:
    """A ViT image processor configured in code (resize to `image_size`, normalise)."""
    from transformers import ViTImageProcessor

    return ViTImageProcessor(size={"height": image_size, "width": image_size})


def sample_captions(model: Any, pixel_values: torch.Tensor, k: int, max_length: int) -> torch.Tensor:
    """k multinomial samples per image: token ids `[B*k, T]` starting with the decoder start token."""
    with torch.no_grad():
        return model.generate(pixel_values=pixel_values, do_sample=True, top_k=0, num_return_sequences=k,
                              max_length=max_length)


def sequence_log_probs(model: Any, pixel_values: torch.Tensor, sequences: torch.Tensor, eos_id: int) -> torch.Tensor:
    """log p(sequence) `[N]` under the model, summed over tokens up to and including the first EOS."""
    logits = model(pixel_values=pixel_values, decoder_input_ids=sequences[:, :-1]).logits
    targets = sequences[:, 1:]
    token_log_probs = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ended_before = torch.cumsum((targets == eos_id).long(), dim=1) - (targets == eos_id).long()
    mask = (ended_before == 0).float()
    return (token_log_probs * mask).sum(dim=1)


def scst_step(model: Any, optimizer: torch.optim.Optimizer, tokenizer: Any, reward: Any,
              pixel_values: torch.Tensor, image_ids: list[str], references: list[list[str]], k: int,
              max_length: int) -> dict[str, Any]:
    """One SCST step with the mean-of-k baseline; returns the loss, the rewards `[B, k]` and the captions."""
    model.eval()
    sequences = sample_captions(model, pixel_values, k, max_length)
    texts = tokenizer.batch_decode(sequences, skip_special_tokens=True)
    captions = [texts[b * k:(b + 1) * k] for b in range(len(image_ids))]
    rewards = reward(image_ids, captions, references)  # [B, k], the pacs reward protocol
    advantages = rewards - rewards.mean(dim=1, keepdim=True)
    model.train()
    log_probs = sequence_log_probs(model, pixel_values.repeat_interleave(k, dim=0), sequences,
                                   tokenizer.eos_token_id).view(len(image_ids), k)
    loss = -(advantages.to(log_probs.device) * log_probs).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": float(loss.detach()), "rewards": rewards, "captions": captions}


def frozen_reference(model: Any) -> Any:
    """A frozen copy of `model` (eval mode, no gradients): the reference policy of the KL penalty."""
    return copy.deepcopy(model).eval().requires_grad_(False)


def scst_step_with_kl(model: Any, reference: Any, kl_coef: float, optimizer: torch.optim.Optimizer, tokenizer: Any,
                      reward: Any, pixel_values: torch.Tensor, image_ids: list[str], references: list[list[str]],
                      k: int, max_length: int) -> dict[str, Any]:
    """`scst_step` with TRL's KL penalty: r − kl_coef·Σ_t (log π(y_t) − log π_ref(y_t)), before the baseline."""
    model.eval()
    sequences = sample_captions(model, pixel_values, k, max_length)
    texts = tokenizer.batch_decode(sequences, skip_special_tokens=True)
    captions = [texts[b * k:(b + 1) * k] for b in range(len(image_ids))]
    rewards = reward(image_ids, captions, references)  # [B, k], the pacs reward protocol
    pixels = pixel_values.repeat_interleave(k, dim=0)
    with torch.no_grad():  # both in eval mode: the KL is exactly 0 while the model equals its reference
        kl = (sequence_log_probs(model, pixels, sequences, tokenizer.eos_token_id)
              - sequence_log_probs(reference, pixels, sequences, tokenizer.eos_token_id)).view(len(image_ids), k)
    shaped = rewards - kl_coef * kl.cpu()
    advantages = shaped - shaped.mean(dim=1, keepdim=True)
    model.train()
    log_probs = sequence_log_probs(model, pixels, sequences, tokenizer.eos_token_id).view(len(image_ids), k)
    loss = -(advantages.to(log_probs.device) * log_probs).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": float(loss.detach()), "rewards": rewards, "kl": kl, "captions": captions}


def reward_context(config: DropInConfig, dataset: CaptionDataset) -> dict[str, Any]:
    """What `build_reward` needs: the reward model, where the images are, the training references."""
    context: dict[str, Any] = {"image_paths": dataset.image_paths(),
                               "train_references": list(dataset.references().values())}
    if config.checkpoint:
        context["checkpoint"] = config.checkpoint
    elif config.backbone == "tiny":
        from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config

        context["backbone"] = build_backbone_from_config(tiny_clip_config(), seed=config.seed)
    else:
        context["backbone"] = config.backbone
    return context


def run(config: DropInConfig, data: Path) -> list[dict[str, Any]]:
    """Run `config.steps` SCST steps on the first `config.images` Flickr8k training images found on disk."""
    seed_everything(config.seed)
    dataset = load_dataset("flickr8k", data).split("train")
    dataset.items = dataset.items[:config.images]
    if len(dataset) < config.batch_size:
        raise PacsError(f"only {len(dataset)} Flickr8k training images with files under {data}")
    tokenizer = build_tokenizer([caption for item in dataset for caption in item.captions])
    model = build_captioner(tokenizer, config.image_size, config.seed)
    processor = build_image_processor(config.image_size)
    reward = build_reward(config.reward, **reward_context(config, dataset))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    reference = frozen_reference(model) if config.kl_coef > 0 else None
    history = []
    for step in range(config.steps):
        start = (step * config.batch_size) % len(dataset)
        batch = [dataset.items[(start + i) % len(dataset)] for i in range(config.batch_size)]
        images = [Image.open(item.image_path).convert("RGB") for item in batch]
        pixel_values = processor(images=images, return_tensors="pt").pixel_values
        ids, refs = [item.image_id for item in batch], [item.captions for item in batch]
        if reference is None:
            result = scst_step(model, optimizer, tokenizer, reward, pixel_values, ids, refs, config.k, config.max_length)
        else:
            result = scst_step_with_kl(model, reference, config.kl_coef, optimizer, tokenizer, reward, pixel_values,
                                       ids, refs, config.k, config.max_length)
        logger.info("step %d: loss %.4f, reward %.4f, e.g. %r", step, result["loss"],
                    float(result["rewards"].mean()), result["captions"][0][0])
        history.append(result)
    return history


def main(argv: list[str] | None = None) -> int:
    """Command line: a few SCST steps on a tiny VisionEncoderDecoderModel with a pacs reward."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = DropInConfig()
    parser.add_argument("--data", type=Path, default=None, help="raw Flickr8k folder (default: $PACS_SHARED/data/flickr8k)")
    for field_name in ("reward", "backbone", "checkpoint", "steps", "batch_size", "k", "images", "lr", "seed",
                       "kl_coef"):
        default = getattr(defaults, field_name)
        parser.add_argument("--" + field_name.replace("_", "-"), default=default,
                            type=type(default) if default is not None else str)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = DropInConfig(**{key: value for key, value in vars(args).items() if key != "data"})
    try:
        data = args.data or shared_dir() / "data" / "flickr8k"
        history = run(config, data)
    except PacsError as error:
        print(f"dropin_reward_example: error: {error}", file=sys.stderr)
        return 2
    for step, result in enumerate(history):
        print(f"step {step}: loss {result['loss']:.4f}  mean reward {float(result['rewards'].mean()):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
