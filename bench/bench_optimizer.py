"""Time one optimizer step of the demo's two trained models with torch's per-parameter Adam/AdamW (the baseline)
against the fused kernel that `pacs.metric.common.optim.make_adam` chooses where torch has one.

    python bench/bench_optimizer.py [--steps 30] [--threads 2]

Models: the demo's tiny CLIP (recipes/configs/demo.yaml `clip:` section, 48 px, full fine-tuning with AdamW and
weight decay 0.1, as the `clip` stage trains it) and its captioner (`xe:` section, Adam, betas 0.9/0.98). Prints the
median milliseconds per step (the variants alternate, so machine load hits both alike), the ratio to the baseline
measured in the same run, and the largest parameter difference after the timed steps (same gradients each step).
"""
from __future__ import annotations

import argparse
import statistics

import torch
from timing import median_time

from pacs.captioner.demo.metric_stages import clip_arch
from pacs.captioner.demo.pipeline import load_demo_config
from pacs.captioner.modeling.model import Captioner, CaptionerConfig
from pacs.metric.common.optim import fused_supported
from pacs.metric.models.backbones import build_backbone_from_config

CAPTIONER_VOCAB = 46  # the demo vocabulary's size (runs/demo/xe/vocab.json)


def _models() -> dict[str, tuple[torch.nn.Module, type, dict]]:
    demo = load_demo_config(None, [])
    clip = build_backbone_from_config(clip_arch(demo.clip, demo.world.image_size), seed=0, name="demo-clip").model
    sizes = demo.model
    captioner = Captioner(CaptionerConfig(vocab_size=CAPTIONER_VOCAB, feature_dim=demo.clip.vision_width,
                                          d_model=sizes.d_model, n_heads=sizes.n_heads,
                                          encoder_layers=sizes.encoder_layers, decoder_layers=sizes.decoder_layers,
                                          ffn_dim=sizes.ffn_dim, dropout=sizes.dropout, max_length=sizes.max_length))
    return {"demo CLIP (AdamW, wd 0.1)": (clip, torch.optim.AdamW, {"lr": demo.clip.lr,
                                                                    "weight_decay": demo.clip.weight_decay}),
            "demo captioner (Adam)": (captioner, torch.optim.Adam, {"lr": demo.xe.schedule.peak_lr, "betas": (0.9, 0.98)})}


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant (median)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"bench_optimizer: one optimizer step, {args.threads} thread(s), median of {args.steps}")
    print(f"{'model':<28} {'parameters':>10} {'variant':<26} {'ms/step':>8} {'ratio':>6} {'max |Δparam|':>13}")
    for name, (model, cls, options) in _models().items():
        reference = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
        fused = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
        assert fused_supported(fused)
        generator = torch.Generator().manual_seed(0)
        for a, b in zip(reference, fused):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.clone()
        variants = [("per-parameter (baseline)", cls(reference, **options)),
                    ("fused (make_adam)", cls(fused, fused=True, **options))]
        times: list[list[float]] = [[], []]
        for _ in range(3):
            for _, optimizer in variants:
                optimizer.step()
        for _ in range(args.steps):
            for index, (_, optimizer) in enumerate(variants):
                times[index].append(median_time(optimizer.step, 1))
        deviation = max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(reference, fused))
        count = sum(p.numel() for p in reference)
        base = statistics.median(times[0])
        for index, (variant, _) in enumerate(variants):
            median = statistics.median(times[index])
            extra = f"{deviation:>13.2e}" if index else f"{'':>13}"
            print(f"{name:<28} {count:>10,} {variant:<26} {median * 1000:>8.2f} {median / base:>6.3f} {extra}")


if __name__ == "__main__":
    main()
