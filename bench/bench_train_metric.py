"""Benchmark: metric training steps/s and peak memory, LoRA (PAC-S++) vs projection (PAC-S) vs full, per model size.

Each configuration runs in a fresh subprocess (so its peak resident memory is its own): a randomly initialised
model (tiny, or ViT-B-32 built by open_clip without weights), a small batch of random images and real-looking
captions, `--warmup` untimed optimizer steps then `--steps` timed ones through the trainer's own code path
(`prepare_trainable`, `compute_loss`, AdamW). The table gives steps/s, peak memory (RSS on CPU, allocated on
CUDA; "model MB" is the RSS after building the model, before the first step, so the difference is what training
adds), trainable parameters, and the ratio of each mode's speed and memory to the projection baseline of the
same size measured in the same run. ``--micro M`` runs each step as the trainer does with
``micro_batch_size=M`` (GradCache over batch/M micro-batches: one loss over the whole batch, an extra forward,
the activations of one micro-batch at a time); without it a step is one plain forward/backward (`compute_loss`).

    python bench/bench_train_metric.py [--sizes tiny,ViT-B-32] [--modes projection,lora,full] [--batch 8] [--micro 2]
"""
from __future__ import annotations

import argparse
import multiprocessing
import resource
import time


def _one_run(size: str, mode: str, batch: int, steps: int, warmup: int, threads: int, device: str, micro: int,
             queue: multiprocessing.Queue) -> None:
    import torch

    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    from pacs.metric.training.data import split_micro_batches
    from pacs.metric.training.grad_cache import grad_cache_step
    from pacs.metric.training.trainer import (
        DualEncoder,
        LossOptions,
        MetricTrainConfig,
        compute_loss,
        encode_positives,
        loss_on_embeddings,
        prepare_trainable,
        trainable_parameters,
    )

    torch.set_num_threads(threads)
    if size == "tiny":
        config = tiny_clip_config()
    else:
        import open_clip

        config = open_clip.get_model_config(size)
    backbone = build_backbone_from_config(config, seed=0, name=size, device=device)
    trained = prepare_trainable(backbone, MetricTrainConfig(mode=mode))
    model = trained.model.to(device).train()
    params = trainable_parameters(model)
    optimizer = torch.optim.AdamW(list(params.values()), lr=1e-4)
    encoder = DualEncoder(model)
    image_size = config["vision_cfg"]["image_size"]
    images = torch.randn(batch, 3, image_size, image_size)
    captions = [f"a photo of {i} dogs playing with a red ball on the grass" for i in range(batch)]
    data = (images, captions, images.flip(-1), [c.replace("dogs", "cats") for c in captions])
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for step in range(warmup + steps):
        if step == warmup:
            start = time.perf_counter()
        if micro:
            grad_cache_step(split_micro_batches(data, micro),
                            lambda part: encode_positives(encoder, trained.tokenize, part, torch.device(device)),
                            lambda emb, scale: loss_on_embeddings(emb, scale, LossOptions()), lambda t: t.backward(),
                            device=torch.device(device))
        else:
            terms = compute_loss(encoder, trained.tokenize, data, LossOptions(), torch.device(device))
            terms.total.backward()
        optimizer.step()
        optimizer.zero_grad()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if device.startswith("cuda"):
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    queue.put({"size": size, "mode": mode, "steps_per_s": steps / seconds, "peak_mb": peak_mb,
               "model_mb": rss_before / 1024, "trainable": sum(p.numel() for p in params.values()),
               "total": sum(p.numel() for p in model.parameters())})


def measure(size: str, mode: str, batch: int, steps: int, warmup: int, threads: int, device: str,
            micro: int = 0) -> dict:
    """Run one configuration in a fresh process and return its measurements (`micro` > 0: GradCache steps)."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_one_run, args=(size, mode, batch, steps, warmup, threads, device, micro,
                                                              queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def main() -> None:
    """Measure every size x mode and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,ViT-B-32")
    parser.add_argument("--modes", default="projection,lora,full", help="the first one is the baseline")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--micro", type=int, default=0,
                        help="GradCache micro-batch size (must divide --batch); 0: one plain pass per step")
    parser.add_argument("--json", help="also write the rows as JSON")
    args = parser.parse_args()
    modes = args.modes.split(",")
    rows = []
    for size in args.sizes.split(","):
        results = [measure(size, mode, args.batch, args.steps, args.warmup, args.threads, args.device, args.micro)
                   for mode in modes]
        base = results[0]
        for result in results:
            result["speed_vs_base"] = result["steps_per_s"] / base["steps_per_s"]
            result["memory_vs_base"] = result["peak_mb"] / base["peak_mb"]
            rows.append(result)
    step_kind = f"GradCache micro-batches of {args.micro}" if args.micro else "one pass per step"
    print(f"metric training, batch {args.batch} (+ as many generated positives, {step_kind}), "
          f"{args.steps} timed steps, device {args.device}, {args.threads} threads; baseline = mode '{modes[0]}' of the same size")
    header = (f"{'size':<10} {'mode':<11} {'steps/s':>9} {'x base':>7} {'peak MB':>9} {'x base':>7} "
              f"{'model MB':>9} {'trainable':>12} {'of total':>12}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['size']:<10} {r['mode']:<11} {r['steps_per_s']:>9.2f} {r['speed_vs_base']:>7.2f} "
              f"{r['peak_mb']:>9.0f} {r['memory_vs_base']:>7.2f} {r['model_mb']:>9.0f} {r['trainable']:>12,d} "
              f"{r['total']:>12,d}")
    if args.json:
        from pacs.metric.common.io import write_json_atomic

        write_json_atomic(args.json, rows)


if __name__ == "__main__":
    main()
