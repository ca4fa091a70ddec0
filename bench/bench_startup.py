"""Benchmark: start-up time of `pacs` commands that need no model, against `python -c pass` and `import open_clip`.

Each command runs in a fresh interpreter (`python -m pacs ...`, what the `pacs` script runs); the table
gives the best wall time of `--repeats` runs and its ratio to the two baselines measured in the same run.
`--source DIR` times another checkout of pacs (e.g. an older commit in a `git worktree`) instead of the
installed one: DIR goes first on PYTHONPATH.

    PACS_SHARED=/work/shared python bench/bench_startup.py [--repeats 5] [--source DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import best_time


def commands(shared: Path | None, scratch: Path) -> list[tuple[str, list[str]]]:
    """(label, argv) of the timed commands; the text-only correlate only when the shared Flickr8k data is there."""
    (scratch / "candidates.json").write_text(json.dumps({"1": "a dog runs on the grass", "2": "two cats sleep"}))
    (scratch / "references.json").write_text(json.dumps({"1": ["a dog running on grass", "the dog runs"],
                                                         "2": ["two cats are sleeping", "cats asleep on a bed"]}))
    pacs = [sys.executable, "-m", "pacs.cli"]
    rows = [
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("python -c 'import open_clip'", [sys.executable, "-c", "import open_clip"]),
        ("pacs --help", [*pacs, "--help"]),
        ("pacs score --help", [*pacs, "score", "--help"]),
        ("pacs train --help", [*pacs, "train", "--help"]),
        ("pacs evaluate (bleu1,cider, no images)", [*pacs, "evaluate", "--candidates", "candidates.json",
                                                    "--references", "references.json", "--metrics", "bleu1,cider"]),
    ]
    flickr8k = shared / "data" / "flickr8k" if shared else None
    if flickr8k is not None and flickr8k.is_dir():
        rows.append(("pacs correlate flickr8k-expert --metrics bleu1,cider",
                     [*pacs, "correlate", "flickr8k-expert", "--data", str(flickr8k), "--metrics", "bleu1,cider"]))
    return rows


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    """Run one command, failing loudly when it fails."""
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")


def main() -> None:
    """Time every command and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="runs per command (the best is reported)")
    parser.add_argument("--source", type=Path, help="a pacs checkout to time instead of the installed one")
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if args.source:
        env["PYTHONPATH"] = os.pathsep.join([str(args.source.resolve()), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    shared = Path(os.environ["PACS_SHARED"]) if os.environ.get("PACS_SHARED") else None
    with tempfile.TemporaryDirectory() as scratch:
        times = {}
        for label, argv in commands(shared, Path(scratch)):
            run(argv, Path(scratch), env)  # warm the file cache once, untimed
            times[label], _ = best_time(lambda argv=argv: run(argv, Path(scratch), env), args.repeats)
    base, clip = times["python -c pass"], times["python -c 'import open_clip'"]
    print(f"source: {args.source or 'installed pacs'}; best of {args.repeats} runs\n")
    print("| command | seconds | × python -c pass | × import open_clip |")
    print("|---|---:|---:|---:|")
    for label, seconds in times.items():
        print(f"| `{label}` | {seconds:.2f} | {seconds / base:.1f} | {seconds / clip:.2f} |")


if __name__ == "__main__":
    main()
