"""The one folder name of a reward spec: SCST stage folders (`scst-<slug>`), evaluation folders (`eval/<slug>`),
log names. Torch-free, so configs and preflight checks name folders without loading a reward."""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path


def reward_slug(spec: str) -> str:
    """Folder/log name of a reward spec: lower case, readable (`pac-s++` stays `pac-s++`, `cider:1,pac-s++:0.5`
    becomes `cider_1_pac-s++_0.5`); every character but letters, digits and `-+_.` becomes `_`."""
    return "".join(ch if ch.isalnum() or ch in "-+_." else "_" for ch in spec.lower())


def legacy_reward_slug(spec: str) -> str:
    """The recipes' folder name of `spec` before 0.7 (`pac-s++` -> `pac-spp`, `cider:1,clip-s:0.5` ->
    `cider1_clip-s0.5`): only to recognise an old run folder (`legacy_folders_problem`)."""
    return re.sub(r"[^a-z0-9.\-_]", "", spec.lower().replace("++", "pp").replace(",", "_").replace(":", ""))


def legacy_folders_problem(run_dir: Path, specs: Iterable[str]) -> str | None:
    """One line when `run_dir` holds a reward's stage under its pre-0.7 folder name, which 0.7 would not see
    (it would train the reward again beside it); None when there is none."""
    for spec in specs:
        old, new = legacy_reward_slug(spec), reward_slug(spec)
        found = [path for path in (run_dir / f"scst-{old}", run_dir / "stages" / f"scst-{old}.json",
                                   run_dir / "eval" / old) if path.exists()]
        if old != new and found:
            return (f"{run_dir}: reward {spec!r} was trained here by pacs < 0.7 into {found[0].relative_to(run_dir)}; "
                    f"0.7 names its folders scst-{new} and eval/{new}: use a new run_dir (or delete the old "
                    f"scst-{old}, stages/scst-{old}.json and eval/{old} to train it again here)")
    return None
