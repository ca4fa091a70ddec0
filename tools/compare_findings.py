"""Compare the findings of two demo runs as sets of (subject, claim, holds) — e.g. `threads: 1` against `threads: 2`
(issue 32 item 5: the claims should not depend on the machine's float rounding).

    python tools/compare_findings.py RUN_A RUN_B      # run folders, results.json files or demo_findings.json files

Prints the claims both runs make alike, then those that differ (only in one run, or with another `holds`), and
exits 0 when the two sets are equal, 1 when they differ, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from metric.common.errors import InputError


def claims(path: Path) -> dict[tuple[str, str], object]:
    """`{(subject, claim): holds}` of a run folder, its results.json, or a docs/demo_findings.json."""
    file = path / "results.json" if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise InputError(f"{file}: not a readable JSON file ({error})") from None
    records = data.get("findings") if isinstance(data, dict) else None
    if not isinstance(records, list) or not all(isinstance(r, dict) and {"subject", "claim", "holds"} <= set(r)
                                               for r in records):
        raise InputError(f"{file}: no findings records (`findings: [{{subject, claim, holds, ...}}]`, pacs 0.6)")
    return {(r["subject"], r["claim"]): r["holds"] for r in records}


def compare(a: dict[tuple[str, str], object], b: dict[tuple[str, str], object]) -> tuple[list[str], list[str]]:
    """(lines of the claims alike, lines of the claims that differ), in a stable order."""
    same, differ = [], []
    for key in sorted(set(a) | set(b)):
        left, right = a.get(key, "absent"), b.get(key, "absent")
        line = f"{key[0]}: {key[1]}"
        if left == right:
            same.append(f"{line} — {left}")
        else:
            differ.append(f"{line} — A: {left}, B: {right}")
    return same, differ


def main(argv: list[str] | None = None) -> int:
    """Print the comparison; 0 equal, 1 different, 2 bad input."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    args = parser.parse_args(argv)
    try:
        same, differ = compare(claims(Path(args.run_a)), claims(Path(args.run_b)))
    except InputError as error:
        print(f"compare_findings: error: {error}", file=sys.stderr)
        return 2
    print(f"{len(same)} claims alike, {len(differ)} differ")
    for line in differ:
        print(f"  differs: {line}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
