"""Time one XE training micro-step of the demo's captioner (forward with dropout, backward, Adam step) with
torch's global dropout generator (the baseline: fused attention, one mask per tensor) against per-example
generators (`pacs.captioner.modeling.example_rng`: masks drawn per (seed, step, example), explicit attention), which make
training independent of the process count and micro-batch size.

    python bench/bench_train_step.py [--batch 64] [--steps 20] [--threads 1]

Prints the median milliseconds per micro-step (the two variants alternate, so machine load hits both alike)
and the ratio to the baseline measured in the same run.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from timing import median_time

from pacs.captioner.modeling.example_rng import DROPOUT, ExampleRNG, example_generators
from pacs.captioner.modeling.model import Captioner, CaptionerConfig


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64, help="captions per micro-step (the demo's XE batch)")
    parser.add_argument("--steps", type=int, default=20, help="timed micro-steps per variant (median)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    # the demo's captioner (recipes/configs/demo.yaml: xe section), 16 grid tokens of width 96, 20 tokens
    config = CaptionerConfig(d_model=128, n_heads=4, encoder_layers=2, decoder_layers=2, ffn_dim=256, dropout=0.1,
                             vocab_size=60, feature_dim=96, max_length=20)
    model = Captioner(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    features = torch.randn(args.batch, 16, 96)
    tokens = torch.randint(4, 60, (args.batch, 21))

    def step(per_example: bool, counter: list[int]) -> None:
        counter[0] += 1
        rng = (ExampleRNG(example_generators(0, counter[0], range(args.batch), DROPOUT)) if per_example else None)
        with model.example_rng(rng):
            logits = model(features, tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    variants = (("global generator, fused attention (baseline)", False),
                ("per-example generators (pacs.captioner.modeling.example_rng)", True))
    counters = [[0], [0]]
    for index, (_, per_example) in enumerate(variants):  # warm-up
        for _ in range(3):
            step(per_example, counters[index])
    times: list[list[float]] = [[], []]
    for _ in range(args.steps):  # alternate the variants so that load on the machine hits both alike
        for index, (_, per_example) in enumerate(variants):
            times[index].append(median_time(lambda p=per_example, c=counters[index]: step(p, c), 1))
    rows = [(name, statistics.median(t)) for (name, _), t in zip(variants, times)]
    base = rows[0][1]
    print(f"bench_train_step: XE micro-step of the demo captioner, batch {args.batch}, {args.threads} thread(s), "
          f"median of {args.steps}")
    print(f"{'variant':<50} {'ms/step':>9} {'ratio':>7}")
    for name, seconds in rows:
        print(f"{name:<50} {seconds * 1000:>9.1f} {seconds / base:>7.3f}")


if __name__ == "__main__":
    main()
