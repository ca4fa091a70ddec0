"""Benchmark: the captioner's training loop, this tree against another (issue 43 item 6).

Three workloads on the same random captioner (seed 0) and the same random features, one process per tree:
- XE step: `--images` images × 5 captions each (captions of an image next to each other, as an image-grouped
  batch gives them), teacher forcing with dropout drawn per caption (`pacs.captioner.modeling.example_rng`,
  as `train_xe`), backward, Adam; each tree feeds the model the way its `train_xe` does (one feature row per
  caption, or `forward(rows=...)` where the tree has it). With `--xe-dropout 0` the encoder draws no mask.
- SCST step: beam search of 5 beams per image (the COCO recipe's `samples: beam`), a stand-in reward (the
  number of distinct tokens of a caption, mean baseline), `forward(repeats=5)` with dropout, backward, Adam.
- Beam search: 5 beams, `--images` images, evaluation mode.

The trees run in turn (interleaved, `--rounds` times each, medians of wall and of CPU time), each with
`--threads` torch threads.
The first step of each workload starts from the same weights in both trees: its tokens, loss and gradients
are compared (largest gradient difference relative to the tensor's largest gradient).

    git worktree add /tmp/before_h7 <commit>
    python bench/bench_loop_waste.py --before /tmp/before_h7 [--shape coco|small] [--images 5] [--rounds 4]
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHAPES = {  # coco: the COCO recipe (recipes/configs/coco_base.yaml) over ViT-B/32-sized grid features
    "coco": {"d_model": 512, "n_heads": 8, "encoder_layers": 3, "decoder_layers": 3, "ffn_dim": 2048,
             "vocab_size": 10_000, "feature_dim": 768, "regions": 50, "max_length": 20},
    "small": {"d_model": 128, "n_heads": 4, "encoder_layers": 2, "decoder_layers": 2, "ffn_dim": 256,
              "vocab_size": 1_000, "feature_dim": 96, "regions": 16, "max_length": 20},
}
CAPTIONS_PER_IMAGE = 5
WORKLOADS = ("xe", "scst", "beam")


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> list[float]:
    """(wall, CPU) seconds since `start`."""
    wall, cpu = _clock()
    return [wall - start[0], cpu - start[1]]


class Child:
    """The measurements of one tree's `pacs` package (run in a process whose `pacs` is that tree's)."""

    def __init__(self, tree: Path, args: argparse.Namespace) -> None:
        import torch

        import pacs

        pacs.__path__.append(str(tree))  # the tree's folders as pacs.captioner, pacs.metric (as setup.cfg maps them)
        from pacs.captioner.modeling import model as model_module

        if not Path(model_module.__file__).resolve().is_relative_to(tree):
            raise SystemExit(f"imported {model_module.__file__}, not {tree}'s captioner")
        torch.set_num_threads(args.threads)
        self.args, self.work = args, Path(args.work)
        shape = dict(SHAPES[args.shape])
        self.regions = shape.pop("regions")
        self.config = model_module.CaptionerConfig(dropout=0.1, **shape)
        self.first: dict[str, bool] = {}

    def model(self, dropout: float) -> Any:
        """A freshly initialised captioner (seed 0: the same weights in every tree) and its Adam."""
        import torch

        from pacs.captioner.modeling.model import Captioner

        self.config.dropout = dropout
        torch.manual_seed(0)
        model = Captioner(self.config)
        model.share_image_work = True  # the opt-in sharing measured (absent in trees before it: no effect there)
        return model, torch.optim.Adam(model.parameters(), lr=1e-5)

    def data(self, images: int) -> tuple[Any, Any]:
        """Features `[images, R, Dv]` and target tokens `[images·5, L]` (random lengths, <eos>, <pad>)."""
        import torch

        generator = torch.Generator().manual_seed(1)
        features = torch.randn(images, self.regions, self.config.feature_dim, generator=generator)
        n, length = images * CAPTIONS_PER_IMAGE, self.config.max_length + 1
        tokens = torch.randint(4, self.config.vocab_size, (n, length), generator=generator)
        ends = torch.randint(8, length, (n,), generator=generator)
        for row, end in enumerate(ends.tolist()):
            tokens[row, end] = 2  # <eos>
            tokens[row, end + 1:] = 0  # <pad>
        return features, tokens

    def run(self, workload: str, tag: str) -> dict[str, Any]:
        """One timed step of `workload`; the first call also saves what it computed (for the comparison)."""
        if workload not in self.first:
            self.state = {}
        if workload == "xe":
            out = self.xe_step()
        elif workload == "scst":
            out = self.scst_step()
        else:
            out = self.beam()
        if workload not in self.first:
            import torch

            self.first[workload] = True
            torch.save(out.pop("saved"), self.work / f"{tag}_{workload}.pt")
        out.pop("saved", None)
        return out

    def xe_step(self) -> dict[str, Any]:
        """One XE step as this tree's `train_xe` feeds the model (per-caption dropout streams)."""
        import torch

        from pacs.captioner.modeling.example_rng import DROPOUT, ExampleRNG, example_generators
        from pacs.captioner.modeling.model import Captioner, shift_right
        from pacs.captioner.modeling.train_xe import xe_loss

        if "model" not in self.state:
            self.state["model"], self.state["optimizer"] = self.model(self.args.xe_dropout)
            self.state["data"] = self.data(self.args.images)
        model, optimizer = self.state["model"], self.state["optimizer"]
        features, tokens = self.state["data"]
        rows = torch.arange(features.shape[0]).repeat_interleave(CAPTIONS_PER_IMAGE)
        grouped = "rows" in inspect.signature(Captioner.forward).parameters
        start = _clock()
        model.train()
        rng = ExampleRNG(example_generators(42, 0, range(len(rows)), DROPOUT))
        with model.example_rng(rng):
            if grouped:
                logits = model(features, shift_right(tokens), rows=rows)
            else:
                logits = model(features.index_select(0, rows), shift_right(tokens))
            loss = xe_loss(logits, tokens).mean()
            loss.backward()
        saved = {"loss": loss.detach(), "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return {"seconds": _since(start), "saved": saved}

    def scst_step(self) -> dict[str, Any]:
        """One SCST step: 5 beams per image, stand-in reward, `forward(repeats=5)` with dropout, Adam."""
        import torch

        from pacs.captioner.modeling.decoding import beam_search
        from pacs.captioner.modeling.example_rng import DROPOUT, ExampleRNG, example_generators
        from pacs.captioner.modeling.model import shift_right, token_log_probs

        if "model" not in self.state:
            self.state["model"], self.state["optimizer"] = self.model(0.1)
            self.state["data"] = self.data(self.args.images)
        model, optimizer = self.state["model"], self.state["optimizer"]
        features = self.state["data"][0]
        b, k = features.shape[0], CAPTIONS_PER_IMAGE
        start = _clock()
        model.eval()
        sampled = beam_search(model, features, beam_size=k).tokens
        tokens = sampled.reshape(b * k, -1)
        reward = torch.tensor([float(len(set(row.tolist()) - {0})) for row in tokens]).view(b, k)
        advantages = (reward - reward.mean(1, keepdim=True)).view(-1)
        model.train()
        with model.example_rng(ExampleRNG(example_generators(42, 0, range(b), DROPOUT))):
            log_p = token_log_probs(model(features, shift_right(tokens), repeats=k), tokens).sum(1)
            loss = -(advantages * log_p).mean()
            loss.backward()
        saved = {"tokens": sampled, "loss": loss.detach(),
                 "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return {"seconds": _since(start), "saved": saved}

    def beam(self) -> dict[str, Any]:
        """Beam search (5 beams) of the images, evaluation mode."""
        from pacs.captioner.modeling.decoding import beam_search

        if "model" not in self.state:
            self.state["model"] = self.model(0.1)[0].eval()
            self.state["data"] = self.data(self.args.images)
        start = _clock()
        decoded = beam_search(self.state["model"], self.state["data"][0], beam_size=CAPTIONS_PER_IMAGE)
        return {"seconds": _since(start), "saved": {"tokens": decoded.tokens,
                                                                   "log_probs": decoded.log_probs}}


def child_main(args: argparse.Namespace) -> None:
    """Serve workloads named on stdin, one JSON line each on stdout."""
    child = Child(Path(args.tree).resolve(), args)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(child.run(request["workload"], request["tag"])), flush=True)


class Tree:
    """A child process measuring one tree."""

    def __init__(self, name: str, tree: Path, args: argparse.Namespace) -> None:
        self.name, self.tag = name, "after" if name == "this tree" else "before"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(REPO / "bench")]),
               "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
        command = [sys.executable, str(Path(__file__).resolve()), "--child", "--tree", str(tree), "--work", args.work,
                   "--shape", args.shape, "--images", str(args.images), "--threads", str(args.threads),
                   "--xe-dropout", str(args.xe_dropout)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                        cwd=tree)
        self.read()

    def read(self) -> dict[str, Any]:
        """The child's next answer (its death is one line naming the tree)."""
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"bench_loop_waste: the measurement of {self.name} died (exit {self.process.wait()})")
        return json.loads(line)

    def run(self, workload: str) -> list[float]:
        """(wall, CPU) seconds of one step of `workload`."""
        self.process.stdin.write(json.dumps({"workload": workload, "tag": self.tag}) + "\n")
        self.process.stdin.flush()
        return [float(x) for x in self.read()["seconds"]]

    def close(self) -> None:
        """End the child."""
        self.process.stdin.close()
        self.process.wait()


