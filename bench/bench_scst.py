"""Time one SCST step of a tiny captioner on CPU, split into decode / reward / backward, for the `cider` and
`pac-s++` rewards (tiny random CLIP backbone; image embeddings cached after the first step as in training).

    python bench/bench_scst.py [--steps 10] [--batch 32] [--k 5]

Prints a table of milliseconds per step and each part's share of the step (target: reward <= 25%).
"backward" is the whole update: teacher-forced forward with gradients, backward and the optimizer step.
The baseline of the ratios is the whole step measured in the same run.
"""
from __future__ import annotations

import argparse
import time

import torch
from PIL import Image

from pacs.captioner.modeling.decoding import beam_search, decode_texts
from pacs.captioner.modeling.model import Captioner, CaptionerConfig, shift_right, token_log_probs
from pacs.captioner.modeling.vocab import WordVocab
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.scoring.scorer import Scorer
from pacs.rewards import build_reward

WORDS = ["a", "an", "the", "man", "woman", "dog", "cat", "red", "blue", "green", "on", "in", "with", "of", "sitting", "standing", "running", "street", "field"]


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vocab = WordVocab(WORDS, max_length=20)
    model = Captioner(CaptionerConfig(vocab_size=len(vocab), feature_dim=64, d_model=128, n_heads=4,
                                      encoder_layers=2, decoder_layers=2, ffn_dim=256, dropout=0.1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    ids = [f"img{i}" for i in range(args.batch)]
    images = {i: Image.new("RGB", (64, 64), (7 * n % 255, 3 * n % 255, 11 * n % 255)) for n, i in enumerate(ids)}
    references = [["a man on a street", "a dog in a field"] for _ in ids]
    feats = torch.randn(args.batch, 17, 64)
    backbone = build_backbone_from_config(tiny_clip_config(), seed=0, family="pac-s++")
    rewards = {
        "cider": build_reward("cider", train_references={i: r for i, r in zip(ids, references)}),
        "pac-s++": build_reward("pac-s++", scorer=Scorer(backbone, progress=False),
                                image_loader=lambda image_id: images[image_id]),
    }
    print(f"SCST step, tiny captioner (d_model 128, 2+2 layers), batch {args.batch} x k={args.k} beams, "
          f"{args.threads} thread(s), mean of {args.steps} steps after 1 warm-up")
    print("| reward | step ms | decode ms | reward ms | backward ms | decode / step | reward / step | "
          "backward / step |")
    print("|---|---|---|---|---|---|---|---|")
    for name, reward in rewards.items():
        totals = {"decode": 0.0, "reward": 0.0, "backward": 0.0}
        for step in range(args.steps + 1):
            t0 = time.perf_counter()
            model.eval()
            decoded = beam_search(model, feats, beam_size=args.k, max_length=20)
            captions = decode_texts(vocab, decoded.tokens)
            t1 = time.perf_counter()
            values = reward(ids, captions, references)
            t2 = time.perf_counter()
            model.train()
            advantages = values - values.mean(1, keepdim=True)
            b, k, length = decoded.tokens.shape
            tokens = decoded.tokens.view(b * k, length)
            log_p = token_log_probs(model(feats, shift_right(tokens), repeats=k), tokens).sum(1)
            loss = -(advantages.view(-1) * log_p).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            t3 = time.perf_counter()
            if step:  # the first step warms caches (image embeddings, allocator)
                totals["decode"] += t1 - t0
                totals["reward"] += t2 - t1
                totals["backward"] += t3 - t2
        per = {key: 1000 * value / args.steps for key, value in totals.items()}
        whole = sum(per.values())
        print(f"| {name} | {whole:.1f} | {per['decode']:.1f} | {per['reward']:.1f} | {per['backward']:.1f} | "
              f"{per['decode'] / whole:.2f} | {per['reward'] / whole:.2f} | {per['backward'] / whole:.2f} |")


if __name__ == "__main__":
    main()
