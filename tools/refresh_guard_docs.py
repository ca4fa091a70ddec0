"""Rewrite the demo_guards preset's printed results in docs/demo.md ("Guards") from the files of a finished run.

    python tools/refresh_guard_docs.py [RUN_DIR]      # default runs/demo_guards

Runs nothing: it reads RUN_DIR/results.json and replaces the text between `<!-- demo-guards:begin -->` and
`<!-- demo-guards:end -->` with what the run printed (`pacs.captioner.demo.pipeline.results_markdown`: the table,
each guard's choice on validation, the findings) and the run's wall seconds per stage.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pacs.captioner.demo.pipeline import results_markdown
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import replace_marked_block, write_text_atomic

BEGIN, END = "<!-- demo-guards:begin -->", "<!-- demo-guards:end -->"
ROOT = Path(__file__).resolve().parents[1]


def block(run_dir: Path, machine: str) -> str:
    """The generated markdown: the machine, the stage seconds' sum, the results as printed."""
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    seconds = 0.0
    for record in (run_dir / "stages").rglob("*.json"):
        data = json.loads(record.read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("seconds"), (int, float)):
            seconds += float(data["seconds"])
    return (f"Measured on {machine}; the stages' wall seconds sum to {seconds:.0f} s (seeds trained in parallel "
            f"overlap).\n\n" + results_markdown(results))


def main(argv: list[str] | None = None) -> int:
    """Refresh the Guards block of docs/demo.md; exit 2 on a missing run or markers."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", default=str(ROOT / "runs" / "demo_guards"))
    parser.add_argument("--machine", default="a shared 2-core machine", help="the machine the run was measured on")
    args = parser.parse_args(argv)
    try:
        run_dir, path = Path(args.run_dir), ROOT / "docs" / "demo.md"
        if not (run_dir / "results.json").is_file():
            raise InputError(f"{run_dir}: no results.json (run `pacs train --config demo_guards` first)")
        text = path.read_text(encoding="utf-8")
        write_text_atomic(path, replace_marked_block(text, BEGIN, END, block(run_dir, args.machine), str(path)))
        print(f"refreshed {path}")
    except InputError as error:
        print(f"refresh_guard_docs: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
