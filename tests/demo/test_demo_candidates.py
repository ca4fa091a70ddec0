"""Correlation candidates: the held-out reference is correct, every corruption is judged worse."""
from __future__ import annotations

import numpy as np

from pacs.captioner.demo.candidates import KINDS, candidates_for, corrupt
from pacs.captioner.demo.judge import judge_caption
from pacs.captioner.demo.world import DemoWorld, WorldConfig


def test_demo_candidates_corruptions_lower_the_judge_score() -> None:
    world = DemoWorld(WorldConfig(seed=3))
    items = world.items("val", 80)
    rng = np.random.default_rng(0)
    seen = set()
    for item in items:
        candidates = candidates_for(item, items, rng, count=6)
        assert candidates[0] == ("reference", item.references[0])
        assert len({caption for _, caption in candidates}) == len(candidates)
        for kind, caption in candidates:
            seen.add(kind)
            judgement = judge_caption(caption, item.scene)
            if kind == "reference":
                assert judgement.is_correct
            elif kind != "other-image":
                assert judgement.score < 1.0 and not judgement.is_correct, (kind, caption, item.scene)
    assert seen == set(KINDS)


def test_demo_candidates_inapplicable_kinds_return_none() -> None:
    world = DemoWorld(WorldConfig(seed=3))
    single = next(item for item in world.items("val", 50) if len(item.scene.objects) == 1)
    assert corrupt("drop-object", single, [single], np.random.default_rng(0)) is None