def compare(work: Path, workload: str) -> str:
    """What the first step of `workload` computed in both trees: tokens equal, loss and gradient differences."""
    import torch

    before = torch.load(work / f"before_{workload}.pt")
    after = torch.load(work / f"after_{workload}.pt")
    parts = []
    for key in ("tokens", "log_probs"):
        if key in after:
            parts.append(f"{key} {'identical' if torch.equal(before[key], after[key]) else 'DIFFER'}")
    if "loss" in after:
        parts.append(f"loss {float(after['loss']):.6f} vs {float(before['loss']):.6f} "
                     f"(|Δ| {abs(float(after['loss'] - before['loss'])):.1e})")
        worst = max(float((after["grads"][n] - g).abs().max() / g.abs().max().clamp(min=1e-30))
                    for n, g in before["grads"].items())
        exact = sum(torch.equal(after["grads"][n], g) for n, g in before["grads"].items())
        parts.append(f"gradients: largest |Δ| {worst:.1e} of the tensor's largest, "
                     f"{exact}/{len(before['grads'])} tensors identical")
    return "; ".join(parts)


def main() -> None:
    """Parse the flags; run both trees interleaved; print the table and the comparison."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a checkout of the code to compare with (its repository root)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="coco")
    parser.add_argument("--images", type=int, default=5, help="images per step (5 captions / beams each)")
    parser.add_argument("--rounds", type=int, default=4, help="timed steps per workload and tree (median)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--xe-dropout", type=float, default=0.1, help="the XE model's dropout (the recipe: 0.1)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return
    if args.images < 1 or args.rounds < 1 or args.threads < 1 or not 0 <= args.xe_dropout < 1:
        parser.exit(2, "bench_loop_waste: --images, --rounds and --threads must be >= 1, --xe-dropout in [0, 1)\n")
    workloads = [w for w in args.workloads.split(",") if w]
    if not workloads or set(workloads) - set(WORKLOADS):
        parser.exit(2, f"bench_loop_waste: --workloads must name some of {','.join(WORKLOADS)}\n")
    if args.before and not (Path(args.before) / "captioner" / "modeling" / "model.py").is_file():
        parser.exit(2, f"bench_loop_waste: --before {args.before} is not a checkout of this repository\n")
    with tempfile.TemporaryDirectory() as work:
        args.work = work
        trees = [Tree("this tree", REPO, args)]
        if args.before:
            trees.insert(0, Tree("before", Path(args.before).resolve(), args))
        times: dict[tuple[str, str], list[list[float]]] = {}
        try:
            for workload in workloads:
                for tree in trees:  # untimed first step: the compared one (also the warm-up)
                    tree.run(workload)
                for _ in range(args.rounds):
                    for tree in trees:
                        times.setdefault((tree.name, workload), []).append(tree.run(workload))
            comparisons = {w: compare(Path(work), w) for w in workloads} if args.before else {}
        finally:
            for tree in trees:
                tree.close()
    shape = SHAPES[args.shape]
    print(f"bench_loop_waste: {args.shape} shape ({shape['encoder_layers']}+{shape['decoder_layers']} layers, "
          f"d{shape['d_model']}, {shape['regions']}×{shape['feature_dim']} features, vocabulary "
          f"{shape['vocab_size']:,}), {args.images} images × {CAPTIONS_PER_IMAGE} captions/beams per step, "
          f"XE dropout {args.xe_dropout:g}, {args.threads} thread(s), median of {args.rounds} interleaved rounds")
    units = {"xe": ("XE steps/s", 1.0), "scst": ("SCST steps/s", 1.0), "beam": ("beam-5 images/s", args.images)}
    names = [tree.name for tree in trees]
    # CPU time too: with one thread it is the step's compute, and it moves less than wall time when other jobs
    # share the cores.
    for clock, label_clock in ((0, "wall"), (1, "CPU")):
        print(f"{'by ' + label_clock + ' time':<18}" + "".join(f"{name:>14}" for name in names)
              + (f"{'this / before':>15}" if args.before else ""))
        for workload in workloads:
            label, scale = units[workload]
            rates = [scale / statistics.median(t[clock] for t in times[(name, workload)]) for name in names]
            print(f"{label:<18}" + "".join(f"{rate:>14.4f}" for rate in rates)
                  + (f"{rates[1] / rates[0]:>14.2f}×" if args.before else ""))
    for workload, text in comparisons.items():
        print(f"{units[workload][0].split()[0]} first step, this tree vs before: {text}")


if __name__ == "__main__":
    main()
