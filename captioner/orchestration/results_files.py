"""The one results writer: results.json, results.csv and results.md of every table pacs prints — a recipe's
evaluation (`eval/`), its seeds pooled (`seeds/`), a comparison of rewards, the demo's table and pooled demo runs.

results.json is the run's results as given. results.csv has the label columns (`model`, `test_set`, `reward`),
the value columns (`pacs.eval.columns.TABLE_COLUMNS` order) and, for every column some row has an interval of,
`Δ<column> low` / `Δ<column> high`. results.md is `results_markdown`: the table, then each section the results
hold (seeds, each reward's own gain, the share of the oracle's gain, the change of every column against XE and
against the human row, the guards' choices, the findings and their replication, the metrics' correlation with
the judge).
"""
from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pacs.captioner.orchestration import findings
from pacs.captioner.orchestration import guard_choice as guard_menu
from pacs.captioner.orchestration.judge_correlation import correlation_markdown
from pacs.eval.columns import TABLE_COLUMNS
from pacs.metric.common.io import csv_cells, write_json_atomic, write_text_atomic

DIGITS = 3
"""Decimals of a value cell in results.md (the demo prints 2: `pacs.captioner.demo.pipeline.DEMO_DIGITS`)."""


def split_columns(columns: Sequence[str]) -> tuple[list[str], list[str]]:
    """(label columns, value columns) of a table's columns: the values are the results-table columns, the labels
    the rest (`model` when none is given)."""
    values = [c for c in columns if c in TABLE_COLUMNS]
    return [c for c in columns if c not in TABLE_COLUMNS] or ["model"], values


def write_results(folder: Path, results: Mapping[str, Any] | Sequence[Mapping[str, Any]], columns: Sequence[str],
                  digits: int = DIGITS) -> None:
    """results.json (`results`; rows alone: `{"columns": columns, "rows": rows}`), results.csv and results.md
    (`results_markdown`) of a table whose label and value columns are `columns`, in `folder`."""
    if not isinstance(results, Mapping):
        results = {"columns": list(columns), "rows": list(results)}
    rows = results["rows"]
    write_json_atomic(folder / "results.json", results)
    labels, values = split_columns(columns)
    ci_columns = [c for c in values if any(c in (row.get("ci") or {}) for row in rows)]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*labels, *values, *(f"Δ{c} {end}" for c in ci_columns
                                                                    for end in ("low", "high"))],
                            extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        flat = dict(row)
        for column, (low, high) in (row.get("ci") or {}).items():
            flat[f"Δ{column} low"], flat[f"Δ{column} high"] = low, high
        writer.writerow(csv_cells(flat))  # a model or test-set name is never a live spreadsheet formula
    write_text_atomic(folder / "results.csv", buffer.getvalue())
    write_text_atomic(folder / "results.md", results_markdown(results, [*labels, *values], digits))


