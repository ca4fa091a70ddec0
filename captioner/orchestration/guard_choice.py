"""The menu of SCST guards (issue 44) and their choice on the validation split, never with the judge: the demo's
and a recipe's `guarded:` section (`GuardedConfig`).

Each guard of `guarded.grid` (and the KL grid `guarded.kl_coefs`) is trained alone at every candidate setting, as
a run of the recipe's SCST (`pacs.captioner.modeling.train_scst.SCSTConfig` keys: nothing is re-implemented
here). Per guarded reward and seed, each guard's setting is chosen by `choose`: the highest validation CIDEr-D of
the run's selected checkpoint (the hacking monitor's, on validation images), ties broken by the fewest gaming
signatures of the hacking monitor at that checkpoint, then by the order of the grid. The "best combination" run
trains every guard at its chosen setting at once (`combination`; a setting that turns its guard off is left out).
The inputs of a choice are the stages' summaries (what `evidence` reads from the run's own monitor.csv), so no
test-split value and no judge value can reach it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from annotated_types import Ge

from pacs.captioner.modeling.hacking_monitor import GamingThresholds, gaming_signatures
from pacs.captioner.modeling.scst_guards import anchored_reward_spec
from pacs.metric.common.config import NonNegativeFloat
from pacs.metric.common.errors import InputError
from pacs.metric.common.suggest import known_hint


@dataclass(frozen=True)
class Guard:
    """One guard of the menu: its stage-label prefix, its table-row suffix, the value that turns it off."""

    prefix: str
    row: str
    off: Any


#: `guarded.grid` key (and `kl_coef`, whose grid is `guarded.kl_coefs`) -> the guard
GUARDS: dict[str, Guard] = {
    "kl_coef": Guard("kl", "KL", 0.0),  # SCSTConfig.kl_coef: per-token KL to the XE policy
    "length_mask_slack": Guard("mask", "length mask", None),  # SCSTConfig.length_mask on, with this slack
    "cider_anchor": Guard("anchor", "CIDEr-D anchor", 0.0),  # SCSTConfig.cider_anchor (+ the anchored spec)
    "stop_on_gaming": Guard("stop", "early stop", False),  # SCSTConfig.stop_on_gaming
    "rep_penalty": Guard("rep", "rep penalty", 0.0),  # a `rep-penalty` component of the reward spec
    "length_penalty": Guard("lenpen", "length penalty", 0.0),  # a `length-penalty` component of the reward spec
}
GRID_KEYS = tuple(key for key in GUARDS if key != "kl_coef")
"""The keys `guarded.grid` accepts (the KL grid is `guarded.kl_coefs`)."""
COMBINATION = "guards"
"""The stage-label suffix and table-row suffix of the best-combination run."""
CRITERION = ("validation CIDEr-D of the run's selected checkpoint (hacking monitor, validation split), highest "
             "first; ties: fewest hacking-monitor gaming signatures at that checkpoint, then the grid's order")


def check_grid(grid: Mapping[str, Sequence[Any]]) -> None:
    """One-line InputError naming the offending `guarded.grid` key or value."""
    for key, values in grid.items():
        if key == "kl_coef":
            raise InputError("guarded.grid.kl_coef: the KL grid is guarded.kl_coefs (the stage names "
                             "scst-<reward>-kl<coef> stay those of earlier runs)")
        if key not in GUARDS:
            raise InputError(f"guarded.grid.{key}: unknown guard {known_hint(key, GRID_KEYS)}")
        if not isinstance(values, (list, tuple)) or not values:
            raise InputError(f"guarded.grid.{key}={values!r}: expected a non-empty list of candidate settings")
        for value in values:
            if key == "stop_on_gaming":
                if not isinstance(value, bool):
                    raise InputError(f"guarded.grid.stop_on_gaming: {value!r} is not true or false")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise InputError(f"guarded.grid.{key}: {value!r} is not a finite number >= 0")
            elif key == "length_mask_slack" and int(value) != value:
                raise InputError(f"guarded.grid.length_mask_slack: {value!r} is not a whole number of words")
        if len(set(values)) != len(values):
            raise InputError(f"guarded.grid.{key}={list(values)}: a setting is listed twice")


def setting_label(key: str, value: Any) -> str:
    """The stage-label part of one guard setting: `kl0.2`, `mask2`, `anchor0.5`, `stop`, `rep0.5`, `lenpen0.25`."""
    guard = GUARDS[key]
    if key == "stop_on_gaming":
        return guard.prefix if value else f"no{guard.prefix}"
    return f"{guard.prefix}{value:g}"


def row_name(reward: str, key: str) -> str:
    """The table row of `reward` under guard `key` (its chosen setting): `scst pac-s++ +length mask`; the KL row
    keeps its name `scst <reward> +KL`."""
    return f"scst {reward} +{GUARDS[key].row}"


def combination_row(reward: str) -> str:
    """The table row of `reward` under every guard at its chosen setting: `scst <reward> +guards`."""
    return f"scst {reward} +{COMBINATION}"


def reward_spec(base: str, settings: Mapping[str, Any], rep_penalty: float = 0.0,
                length_penalty: float = 0.0) -> str:
    """The reward spec a guarded run trains on: `base`, its penalty components (the grid's setting, else the fixed
    `guarded.rep_penalty` / `length_penalty`), then the CIDEr-D anchor term (`scst_guards.anchored_reward_spec`)."""
    rep = settings.get("rep_penalty", rep_penalty)
    length = settings.get("length_penalty", length_penalty)
    parts = [f"{base}:1"] if (rep or length) else [base]
    if rep:
        parts.append(f"rep-penalty:{rep:g}")
    if length:
        parts.append(f"length-penalty:{length:g}")
    return anchored_reward_spec(",".join(parts), float(settings.get("cider_anchor", 0.0)))


def scst_keys(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe's SCSTConfig keys of a guarded run: each guard's own key, `select_by: cider` (the checkpoint with
    the best validation CIDEr-D), or `select_by: last` under `stop_on_gaming` (the kept model: the last monitored
    step before a gaming signature). A run of the KL guard alone gives exactly `{kl_coef, select_by}`."""
    keys: dict[str, Any] = {}
    if "kl_coef" in settings:
        keys["kl_coef"] = settings["kl_coef"]
    if settings.get("length_mask_slack") is not None:
        keys.update(length_mask=True, length_mask_slack=int(settings["length_mask_slack"]))
    if settings.get("cider_anchor"):
        keys["cider_anchor"] = float(settings["cider_anchor"])
    if settings.get("stop_on_gaming"):
        keys["stop_on_gaming"] = True
    keys["select_by"] = "last" if keys.get("stop_on_gaming") else "cider"
    return keys


