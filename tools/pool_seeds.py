"""Evaluate the seeds of several finished demo runs (or recipe runs) as one run: the table, intervals and findings
over all of them.

    python tools/pool_seeds.py RUN[:S,S,...] RUN[:S,...] ... --out FOLDER

E.g. seeds 0-2 trained in runs/demo and seeds 3-5 in runs/demo_s345 (a copy of runs/demo's folder with
`seeds=[3,4,5] name=demo_s345`, so its metric stages are runs/demo's):

    python tools/pool_seeds.py runs/demo runs/demo_s345 --out runs/demo_6_seeds
    python tools/compare_findings.py runs/demo_6_seeds runs/other_6_seeds

The runs must be the same experiment: equal settings apart from name, runs_dir, seeds, threads, parallel_seeds,
force and device; bit-identical `clip` and `pacs` checkpoints and grid features; each seed taken once; every seed
stage finished with the files it recorded, its record the one of its folder, and no two seeds' models the same
bytes (`pacs.captioner.demo.pooling`). Recipe runs (`pacs train` folders, one seed each or a run over `seeds:`)
pool the per-image values their evaluation stages recorded, refused unless their settings are equal apart from
run_dir, seed, seeds, parallel_seeds, force, device and features.cache_dir, every evaluation stage is finished with
its files and settings, and every seed is scored on the same test images
(`pacs.captioner.orchestration.recipe_pooling`). FOLDER must not exist; it gets results.json,
results.md, pooled.json (each seed's run) and the evaluate stage's files, all at once. Prints results.md; exit 0,
or 2 with one line naming the run, setting, record or file that stops it (a bad --out and a full disk
included: nothing is left behind).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pacs.captioner.demo.pooling import parse_source, pool_seed_runs
from pacs.metric.common.errors import PacsError
from pacs.metric.common.terminal import escape_control


def main(argv: list[str] | None = None) -> int:
    """Pool the runs' seeds into --out and print the results; 0 done, 2 refused."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN[:S,S,...]", help="a finished demo or recipe run, optionally its seeds")
    parser.add_argument("--out", required=True, type=Path, help="the new folder of the pooled evaluation")
    args = parser.parse_args(argv)
    try:
        pool_seed_runs([parse_source(text) for text in args.runs], args.out)
    except PacsError as error:  # every refusal, a full disk or a bad --out included: one line
        print(f"pool_seeds: error: {escape_control(str(error))}", file=sys.stderr)
        return 2
    print((args.out / "results.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
