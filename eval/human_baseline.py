"""The human baseline of system-level tables: one reference per image, chosen with a seed, as the candidate.

For every image one of its references (`held_out[image_id]`, an index into the image's reference list as read)
is scored as a caption against the image's other references, as in PAC-S Table 7 / PAC-S++ Table 6. Images
with fewer than two references cannot give a human row: one InputError naming them, or, with `skip`, they are
left out (and counted by the caller).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pacs.metric.common.errors import InputError

#: the protocols: systems keep all references (the papers'), or every row uses the same remaining references
PROTOCOL_PAPERS = "papers"
PROTOCOL_EQUAL_REFS = "equal-refs"


@dataclass
class HumanBaseline:
    """Held-out reference index, human caption and remaining references per image (in the given image order)."""

    seed: int
    held_out: dict[str, int]
    captions: dict[str, str]
    remaining: dict[str, list[str]]
    skipped: list[str] = field(default_factory=list)


def _shown(ids: Sequence[str]) -> str:
    """At most 10 ids, quoted, for an error message."""
    more = f" (and {len(ids) - 10} more)" if len(ids) > 10 else ""
    return ", ".join(map(repr, ids[:10])) + more


def hold_out_references(image_ids: Sequence[str], references: Mapping[str, Sequence[str]], seed: int,
                        skip: bool = False) -> HumanBaseline:
    """Choose the held-out reference of every image with `numpy.random.default_rng(seed)`, one draw per image
    with two or more references, in the order of `image_ids`."""
    few = [image_id for image_id in image_ids if len(references[image_id]) < 2]
    if few and not skip:
        raise InputError(f"the human baseline needs at least 2 references per image; image id(s) {_shown(few)} "
                         "have fewer (pass --skip-single-reference-images to leave them out)",
                         parameter="skip_single_reference_images")
    rng = np.random.default_rng(seed)
    held_out: dict[str, int] = {}
    captions: dict[str, str] = {}
    remaining: dict[str, list[str]] = {}
    for image_id in image_ids:
        refs = list(references[image_id])
        if len(refs) < 2:
            continue
        index = int(rng.integers(len(refs)))
        held_out[image_id] = index
        captions[image_id] = refs[index]
        remaining[image_id] = refs[:index] + refs[index + 1:]
    return HumanBaseline(seed, held_out, captions, remaining, few)


def recompute_from_held_out(held_out: Mapping[str, int], references: Mapping[str, Sequence[str]]
                            ) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The human captions and remaining references of a recorded `held_out` table (the JSON's)."""
    captions, remaining = {}, {}
    for image_id, index in held_out.items():
        refs = list(references[image_id])
        captions[image_id] = refs[index]
        remaining[image_id] = refs[:index] + refs[index + 1:]
    return captions, remaining