def evidence(rows: Sequence[Mapping[str, float]], step: int, thresholds: GamingThresholds) -> dict[str, Any]:
    """What a choice reads of one run: the hacking monitor's validation CIDEr-D at the selected `step` and the gaming
    signatures of that row against the step-0 row (`rows`: the run's monitor.csv, validation images only)."""
    row = next((r for r in rows if int(r["step"]) == step), None)
    if row is None or not rows:
        return {"selected_step": step, "val_cider": None, "signatures": None}
    cider = float(row["cider"])
    names = [name for name, _ in gaming_signatures(rows[0], row, thresholds)] if step > 0 else []
    return {"selected_step": step, "val_cider": cider if math.isfinite(cider) else None, "signatures": names}


def choose(candidates: Sequence[Mapping[str, Any]]) -> int:
    """The index of the chosen candidate (`candidates[i]`: `val_cider`, `signatures`): `CRITERION`. ValueError when
    none has a finite validation CIDEr-D."""
    scored = [(i, c) for i, c in enumerate(candidates) if c.get("val_cider") is not None
              and math.isfinite(c["val_cider"])]
    if not scored:
        raise ValueError(f"no guarded run has a finite validation CIDEr-D: {list(candidates)}")
    return min(scored, key=lambda item: (-item[1]["val_cider"], len(item[1].get("signatures") or []), item[0]))[0]


