"""'did you mean': the hint of every one-line error about an unknown key or name (difflib's close matches).

Config keys, reward, metric and benchmark names, packaged config presets, data sets and `--force` stage names
all spell their refusal with `known_hint`, so a typo is answered with the closest names rather than a long list.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable

#: a suggestion leaves out a list of known names longer than this (a short list still helps)
MAX_LISTED = 10
#: difflib's similarity ratio a known name needs to be suggested
CUTOFF = 0.6


def close_matches(name: object, known: Iterable[object], n: int = 3) -> list[str]:
    """The known names closest to `name` (case-insensitive, similarity >= CUTOFF), best first, as spelled in `known`."""
    spelled: dict[str, str] = {}
    for entry in known:
        spelled.setdefault(str(entry).lower(), str(entry))
    hits = difflib.get_close_matches(str(name).strip().lower(), list(spelled), n=n, cutoff=CUTOFF)
    return [spelled[hit] for hit in hits]


def did_you_mean(name: object, known: Iterable[object]) -> str:
    """"did you mean 'x'?" for the closest known name; "" when none is close."""
    hits = close_matches(name, known, n=1)
    return f"did you mean {hits[0]!r}?" if hits else ""


def known_hint(name: object, known: Iterable[object], label: str = "known", sep: str = ", ",
               max_listed: int = MAX_LISTED) -> str:
    """The parenthesis after an unknown `name`: the suggestion, and the known names when at most `max_listed` or
    when nothing is close."""
    names = [str(entry) for entry in known]
    suggestion = did_you_mean(name, names)
    listed = f"{label}: {sep.join(names) or 'none'}"
    if not suggestion:
        return f"({listed})"
    return f"({suggestion})" if len(names) > max_listed else f"({suggestion} {listed})"
