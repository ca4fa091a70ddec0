"""The demo's memory estimate, checked at load: the sizes that each fit their bound must also fit together.

Every size key of the demo has an upper bound (docs/config.md "Upper bounds"), but a model at every width bound
trained on a micro-batch at its bound would still not fit a 24 GB machine. So before the first stage the demo
estimates what its largest training step holds and refuses a configuration above `MEMORY_BUDGET` in one line naming
the stage, the estimate and the keys that size it. The estimate is deliberately simple (fp32, one process):

- parameters: 16 bytes each (the weights, their gradients and Adam's two moments);
- activations: 4 bytes × samples × layers × tokens × (16 × width + 2 × ffn width + 2 × heads × tokens), the
  tensors a transformer layer keeps for its backward pass (projections, MLP, attention scores).

It over-counts rather than under-counts; the shipped presets use well under 1% of the budget.
"""
from __future__ import annotations

from typing import Any

MEMORY_BUDGET = 16 * 2**30
"""Bytes one demo step may hold: what a 24 GB machine leaves after the system, the data and the other models."""
TEXT_VOCABULARY = 49408  # open_clip's tokenizer: the CLIP text tower's embedding rows


def _layers_bytes(samples: int, layers: int, tokens: int, width: int, ffn: int, heads: int) -> int:
    return 4 * samples * layers * tokens * (16 * width + 2 * ffn + 2 * heads * tokens)


def _params_bytes(*counts: int) -> int:
    return 16 * sum(counts)


def stage_estimates(config: Any) -> dict[str, tuple[int, str]]:
    """{stage: (estimated bytes of its largest training step, the keys that size it)} of a `DemoConfig`."""
    clip, xe, scst, world = config.clip, config.xe, config.scst, config.world
    vision_tokens = (world.image_size // clip.patch_size) ** 2 + 1
    clip_params = _params_bytes(12 * clip.vision_width**2 * clip.vision_layers,
                                12 * clip.text_width**2 * clip.text_layers + TEXT_VOCABULARY * clip.text_width,
                                clip.embed_dim * (clip.vision_width + clip.text_width))

    def clip_step(batch: int, micro: int) -> int:
        samples = micro or batch
        return clip_params + (_layers_bytes(samples, clip.vision_layers, vision_tokens, clip.vision_width,
                                            4 * clip.vision_width, max(1, clip.vision_width // 32))
                              + _layers_bytes(samples, clip.text_layers, clip.context_length, clip.text_width,
                                              4 * clip.text_width, 2))

    m = config.model  # pacs' captioner
    captioner_params = _params_bytes(m.encoder_layers * (4 * m.d_model**2 + 2 * m.d_model * m.ffn_dim),
                                     m.decoder_layers * (8 * m.d_model**2 + 2 * m.d_model * m.ffn_dim))

    def captioner_step(samples: int, length: int) -> int:
        return captioner_params + (
            _layers_bytes(samples, m.encoder_layers, vision_tokens, m.d_model, m.ffn_dim, m.n_heads)
            + _layers_bytes(samples, m.decoder_layers, length + vision_tokens, m.d_model, m.ffn_dim, m.n_heads))

    clip_keys = ("clip.vision_width, clip.vision_layers, clip.text_width, clip.text_layers, clip.context_length, "
                 "world.image_size / clip.patch_size")
    model_keys = "model.d_model, model.ffn_dim, model.encoder_layers, model.decoder_layers, model.max_length"
    if config.captioner.transformers:  # the transformers captioner's own ViT and text decoder (`captioner`)
        captioner_step, model_keys = _transformers_step(config)
    return {
        "clip": (clip_step(clip.batch_size, clip.micro_batch_size),
                 f"clip.micro_batch_size (or batch_size), {clip_keys}"),
        "pacs": (clip_step(config.pacs.batch_size, config.pacs.micro_batch_size),
                 f"pacs.micro_batch_size (or batch_size), {clip_keys}"),
        "xe": (captioner_step(xe.micro_batch_size or xe.batch_size, m.max_length),
               f"xe.micro_batch_size (or batch_size), {model_keys}"),
        "scst": (captioner_step((scst.micro_batch_size or scst.batch_size) * scst.k, m.max_length),
                 f"scst.micro_batch_size (or batch_size) × scst.k, {model_keys}"),
    }


def _transformers_step(config: Any) -> tuple[Any, str]:
    """(samples, caption length) -> bytes of a transformers captioner's training step, and the keys that size it:
    its ViT over (image_size // patch_size)² + 1 tokens, its text decoder over those tokens and the caption (GIT
    attends over both), the projection between them (the embeddings of the world's few words are left out)."""
    model = config.captioner
    tokens = (config.world.image_size // model.patch_size) ** 2 + 1
    vision, text = model.vision_hidden_size, model.hidden_size
    params = _params_bytes(model.vision_layers * (4 * vision**2 + 2 * vision * model.vision_intermediate_size),
                           model.layers * (4 * text**2 + 2 * text * model.intermediate_size), vision * text)

    def step(samples: int, length: int) -> int:
        return params + (
            _layers_bytes(samples, model.vision_layers, tokens, vision, model.vision_intermediate_size,
                          model.vision_heads)
            + _layers_bytes(samples, model.layers, tokens + length, text, model.intermediate_size, model.heads))

    keys = ("captioner.hidden_size, captioner.intermediate_size, captioner.layers, captioner.vision_hidden_size, "
            "captioner.vision_intermediate_size, captioner.vision_layers, world.image_size / captioner.patch_size, "
            "model.max_length")
    return step, keys


def _size(count: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count / 2**10:.1f} KiB"


def check_memory(config: Any) -> None:
    """InputError naming the first stage whose estimated step exceeds `MEMORY_BUDGET` and the keys that size it."""
    from pacs.metric.common.errors import InputError

    for stage, (estimate, keys) in stage_estimates(config).items():
        if estimate > MEMORY_BUDGET:
            raise InputError(f"{stage}: one training step would hold about {_size(estimate)} (estimate: fp32 weights, "
                             f"gradients, Adam and activations), more than the {_size(MEMORY_BUDGET)} a 24 GB machine "
                             f"leaves; lower {keys}")
