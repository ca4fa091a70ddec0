"""Subprocess driver for the transformers-captioner SCST tests (run with python or accelerate launch).

usage:
  hf_scst_driver.py scst OUT MICRO STEPS KILL_AT_CALL [FINETUNE]
                                                        SCST on a tiny random GIT (multinomial samples, k=3,
                                                        global batch 4, checkpoints every 3 steps); SIGKILLs
                                                        itself at reward call KILL_AT_CALL (0: never); FINETUNE
                                                        full (default) or lora
Prints `RESULT <name> <json list of float reprs>` lines (losses, and the final folder's weight sums).
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from hf_tiny import build_git, coloured_images

from pacs.captioner.modeling.hf_policy import HFPolicy, HFTrainOptions
from pacs.captioner.modeling.train_scst import SCSTConfig, train_scst
from pacs.captioner.modeling.training_setup import process_state
from pacs.captioner.orchestration.launching import relaunch_cpu_processes


def emit(name: str, values: list[float]) -> None:
    """Print one result line (main process only)."""
    if process_state().is_main_process:
        print(f"RESULT {name} " + json.dumps([repr(float(x)) for x in values]), flush=True)


class KillingReward:
    """Words shared with the first reference minus 0.1 per word; SIGKILLs its process at call `kill_at`."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at, self.calls = kill_at, 0

    def __call__(self, ids, captions, refs):
        self.calls += 1
        if self.calls == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([[len(set(c.split()) & set(r[0].split())) - 0.1 * len(c.split()) for c in row]
                             for row, r in zip(captions, refs)], dtype=torch.float32)


def main() -> None:
    """SCST on the tiny GIT (see the module docstring)."""
    relaunch_cpu_processes()
    out, micro, steps, kill_at = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    finetune = sys.argv[6] if len(sys.argv) > 6 else "full"
    data = out.parent / "data"
    with process_state().main_process_first():
        if not (data / "git" / "config.json").is_file():
            build_git(data / "git")
        paths, refs = coloured_images(data / "images", 8)
    emit("world", [process_state().num_processes])
    policy = HFPolicy.load(data / "git", paths, HFTrainOptions(finetune=finetune), max_length=6)
    config = SCSTConfig(output_dir=str(out), reward="words", lr=1e-3, batch_size=4, micro_batch_size=micro,
                        epochs=10, max_steps=steps, samples="multinomial", k=3, max_length=6, save_every=3,
                        keep_checkpoints=5, trackers=[], kl_coef=0.1)
    result = train_scst(config, data / "git", None, list(refs.items()), KillingReward(kill_at), policy=policy)
    emit("scst", result.losses)


if __name__ == "__main__":
    main()
