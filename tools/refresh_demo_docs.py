"""Rewrite the demo's printed results in docs/demo.md from the files of a finished run.

    python tools/refresh_demo_docs.py [RUN_DIR]      # default runs/demo

Runs nothing: it reads RUN_DIR/results.json (the system-level table with the human row and its protocol, each
reward's gain, the changes against XE and against the human row with their intervals and the findings, exactly as
the run printed them: `pacs.captioner.demo.pipeline.results_markdown`; a results.json written before the human row
existed still renders), RUN_DIR/correlation/correlation.json and
RUN_DIR/stages/**/*.json (several seeds: `stages/seed-<s>/`), and replaces the text between
`<!-- demo-results:begin -->` and `<!-- demo-results:end -->` in docs/demo.md (the one copy: the README links
it). It also writes docs/demo_findings.json:
the run's findings as records (`{subject, claim, holds, interval, seeds, text}`), its seeds and its bootstrap, so
two runs' findings can be compared as sets of (subject, claim, holds).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pacs.captioner.demo.pipeline import results_markdown
from pacs.captioner.orchestration.judge_correlation import correlation_extras, read_correlation
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import replace_marked_block, write_text_atomic

BEGIN, END = "<!-- demo-results:begin -->", "<!-- demo-results:end -->"
ROOT = Path(__file__).resolve().parents[1]
METRIC_NAMES = {"clip-s": "CLIP-S", "ref-clip-s": "RefCLIP-S", "pac-s++": "PAC-S++", "ref-pac-s++": "RefPAC-S++",
                "bleu4": "BLEU-4", "cider": "CIDEr-D", "length": "length", "clip-s chunk": "CLIP-S (chunk)",
                "ref-clip-s chunk": "RefCLIP-S (chunk)", "pac-s++ chunk": "PAC-S++ (chunk)",
                "ref-pac-s++ chunk": "RefPAC-S++ (chunk)"}



def _tau(value: float | None) -> str:
    """A Kendall tau ×100 cell; `null` (a constant metric: tau undefined) is written as n/a."""
    return "n/a" if value is None else f"{value:.1f}"

def block(run_dir: Path) -> str:
    """The generated markdown: results as printed, stage seconds, correlation with the judge."""
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    parts = [results_markdown(results)]
    seconds = {}
    for record in sorted((run_dir / "stages").rglob("*.json"), key=lambda path: path.stat().st_mtime):
        data = json.loads(record.read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("seconds"), (int, float)):
            seconds[data.get("stage", record.stem)] = float(data["seconds"])
    if seconds:  # each stage's record keeps the seconds of the run that computed it (a cached re-run: 0)
        parts.append("Stage wall seconds of the run that computed each stage (`stages/<stage>.json`): "
                     + ", ".join(f"{name} {value:.1f}" for name, value in seconds.items())
                     + f"; total {sum(seconds.values()):.0f} s"
                     + (" (a sum: the stages of seeds trained in parallel overlap in wall time)"
                        if any(name.startswith("seed-") for name in seconds) else "") + ".\n")
    correlation_path = run_dir / "correlation" / "correlation.json"
    if correlation_path.is_file():
        correlation = json.loads(correlation_path.read_text(encoding="utf-8"))
        lines = ["| metric | τb | τc |", "|---|---|---|"]
        lines += [f"| {METRIC_NAMES.get(name, name)} | {_tau(value['tau_b'])} | {_tau(value['tau_c'])} |"
                  for name, value in correlation.items() if isinstance(value, dict) and "tau_b" in value]
        parts.append("Kendall ×100 of each metric against the judge (`correlation/correlation.json`; "
                     "`chunk`: `--long-captions chunk`):\n\n" + "\n".join(lines) + "\n")
        parts += correlation_extras(read_correlation(run_dir / "correlation"))  # the paired comparisons and the long-caption table
    return "\n".join(parts)


def findings_json(run_dir: Path) -> dict:
    """docs/demo_findings.json: the run's findings records with its seeds and bootstrap (results.json's)."""
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    records = [r for r in results.get("findings", []) if isinstance(r, dict)]
    return {"seeds": results.get("seeds"), "bootstrap": results.get("bootstrap"),
            "replication": results.get("replication"),
            "claims": sorted(([r["subject"], r["claim"], r["holds"]] for r in records
                              if all(k in r for k in ("subject", "claim", "holds"))), key=lambda c: (c[0], c[1])),
            "findings": records}


def replace_block(text: str, content: str, name: str) -> str:
    """`text` with the part between the markers replaced by `content`."""
    return replace_marked_block(text, BEGIN, END, content, name)


def main(argv: list[str] | None = None) -> int:
    """Refresh docs/demo.md and docs/demo_findings.json; exit 2 on a missing run or markers."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", default=str(ROOT / "runs" / "demo"))
    args = parser.parse_args(argv)
    try:
        run_dir = Path(args.run_dir)
        if not (run_dir / "results.json").is_file():
            raise InputError(f"{run_dir}: no results.json (run `accelerate launch recipes/scst_pacs.py` first)")
        content = block(run_dir)
        path = ROOT / "docs" / "demo.md"
        write_text_atomic(path, replace_block(path.read_text(encoding="utf-8"), content, str(path)))
        print(f"refreshed {path}")
        target = ROOT / "docs" / "demo_findings.json"
        write_text_atomic(target, json.dumps(findings_json(run_dir), indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {target}")
    except InputError as error:
        print(f"refresh_demo_docs: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
