"""Subprocess driver of the guards' two-process test (run with python or accelerate launch).

usage: guards_driver.py OUT MICRO   SCST with the KL guard, the hacking monitor and selection by validation
CIDEr-D (dropout on, multinomial samples); prints `RESULT <name> <json list of float reprs>` lines.
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from captioner_testkit import overlap_reward, tiny_checkpoint, tiny_data

from pacs.captioner.modeling.train_scst import SCSTConfig, train_scst
from pacs.captioner.modeling.training_setup import process_state
from pacs.captioner.orchestration.launching import relaunch_cpu_processes


def emit(name: str, values: list[float]) -> None:
    """Print one result line (main process only)."""
    if process_state().is_main_process:
        print(f"RESULT {name} " + json.dumps([repr(float(x)) for x in values]), flush=True)


def main() -> None:
    """SCST with every guard on; emits the losses, the kl column, the monitor's CIDEr-D and the selected step."""
    relaunch_cpu_processes()
    out, micro = Path(sys.argv[1]), int(sys.argv[2])
    data_dir = out.parent / "data"
    with process_state().main_process_first():
        cache, train, val = tiny_data(data_dir)
        if not (data_dir / "init" / "captioner.json").is_file():
            tiny_checkpoint(data_dir, dropout=0.1)
    config = SCSTConfig(output_dir=str(out), reward="overlap", lr=1e-3, batch_size=8, micro_batch_size=micro,
                        epochs=4, max_steps=4, samples="multinomial", k=3, save_every=100, trackers=[],
                        kl_coef=0.5, monitor_every=2, monitor_images=5, select_by="cider")
    items = list({image_id: [caption] for image_id, caption in train}.items())
    result = train_scst(config, data_dir / "init", cache, items, overlap_reward, validation=val)
    emit("world", [process_state().num_processes])
    emit("losses", result.losses)
    emit("best_step", [result.best_step])
    if process_state().is_main_process:
        with open(out / "log.csv", newline="", encoding="utf-8") as handle:
            emit("kl", [float(row["kl"]) for row in csv.DictReader(handle)])
        with open(out / "monitor.csv", newline="", encoding="utf-8") as handle:
            emit("cider", [float(row["cider"]) for row in csv.DictReader(handle)])


if __name__ == "__main__":
    main()
