"""Subprocess driver for the multi-process and kill/resume tests (run with python or accelerate launch).

usage: captioner_driver.py xe OUT MICRO STEPS | scst OUT MICRO STEPS KILL_AT_CALL [VARIANT]
VARIANT `resume` (default): dropout on, multinomial samples; `ddp`: dropout off, beams (deterministic per image).
Prints one line `LOSSES <json list of float reprs>`.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from captioner.train_scst import SCSTConfig, train_scst  # noqa: E402
from captioner.train_xe import XEConfig, train_xe  # noqa: E402
from captioner.training import ScheduleConfig  # noqa: E402
from captioner_testkit import overlap_reward, tiny_checkpoint, tiny_data, tiny_model_config  # noqa: E402


def main() -> None:
    mode, out, micro, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    data_dir = out.parent / "data"
    cache, train, val = tiny_data(data_dir)
    if mode == "xe":
        from captioner.vocab import build_vocab

        vocab = build_vocab("word", [c for _, c in train], min_count=1, max_length=8)
        config = XEConfig(output_dir=str(out), max_steps=steps, batch_size=32, micro_batch_size=micro,
                          schedule=ScheduleConfig(warmup_steps=2, constant_until=5, decay_until=8, peak_lr=3e-3,
                                                  final_lr=1e-4), val_every=1000, checkpoint_every=1000,
                          log_every=1, tensorboard=False)
        result = train_xe(config, tiny_model_config(dropout=0.0), vocab, cache, train, {})
    else:
        kill_at = int(sys.argv[5])
        calls = {"n": 0}

        def reward(ids, captions, refs):
            calls["n"] += 1
            if calls["n"] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return overlap_reward(ids, captions, refs)

        variant = sys.argv[6] if len(sys.argv) > 6 else "resume"
        init = data_dir / ("init" if variant == "resume" else "init-nodrop")
        if not (init / "captioner.json").is_file():
            tiny_checkpoint(data_dir, dropout=0.1 if variant == "resume" else 0.0, name=init.name)
        config = SCSTConfig(output_dir=str(out), reward="overlap", lr=1e-3, batch_size=8, micro_batch_size=micro,
                            epochs=4, max_steps=steps, samples="multinomial" if variant == "resume" else "beam",
                            k=3, checkpoint_every=3, keep_checkpoints=5, tensorboard=False)
        scst_train = [(image_id, val_refs) for image_id, val_refs in
                      {i: [c] for i, c in train}.items()]
        result = train_scst(config, init, cache, scst_train, reward)
    print("LOSSES " + json.dumps([repr(x) for x in result.losses]), flush=True)


if __name__ == "__main__":
    main()
