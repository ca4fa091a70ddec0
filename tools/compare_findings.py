"""Compare the findings of two demo runs as sets of (subject, claim, holds) — e.g. `threads: 1` against `threads: 2`
(issue 32 item 5: the claims should not depend on the machine's float rounding).

    python tools/compare_findings.py RUN_A RUN_B      # run folders, results.json files or demo_findings.json files

Prints the claims both runs make alike, then those that differ (only in one run, or with another `holds`), and exits
0 when the two sets are equal, 1 when they differ, 2 on bad input. Records of pacs 0.7 carry the probability that an
independent replication agrees (`replication.agrees`): each differing claim then shows it for both runs, and the
summary gives the number of disagreements each run's own intervals predicted, the number observed (its rated claims
the other run states otherwise), and the *robust contradictions*: differing claims that no run stating them marks
fragile (agrees below `pacs.captioner.orchestration.findings.FRAGILE`) or seed-dependent — the ones the findings' replication
estimate failed to flag.

Every input is data: a file that is not a regular file (a FIFO, a device), is larger than `MAX_INPUT_BYTES`, is not
UTF-8 JSON (nesting too deep, a key repeated), or whose records have the wrong JSON types (a `subject` that is no
string, an `agrees` that is no probability) is one line naming it and exit 2; the runs' text (subjects, claims) is
printed with its control characters escaped (`pacs.metric.common.terminal.escape_control`).
"""
from __future__ import annotations

import argparse
import math
import os
import stat
import sys
from pathlib import Path
from typing import Any

from pacs.captioner.orchestration.findings import FRAGILE, SEED_DEPENDENT
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file
from pacs.metric.common.terminal import escape_control

#: the largest findings file read (a demo run's results.json is tens of kilobytes)
MAX_INPUT_BYTES = 64 * 2 ** 20

Claim = tuple[object, float | None]
"""A claim's `holds` and the probability that a replication agrees (None: not recorded)."""


def _regular_file(file: Path) -> Path:
    """`file` when it is a regular file of at most `MAX_INPUT_BYTES` (links followed); InputError otherwise."""
    try:
        info = os.stat(file)
    except OSError as error:
        raise InputError(f"{file}: not a readable JSON file ({error.strerror or error})") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{file}: not a regular file (a FIFO, a device or a folder): a findings file is a "
                         "results.json or demo_findings.json")
    if info.st_size > MAX_INPUT_BYTES:
        raise InputError(f"{file}: {info.st_size} bytes, above the {MAX_INPUT_BYTES} bytes a findings file may have")
    return file


def _record(file: Path, index: int, record: Any) -> tuple[tuple[str, str], Claim]:
    """((subject, claim), (holds, agrees)) of `findings[index]`; InputError naming the field of the wrong type."""
    where = f"{file}: findings[{index}]"
    if not isinstance(record, dict) or not {"subject", "claim", "holds"} <= set(record):
        raise InputError(f"{file}: no findings records (`findings: [{{subject, claim, holds, ...}}]`, pacs 0.6)")
    for key in ("subject", "claim"):
        if not isinstance(record[key], str):
            raise InputError(f"{where}.{key}: expected a string, got {type(record[key]).__name__}")
    holds = record["holds"]
    if not isinstance(holds, (bool, str)):
        raise InputError(f"{where}.holds: expected true, false or a string such as {SEED_DEPENDENT!r}, got "
                         f"{type(holds).__name__}")
    replication = record.get("replication")
    if replication is not None and not isinstance(replication, dict):
        raise InputError(f"{where}.replication: expected an object, got {type(replication).__name__}")
    agrees = (replication or {}).get("agrees")
    if agrees is not None and (isinstance(agrees, bool) or not isinstance(agrees, (int, float))
                               or not math.isfinite(agrees) or not 0.0 <= agrees <= 1.0):
        shown = repr(agrees) if len(repr(agrees)) <= 60 else f"{type(agrees).__name__} {repr(agrees)[:57]}..."
        raise InputError(f"{where}.replication.agrees: expected a probability (a number in [0, 1]) or null, got "
                         f"{shown}")
    return (record["subject"], record["claim"]), (holds, None if agrees is None else float(agrees))


def claims(path: Path) -> dict[tuple[str, str], Claim]:
    """`{(subject, claim): (holds, agrees)}` of a run folder, its results.json, or a docs/demo_findings.json."""
    file = path / "results.json" if path.is_dir() else path
    data = read_json_file(_regular_file(file), "findings")
    records = data.get("findings") if isinstance(data, dict) else None
    if not isinstance(records, list):
        raise InputError(f"{file}: no findings records (`findings: [{{subject, claim, holds, ...}}]`, pacs 0.6)")
    return dict(_record(file, index, record) for index, record in enumerate(records))


def compare(a: dict[tuple[str, str], Claim], b: dict[tuple[str, str], Claim]) -> tuple[list[str], list[str], int]:
    """(lines of the claims alike, lines of the claims that differ, the robust contradictions), in a stable
    order."""
    same, differ, robust = [], [], 0
    for key in sorted(set(a) | set(b)):
        (left, left_agrees), (right, right_agrees) = a.get(key, ("absent", None)), b.get(key, ("absent", None))
        line = f"{key[0]}: {key[1]}"
        if left == right:
            same.append(f"{line} — {left}")
            continue
        flagged = [holds == SEED_DEPENDENT or agrees < FRAGILE for holds, agrees in ((left, left_agrees),
                                                                                     (right, right_agrees))
                   if holds != "absent" and (agrees is not None or holds == SEED_DEPENDENT)]
        robust += bool(flagged) and not any(flagged)
        shown = "" if left_agrees is None and right_agrees is None else (
            f" (a replication agrees: A {_probability(left_agrees)}, B {_probability(right_agrees)})")
        differ.append(f"{line} — A: {left}, B: {right}{shown}")
    return same, differ, robust


def _probability(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def expected(records: dict[tuple[str, str], Claim]) -> float | None:
    """The number of claims a replication decides otherwise, predicted by a run's own intervals (None: 0.6)."""
    agrees = [agrees for _, agrees in records.values() if agrees is not None]
    return sum(1.0 - value for value in agrees) if agrees else None


def decided_otherwise(records: dict[tuple[str, str], Claim], other: dict[tuple[str, str], Claim]) -> int:
    """How many of a run's rated claims (those `expected` counts) the other run does not state with the same
    `holds`: the observed counterpart of `expected`."""
    return sum(1 for key, (holds, agrees) in records.items()
               if agrees is not None and other.get(key, ("absent", None))[0] != holds)


def main(argv: list[str] | None = None) -> int:
    """Print the comparison; 0 equal, 1 different, 2 bad input."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    args = parser.parse_args(argv)
    try:
        a, b = claims(Path(args.run_a)), claims(Path(args.run_b))
    except InputError as error:
        print(f"compare_findings: error: {escape_control(str(error))}", file=sys.stderr)
        return 2
    same, differ, robust = compare(a, b)
    print(f"{len(same)} claims alike, {len(differ)} differ")
    if expected(a) is not None and expected(b) is not None:
        print(f"predicted by each run's intervals: {expected(a):.1f} (A), {expected(b):.1f} (B) claims decided "
              f"otherwise; observed: {decided_otherwise(a, b)} (A's decided otherwise by B), "
              f"{decided_otherwise(b, a)} (B's by A); robust contradictions (differing, and fragile in neither run): "
              f"{robust}")
    for line in differ:
        print(escape_control(f"  differs: {line}"))  # subjects and claims are the runs' text
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
