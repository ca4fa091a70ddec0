"""The inputs of a system-level table: `NAME=FILE` pairs, their captions, and the images every system covers.

Rows of every system (and of a single candidate file) are put in one canonical order, the order of the image
ids in the references file, so a system is scored identically alone and next to others.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pacs.metric.common.errors import InputError

HUMAN_ROW = "human"
HUMAN_LABEL = "Humans"
"""The human row's label in every printed form of a table (its JSON `system` stays `HUMAN_ROW`)."""


def row_label(row: Mapping[str, Any]) -> str:
    """A table row's label in every printed form of the table (stdout, LaTeX, Markdown, HTML, PNG): the system's
    name, `HUMAN_LABEL` for the human row."""
    return HUMAN_LABEL if row.get("kind") == HUMAN_ROW else str(row["system"])


IN_MEMORY = "in memory"


@dataclass
class SystemSpec:
    """A system's name and candidates file (None: its captions are given in memory, `captions`)."""

    name: str
    path: Path | None
    #: `{image_id: caption}` or `[{"image_id", "caption"}]` given in memory instead of a file
    captions: Any = None

    @property
    def source(self) -> str:
        """Where the captions come from: the file, or `in memory`."""
        return IN_MEMORY if self.path is None else str(self.path)


@dataclass
class SystemCaptions:
    """A system's rows in canonical order: image ids (strings) and captions."""

    name: str
    path: Path | None
    ids: list[str]
    captions: list[str]
    missing: list[str] = field(default_factory=list)  # images other systems have and this one lacks


def _shown(ids: Sequence[str], limit: int = 10) -> str:
    more = f" (and {len(ids) - limit} more)" if len(ids) > limit else ""
    return ", ".join(map(repr, ids[:limit])) + more


def _in_memory_specs(specs: Mapping[str, Any]) -> list[SystemSpec]:
    """`{name: captions or FILE}`: captions (`{image_id: caption}` or a COCO-results list) kept in memory."""
    systems = []
    for name, value in specs.items():
        if not isinstance(name, str) or not name.strip():
            raise InputError(f"candidates: system name {name!r} must be a non-empty string", parameter="candidates")
        if isinstance(value, (Mapping, list)):
            systems.append(SystemSpec(name.strip(), None, dict(value) if isinstance(value, Mapping) else value))
            continue
        path = Path(value)
        if not path.is_file():
            raise InputError(f"candidates: the file of system {name!r} does not exist: {path}", parameter="candidates")
        systems.append(SystemSpec(name.strip(), path))
    if not systems:
        raise InputError("candidates: no system given", parameter="candidates")
    return systems


def parse_candidate_specs(specs: Sequence[str] | Mapping[str, Any]) -> list[SystemSpec]:
    """`NAME=FILE` (or a plain FILE, named after its stem) per system, or `{name: captions or FILE}` (captions
    in memory: `{image_id: caption}` or `[{"image_id", "caption"}]`); InputError for a bad pair, a missing file
    or a name given twice."""
    if isinstance(specs, Mapping):
        return _in_memory_specs(specs)
    systems: list[SystemSpec] = []
    for spec in specs:
        text = str(spec)
        if "=" in text and not Path(text).is_file():
            name, _, file = text.partition("=")
            name = name.strip()
            if not name or not file.strip():
                raise InputError(f"--candidates {text!r}: expected NAME=FILE with a non-empty name and file",
                                 parameter="candidates")
        else:
            name, file = Path(text).stem, text
        path = Path(file)
        if not path.is_file():
            raise InputError(f"--candidates: the file of system {name!r} does not exist: {path}",
                             parameter="candidates")
        if any(system.name == name for system in systems):
            raise InputError(f"--candidates: system name {name!r} is given twice (name each system with "
                             "NAME=FILE)", parameter="candidates")
        systems.append(SystemSpec(name, path))
    if not systems:
        raise InputError("--candidates: no candidate file given", parameter="candidates")
    return systems


def canonical_rows(path: Path | None, references: Mapping[str, Sequence[str]], unique: bool,
                   name: str | None = None, data: Any = None) -> tuple[list[str], list[str]]:
    """The ids and captions of a candidates file (or of `data`, the same layout in memory), ordered as the
    references file (stable for repeated ids).

    Every id must have references; with `unique`, an image captioned twice is an InputError naming the ids.
    """
    from pacs.metric.scoring.score_inputs import load_candidates, references_for

    if path is None:
        path = Path(f"system {name!r} ({IN_MEMORY})")
    candidates = load_candidates(path, data)
    references_for(candidates, dict(references), path)  # InputError naming the ids without references
    if unique:
        seen: dict[str, int] = {}
        for candidate in candidates:
            seen[candidate.key] = seen.get(candidate.key, 0) + 1
        twice = [key for key, count in seen.items() if count > 1]
        if twice:
            label = f"system {name!r} ({path})" if name and data is None else str(path)
            raise InputError(f"{label} captions image id(s) {_shown(twice)} more than once (ids 1 and \"1\" are "
                             "the same image); a system-level table takes one caption per image",
                             parameter="candidates")
    position = {key: index for index, key in enumerate(references)}
    ordered = sorted(range(len(candidates)), key=lambda i: position[candidates[i].key])
    return [candidates[i].key for i in ordered], [candidates[i].caption for i in ordered]


def load_systems(specs: Sequence[SystemSpec], references: Mapping[str, Sequence[str]],
                 skip_missing: bool) -> tuple[list[SystemCaptions], list[str]]:
    """Every system restricted to the images all of them caption (reference order) and those images.

    An image some system lacks is an InputError naming the system and the ids, unless `skip_missing`: then
    it is left out for every system and counted in that system's `missing`.
    """
    loaded = []
    for spec in specs:
        ids, captions = canonical_rows(spec.path, references, unique=True, name=spec.name, data=spec.captions)
        loaded.append(SystemCaptions(spec.name, spec.path, ids, captions))
    present_ids = [set(s.ids) for s in loaded]
    union = set().union(*present_ids)
    for system, present in zip(loaded, present_ids):
        system.missing = [key for key in references if key in union and key not in present]
        if system.missing and not skip_missing:
            raise InputError(f"system {system.name!r} ({system.path or IN_MEMORY}) has no caption for image id(s) "
                             f"{_shown(system.missing)} that other systems caption (pass --skip-missing-images "
                             "to score every system on the common images only)", parameter="skip_missing_images")
    common = [key for key in references if key in union and all(key in ids for ids in present_ids)]
    if not common:
        raise InputError("the systems have no image in common", parameter="candidates")
    keep = set(common)
    for system in loaded:
        rows = [(i, c) for i, c in zip(system.ids, system.captions) if i in keep]
        system.ids, system.captions = [i for i, _ in rows], [c for _, c in rows]
    return loaded, common
