"""Progress bars of pacs: tqdm, with the bars of one process tagged and kept on a line of their own.

Seeds trained in parallel processes (the demo's `parallel_seeds`) draw their bars on one terminal. Each seed's
process calls `set_progress_tag("seed 1", position=1)` once; every bar it draws through `progress` then starts
with ``[seed 1]`` and stays on that process's line, instead of all the processes redrawing one shared bar.
Seeds run in turn set the tag with position 0, so the bar still says which seed it shows.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm  # a notebook gets its widget, a terminal the text bar

_CONTEXT: dict[str, Any] = {"tag": "", "position": None}
FEW_STEPS = 3
"""Work of fewer steps than this gets no bar where it repeats (captioning a monitor's few validation batches): such
bars only flash by, dozens of times a run."""


def set_progress_tag(tag: str, position: int | None = None) -> None:
    """Tag every later bar of this process with `tag` (empty: no tag), drawn on terminal line `position`."""
    _CONTEXT.update(tag=tag, position=position)


def progress_tag() -> str:
    """The tag this process's bars carry (`set_progress_tag`), or the empty string."""
    return _CONTEXT["tag"]


def progress(iterable: Iterable[Any] | None = None, desc: str = "", **kwargs: Any) -> tqdm:
    """A tqdm bar over `iterable` (or with `total=`) whose description carries this process's tag."""
    tag, position = _CONTEXT["tag"], _CONTEXT["position"]
    if tag:
        desc = f"[{tag}] {desc}" if desc else f"[{tag}]"
    if position is not None:
        kwargs.setdefault("position", position)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, desc=desc, **kwargs)