def choice_record(reward: str, seed: int, key: str, candidates: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One guard's choice for `reward` and `seed`: its candidates (setting, stage, validation values), the
    criterion and the chosen setting."""
    index = choose(candidates)
    return {"reward": reward, "seed": seed, "guard": key, "criterion": CRITERION,
            "candidates": [dict(c) for c in candidates], "chosen": candidates[index]["setting"],
            "chosen_stage": candidates[index]["stage"]}


def combination(choices: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The settings of the best-combination run: every guard at its chosen setting, a setting that turns the guard
    off left out (`GUARDS[key].off`)."""
    return {key: record["chosen"] for key, record in choices.items() if record["chosen"] != GUARDS[key].off}


def _cell(candidate: Mapping[str, Any]) -> str:
    cider = candidate.get("val_cider")
    signatures = candidate.get("signatures")
    shown = "—" if cider is None else f"{cider:.4g}"
    return shown + (f" ({len(signatures)} sig.)" if signatures else "")


def choices_table(by_seed: Mapping[str, Mapping[str, Any]]) -> str:
    """The printed record of every guard's choice (`by_seed[seed][reward]["guards"]`): per reward, seed and guard,
    each setting's validation CIDEr-D (and gaming signatures), the chosen one in bold, and the combination; "" when
    no run declared `guarded.grid`."""
    lines = []
    for seed, choices in by_seed.items():
        for reward, choice in choices.items():
            menu = choice.get("guards")
            if not menu:
                continue
            for key, record in menu["choices"].items():
                cells = [(f"**{setting_label(key, c['setting'])}**" if c["stage"] == record["chosen_stage"]
                          else setting_label(key, c["setting"])) + f" {_cell(c)}" for c in record["candidates"]]
                lines.append(f"| {reward} | {seed} | {key} | {'; '.join(cells)} |")
            if "combination" in menu:
                combined = menu["combination"]
                settings = ", ".join(setting_label(k, v) for k, v in combined["settings"].items()) or "none"
                lines.append(f"| {reward} | {seed} | best combination | {settings}: {_cell(combined)} |")
    if not lines:
        return ""
    return ("Each guard's setting, chosen on the validation split (" + CRITERION + "; never on test, never with the "
            "judge; the chosen one in bold; records: `[seed-<s>/]guard_choice-<reward>.json`):\n\n"
            "| reward | seed | guard | validation CIDEr-D per setting |\n|---|---|---|---|\n"
            + "\n".join(lines) + "\n")


@dataclass
class GuardedConfig:
    """`guarded:` of a recipe or the demo: the same SCST as `scst` plus one guard of the menu at a time, every candidate
    setting trained and chosen on validation (`choose`). `kl_coefs` is the KL guard's grid (stages
    `scst-<reward>-kl<coef>`); `grid` declares the other guards' grids (`length_mask_slack`, `cider_anchor`,
    `stop_on_gaming`, `rep_penalty`, `length_penalty`), each trained alone (stages `scst-<reward>-<guard><setting>`);
    with two guards or more a last run combines every guard's chosen setting (stage `scst-<reward>-guards`)."""

    rewards: list[str] = field(default_factory=list)  # rewards to guard (each also an unguarded run of the rewards)
    kl_coefs: list[Annotated[float, Ge(0)]] = field(default_factory=lambda: [0.02, 0.05, 0.1, 0.2])
    grid: dict[str, list[float | bool]] = field(default_factory=dict)  # guard -> its candidate settings
    rep_penalty: NonNegativeFloat = 0.0  # weight of the `rep-penalty` component mixed into each guarded reward
    length_penalty: NonNegativeFloat = 0.0  # weight of the `length-penalty` component

    def validate(self) -> None:
        """A known guard per grid key, at least one setting to train, no duplicates; a grid's penalty is not also
        fixed."""
        check_grid(self.grid)
        if self.rewards and not (self.kl_coefs or self.grid):
            raise InputError("guarded.kl_coefs: expected at least one coefficient (or a guard in guarded.grid)")
        if len(set(self.kl_coefs)) != len(self.kl_coefs):
            raise InputError(f"guarded.kl_coefs={self.kl_coefs}: a coefficient is listed twice")
        for key in ("rep_penalty", "length_penalty"):
            if key in self.grid and getattr(self, key):
                raise InputError(f"guarded.grid.{key}: the penalty is also fixed by guarded.{key}="
                                 f"{getattr(self, key):g}; set one of them")

    def guards(self) -> dict[str, list]:
        """Every guard to choose and its candidate settings, in training order: the KL grid first."""
        return {**({"kl_coef": list(self.kl_coefs)} if self.kl_coefs else {}), **self.grid}

    def combines(self) -> bool:
        """Whether a best-combination run is trained (two guards or more)."""
        return len(self.guards()) > 1

    def reward_spec(self, reward: str, settings: dict | None = None) -> str:
        """The reward spec a guarded run trains on: `reward` plus the enabled penalty components (and the CIDEr-D
        anchor of `settings`, `reward_spec`)."""
        return reward_spec(reward, settings or {}, self.rep_penalty, self.length_penalty)
