"""Fine-tune one XE checkpoint with each reward and evaluate every result on the chosen test sets, writing a
PAC-S++ Table 9/10-style comparison (markdown + CSV) into `<run_dir>/compare_rewards/results.{md,csv,json}`.

    accelerate launch recipes/compare_rewards.py --config recipes/configs/coco_vitb32_base.yaml \
        [--reward cider --reward pac-s++ ...] [--seeds 0 1 2] [key=value ...]

Columns: B-4, M, C, S, CLIP-S, PAC-S++, RefCLIP-S, RefPAC-S++, Rep-1..4, %Incorrect; one block of rows per
test set (COCO, nocaps overall + in/near/out-domain, VizWiz, CC3M — whichever `evaluation.test_sets` lists).
Every non-XE row gets paired bootstrap 95% intervals of (row − XE) over the test images for C, S and the
contrastive columns (`pacs.eval.intervals`, `evaluation.bootstrap` resamples; `captioner/orchestration/eval_intervals.py`):
`ci` in results.json, `Δ<column> low/high` in results.csv, a second table in results.md.
With `--seeds` (two or more) XE and every reward are trained once per seed (`<run_dir>/seed-<s>/`, the features
extracted once; `pacs.captioner.orchestration.seed_runs`): each row is the mean over seeds (IQM from 5) and its interval
a paired stratified bootstrap over seeds and images; results.json keeps every seed's row (`seed_rows`).
A stage whose recorded fingerprint is unchanged is skipped, so adding a reward later only trains that reward;
a changed setting re-runs the stages it determines; `--force STAGE` re-runs one stage.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pacs.captioner.modeling.training_setup import process_state
from pacs.captioner.orchestration.evaluation import row_columns
from pacs.captioner.orchestration.launching import relaunch_cpu_processes
from pacs.captioner.orchestration.pipeline import PipelineConfig, run_pipeline
from pacs.captioner.orchestration.results_files import write_results
from pacs.captioner.orchestration.seed_runs import run_seeds
from pacs.metric.common.config import load_config
from pacs.metric.common.os_errors import user_error_line
from pacs.metric.common.terminal import setup_terminal_logging
from pacs.rewards.registry import check_reward_list

DEFAULT_REWARDS = ("cider", "clip-s", "ref-clip-s", "pac-s++", "ref-pac-s++")


def comparison_rows(rows: list[dict], rewards: list[str]) -> list[dict]:
    """Order rows by test set, then XE first and the rewards in the given order (the paper's layout)."""
    order = {name: index for index, name in enumerate(["xe", *rewards])}
    sets = list(dict.fromkeys(row["test_set"] for row in rows))
    return sorted((dict(row, reward="– (XE)" if row["model"] == "xe" else row["model"]) for row in rows),
                  key=lambda row: (sets.index(row["test_set"]), order.get(row["model"], len(order))))


def add_seed_rows(path: Path, seed_rows: list[dict], config: PipelineConfig) -> None:
    """Keep every seed's row, the seeds and the pooling method in the comparison's results.json."""
    from pacs.eval.intervals import METHOD, point_name
    from pacs.metric.common.io import write_json_atomic

    results = json.loads(path.read_text(encoding="utf-8"))
    results.update(seeds=list(config.seeds), seed_rows=seed_rows,
                   bootstrap={"method": METHOD, "resamples": config.evaluation.bootstrap, "seeds": len(config.seeds),
                              "point": point_name(len(config.seeds))})
    write_json_atomic(path, results)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True,
                        help="a recipe YAML file or packaged config name (e.g. coco_vitb32_base = "
                             "recipes/configs/coco_vitb32_base.yaml)")
    parser.add_argument("--reward", action="append", dest="rewards",
                        help="a reward spec, repeatable (default: cider, clip-s, ref-clip-s, pac-s++, ref-pac-s++; "
                             "mixes like 'cider:1,pac-s++:0.5' are one spec)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, metavar="SEED",
                        help="train XE and every reward once per seed (e.g. --seeds 0 1 2) and pool the rows over "
                             "seeds (default: the config's seeds, else its seed)")
    parser.add_argument("--force", action="append", default=[], metavar="STAGE",
                        help="re-run STAGE (and every stage below it) from scratch; repeatable")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)
    setup_terminal_logging()
    try:
        relaunch_cpu_processes()
        config = load_config(PipelineConfig, args.config, args.overrides)
        config.rewards = args.rewards or list(DEFAULT_REWARDS)
        check_reward_list(config.rewards, "--reward", flag="--reward")
        config.force = [*config.force, *args.force]
        if args.seeds is not None:
            config.seeds = list(args.seeds)
            config.validate()
        if len(config.seeds) > 1:
            result = run_seeds(config)
        else:
            config.seed = config.seeds[0] if config.seeds else config.seed
            result = run_pipeline(config)
        if process_state().is_main_process:  # the other processes hold no rows
            rows = comparison_rows(result["rows"], config.rewards)
            folder = Path(config.run_dir) / "compare_rewards"
            write_results(folder, rows, ["test_set", "reward", *row_columns(rows)])
            if result.get("seed_rows"):
                add_seed_rows(folder / "results.json", result["seed_rows"], config)
            print((Path(config.run_dir) / "compare_rewards" / "results.md").read_text(encoding="utf-8"))
    except Exception as error:  # user errors, a full disk (safetensors' too), an unwritable folder: one line, exit 2
        message = user_error_line(error, resumable=True)  # its stages are kept and resume
        if message is None:
            raise
        print(f"compare_rewards: error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
