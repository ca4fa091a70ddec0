"""Rewrite the demo_guards preset's printed results in docs/demo.md ("Guards") from the files of a finished run.

    python tools/refresh_guard_docs.py [RUN_DIR]      # default runs/demo_guards

Runs nothing: it reads RUN_DIR/results.json and replaces the text between `<!-- demo-guards:begin -->` and
`<!-- demo-guards:end -->` with what each guard did (`guard_effects`: the change against XE of length, repetition,
hallucination and judge accuracy from results.json, and omission: the share of test captions the judge finds
correct but incomplete, judged again from each seed's evaluate/captions.json), then what the run printed
(`pacs.captioner.demo.pipeline.results_markdown`: the table, each guard's choice on validation, the findings) and
the run's wall seconds per stage.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pacs.captioner.demo.data import DemoData
from pacs.captioner.demo.judge import judge_caption
from pacs.captioner.demo.pipeline import results_markdown
from pacs.captioner.demo.pooling import run_config
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import replace_marked_block, write_text_atomic

BEGIN, END = "<!-- demo-guards:begin -->", "<!-- demo-guards:end -->"
ROOT = Path(__file__).resolve().parents[1]
#: the columns of `guard_effects` (table column -> what it shows)
EFFECTS = {"Length": "words", "Rep-2": "repeated word pairs", "Halluc.": "% absent shapes named",
           "Judge-acc": "% judged correct"}


def verdict_shares(run_dir: Path, results: dict, verdict: str = "incomplete") -> dict[str, list[float]]:
    """Per row, per seed: the % of its test captions with the judge's `verdict` ("incomplete": clean, but an object
    left out; "correct": the row's Judge-acc)."""
    config = run_config(run_dir)
    scenes = DemoData.build(config.world, run_dir / "data" / "images").scenes()
    seeds = results.get("seeds") or [config.seed]
    folders = [run_dir / "evaluate" / f"seed-{seed}" for seed in seeds] if len(seeds) > 1 else [run_dir / "evaluate"]
    shares: dict[str, list[float]] = {}
    for folder in folders:
        captions = json.loads((folder / "captions.json").read_text(encoding="utf-8"))
        for model, by_image in captions.items():
            verdicts = [judge_caption(text, scenes[image]).verdict for image, text in by_image.items()]
            shares.setdefault(model, []).append(100.0 * verdicts.count(verdict) / max(1, len(verdicts)))
    return shares


def _cell(row: dict, column: str) -> str:
    delta, ci = (row.get("delta") or {}).get(column), (row.get("ci") or {}).get(column)
    if delta is None:
        return f"{row.get(column):.2f}" if isinstance(row.get(column), (int, float)) else "—"
    return f"{delta:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else f"{delta:+.2f}"


def guard_effects(run_dir: Path, results: dict) -> str:
    """The markdown table of what each guard did against XE, for every unguarded and guarded row of a guarded
    reward and the oracle: the change of each `EFFECTS` column (95% interval) and the omission share per seed."""
    guarded = {reward for by_reward in ((results.get("guarded") or {}).get("choices_by_seed") or {}).values()
               for reward in by_reward}
    wanted = ["xe", *[row["model"] for row in results["rows"]
                      if any(row["model"] == f"scst {r}" or row["model"].startswith(f"scst {r} +") for r in guarded)]]
    if results.get("oracle"):
        wanted.append(results["oracle"])
    shares = verdict_shares(run_dir, results)
    rows = {row["model"]: row for row in results["rows"]}
    lines = [f"| row | {' | '.join(f'Δ {c} ({EFFECTS[c]})' for c in EFFECTS)} | omitted: % incomplete (per seed) |",
             "|---" * (len(EFFECTS) + 2) + "|"]
    for model in dict.fromkeys(wanted):
        if model not in rows:
            continue
        share = shares.get(model, [])
        mean = f"{sum(share) / len(share):.1f} ({', '.join(f'{v:.1f}' for v in share)})" if share else "—"
        lines.append(f"| {model} | {' | '.join(_cell(rows[model], c) for c in EFFECTS)} | {mean} |")
    return ("What each guard did, against XE (the xe row: its own values; Δ: mean over seeds, paired stratified "
            "bootstrap 95% interval; omission: the judge's `incomplete` verdicts on the test captions, judged again "
            "from each seed's `evaluate/` captions):\n\n" + "\n".join(lines) + "\n")


def block(run_dir: Path, machine: str) -> str:
    """The generated markdown: the machine, the stage seconds' sum, the results as printed."""
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    seconds = 0.0
    for record in (run_dir / "stages").rglob("*.json"):
        data = json.loads(record.read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("seconds"), (int, float)):
            seconds += float(data["seconds"])
    return (f"Measured on {machine}; the stages' wall seconds sum to {seconds:.0f} s (seeds trained in parallel "
            f"overlap).\n\n" + guard_effects(run_dir, results) + "\n" + results_markdown(results))


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