def results_markdown(results: Mapping[str, Any], columns: Sequence[str] | None = None, digits: int = DIGITS) -> str:
    """The printed results: the table (with the human row and its protocol), each reward's own gain, every
    column's change against XE and against the human row, the guards' choices, the findings. `columns`: the
    table's label and value columns (default: results.json's `columns`)."""
    labels, values = split_columns(columns if columns is not None else results.get("columns") or [])
    parts = []
    human = results.get("human_baseline")
    if human:
        parts.append(f"System-level table (`pacs.eval.system_table`, the code path of `pacs evaluate --candidates "
                     f"NAME=FILE ... --human-baseline`, seed {human.get('seed')}): {human.get('header')}. The `human` "
                     "row is one of the world's references per test image (its index in `results.json` "
                     "`human_baseline.held_out`); its Judge-acc, Judge and Halluc. are the judge's verdicts on it.\n")
    seeds, boot = results.get("seeds") or [], results.get("bootstrap") or {}
    if len(seeds) > 1:
        parts.append(f"Every value is the {boot.get('point', 'mean over seeds')} ({len(seeds)} training seeds: "
                     f"{', '.join(map(str, seeds))}; XE and every SCST run trained once per seed on the same data); "
                     f"every interval a {boot.get('method', 'paired stratified bootstrap')} "
                     f"({boot.get('resamples')} resamples).\n")
    rows = results["rows"]
    parts.append(table_markdown(rows, labels, values, digits))
    seed_column = next((c for c in (findings.JUDGE, "C") if any(c in (r.get("value_ci") or {}) for r in rows)), None)
    if len(seeds) > 1 and seed_column:
        parts.append(f"{seed_column} per seed, and its {boot.get('point', 'mean over seeds')} with the 95% interval:"
                     "\n\n" + findings.seed_table(rows, seeds, seed_column))
    interval = "paired stratified bootstrap over seeds and images" if len(seeds) > 1 else "paired bootstrap"
    if results.get("reward_gains"):
        parts.append(f"Each reward's own value on the test split ({interval}, "
                     f"{results['bootstrap_resamples']} resamples, 95% interval of SCST − XE):\n\n"
                     + findings.gains_table(results["reward_gains"]))
    for comparison in results.get("mix_normalisation") or []:  # scst.normalised_rewards against the weighted sum
        where = f" on {comparison['test_set']}" if comparison.get("test_set") else ""  # a recipe's: per test set
        parts.append(f"`{comparison['model']}` − `{comparison['versus']}`{where} ({comparison['column']}, each component "
                     f"normalised within the image's k samples vs the weighted sum; {interval}, 95% interval): "
                     f"{findings.signed(comparison['delta'])} pts [{findings.signed(comparison['ci'][0])}, "
                     f"{findings.signed(comparison['ci'][1])}]\n")
    if results.get("share_of_oracle"):
        parts.append(f"Each model's Judge-acc change against XE as a share of the oracle's (`{results.get('oracle')}`, "
                     "SCST with the judge as the reward; 95% interval on the same resamples):\n\n"
                     + findings.share_table(results["share_of_oracle"]))
    with_ci = [c for c in values if any(c in (row.get("ci") or {}) for row in rows)]
    if with_ci:  # (corpus statistics such as a recipe's B-4 and Rep-n have no per-image values, so no interval)
        parts.append("Change of every column against XE (95% interval):\n\n"
                     + findings.delta_table(rows, with_ci, labels=labels))
    if results.get("versus_human"):
        versus = [{"model": name, **entry} for name, entry in results["versus_human"].items()]
        parts.append("Change of every column against the human row (paired 95% interval of row − human):\n\n"
                     + findings.delta_table(versus, values, "Δ vs human"))
    parts += _guard_sections(results.get("guarded") or {})
    if results.get("findings"):
        parts.append("What the run found:\n\n" + "".join(f"* {findings.finding_text(line)}\n"
                                                           for line in results["findings"]))
    verdicts = (results.get("guarded") or {}).get("verdicts") or []
    if verdicts:
        parts.append("Which guards held:\n\n" + "".join(f"* {line}\n" for line in verdicts))
    if (results.get("replication") or {}).get("text"):
        parts.append(results["replication"]["text"])
    for set_name, record in (results.get("correlation") or {}).items():  # a recipe's `evaluation.correlation`
        parts.append(correlation_markdown(record, f"correlation/{set_name}"))
    return "\n".join(parts)


def _guard_sections(guarded: Mapping[str, Any]) -> list[str]:
    """The KL coefficient chosen per guarded reward and seed, and every guard's choice record."""
    by_seed = guarded.get("choices_by_seed") or {}
    if not by_seed:
        return []
    parts, chosen = [], {}
    for seed, choices in by_seed.items():
        for reward, choice in choices.items():
            if "chosen_kl_coef" not in choice:
                continue
            tried = ", ".join(choice.get("val_cider", {}))
            chosen.setdefault((reward, tried), []).append(f"seed {seed}: {choice['chosen_kl_coef']:g}")
    if chosen:
        parts.append("The KL coefficient of each guarded row, chosen on the validation split by CIDEr-D (never on "
                     "test): " + "; ".join(f"{reward} (among {tried}) {', '.join(items)}"
                                           for (reward, tried), items in chosen.items()) + ".\n")
    menu = guard_menu.choices_table(by_seed)
    return [*parts, menu] if menu else parts


def table_markdown(rows: Sequence[Mapping[str, Any]], labels: Sequence[str], columns: Sequence[str],
                   digits: int = DIGITS) -> str:
    """The results table as markdown: a row per entry, numbers with `digits` decimals; a value the row holds as
    None (the human row's B-4, a metric that could not be computed) is '-', one it does not hold is blank."""
    lines = ["| " + " | ".join([*labels, *columns]) + " |", "|---" * (len(labels) + len(columns)) + "|"]
    for row in rows:
        cells = [f"{row[c]:.{digits}f}" if isinstance(row.get(c), (int, float)) else "-" if c in row else ""
                 for c in columns]
        lines.append("| " + " | ".join([*(str(row.get(label, "")) for label in labels), *cells]) + " |")
    return "\n".join(lines) + "\n"
