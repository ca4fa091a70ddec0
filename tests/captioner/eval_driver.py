"""Subprocess driver of the evaluation tests: `pacs.captioner.orchestration.pipeline.evaluate_models` on 1 or 2 processes.

usage: eval_driver.py RUN_DIR DATA_ROOT SETS
  evaluates the two random tiny captioners of DATA_ROOT/inputs.json (written by `build_inputs`) on the
  comma-separated test SETS (e.g. "coco,nocaps") into RUN_DIR/eval/.
Prints `CAPTIONED <rank> <images captioned>` per process and `WORLD <n>` (main process only).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from captioner_testkit import print_line

from pacs.captioner.modeling.training_setup import process_state
from pacs.captioner.orchestration.launching import relaunch_cpu_processes

TINY_SEEDS = {"clip": 0, "pac-s++": 1, "features": 2}


def tiny_source(seed: int) -> dict:
    """A random tiny CLIP as a BackboneSource mapping."""
    from pacs.metric.models.backbones import tiny_clip_config

    return {"random_config": tiny_clip_config(), "random_seed": seed}


def build_inputs(data_root: Path, flickr8k: Path) -> tuple[dict, dict[str, Path]]:
    """The rehearsal data sets (colliding ids) and two random captioners ('xe', 'pac-s++') over their vocabulary."""
    from rehearsal_data import build_rehearsal_sets

    from pacs.captioner.data import load_dataset
    from pacs.captioner.modeling.checkpoints import save_captioner
    from pacs.captioner.modeling.model import Captioner, CaptionerConfig
    from pacs.captioner.modeling.vocab import build_vocab

    sets = build_rehearsal_sets(flickr8k, data_root / "sets", n_train=8, n_val=2, n_test=5)
    train = load_dataset("coco-karpathy", sets["train"]["path"]).split("train").items
    vocab = build_vocab("word", [c for item in train for c in item.captions], min_count=1, max_length=8)
    models = {}
    for seed, name in enumerate(("xe", "pac-s++")):
        config = CaptionerConfig(d_model=32, n_heads=4, encoder_layers=1, decoder_layers=1, ffn_dim=64,
                                 dropout=0.0, vocab_size=len(vocab), feature_dim=64, max_length=vocab.max_length)
        torch.manual_seed(seed)
        models[name] = save_captioner(data_root / "models" / name, Captioner(config), vocab,
                                      tiny_source(TINY_SEEDS["features"]))
    (data_root / "inputs.json").write_text(json.dumps({"sets": sets, "models": {k: str(v) for k, v in models.items()}}))
    return sets, models


def evaluate(run_dir: Path, data_root: Path, names: list[str]) -> dict:
    """`evaluate_models` of the inputs of `build_inputs` on test sets `names`; the main process's result."""
    from pacs.captioner.orchestration.pipeline import PipelineConfig
    from pacs.captioner.orchestration.shared_stages import RecipeRun, evaluate_models, prepare_test_sets
    from pacs.metric.common.config import from_dict

    inputs = json.loads((data_root / "inputs.json").read_text())
    config = from_dict(PipelineConfig, {
        "run_dir": str(run_dir),
        "features": {"source": tiny_source(TINY_SEEDS["features"]), "batch_size": 3, "shard_size": 4},
        "reward_models": {"clip": tiny_source(TINY_SEEDS["clip"]), "pac": tiny_source(TINY_SEEDS["pac-s++"]),
                          "device": "cpu"},
        "evaluation": {"test_sets": {name: inputs["sets"][name] for name in names}, "beam_size": 2,
                       "batch_size": 2, "text_metrics": ["bleu4", "cider"], "bootstrap": 200},
    }, "eval_driver")
    run = RecipeRun(config)
    models = {name: Path(folder) for name, folder in inputs["models"].items()}
    return evaluate_models(run, models, prepare_test_sets(run))


def main() -> None:
    """Evaluate (see the module docstring)."""
    relaunch_cpu_processes()
    run_dir, data_root, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(",")
    state = process_state()
    from pacs.captioner.modeling import train_xe

    captioned = []
    original = train_xe.generate_captions

    def counting(model, vocab, features, image_ids, *args, **kwargs):
        captioned.extend(image_ids)
        return original(model, vocab, features, image_ids, *args, **kwargs)

    train_xe.generate_captions = counting  # counts the images this process captions
    evaluate(run_dir, data_root, names)
    print_line(f"CAPTIONED {state.process_index} {len(captioned)}")
    state.wait_for_everyone()
    if state.is_main_process:
        print(f"WORLD {state.num_processes}", flush=True)


if __name__ == "__main__":
    main()
