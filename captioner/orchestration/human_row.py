"""A recipe's human row (`evaluation.human_baseline: true`): per test set, one reference of every image held out
(drawn with the run's `seed`, `pacs.eval.human_baseline.hold_out_references`) and scored as a caption against the
image's other references, as in PAC-S Table 7 / PAC-S++ Table 6 (the papers' protocol: the models keep every
reference). Stage `eval/human/<set>`: no model, no upstream stage; its settings are the test set, the text
metrics, the image cap, the reward models and the seed.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pacs.captioner.orchestration.stage_fingerprints import data_inputs, reward_model_inputs, reward_model_settings
from pacs.eval.human_baseline import hold_out_references
from pacs.eval.system_inputs import HUMAN_ROW
from pacs.metric.common.errors import InputError

__all__ = ["HUMAN_ROW", "check_human_rows", "human_captions", "human_stage_parts"]


def human_captions(set_name: str, items: Sequence[Any], seed: int) -> tuple[dict[Any, str], list[Any]]:
    """The human row of test set `set_name`: `({image_id: held-out reference}, items with the other references)`,
    in the items' order; an image with fewer than two references is an InputError naming it."""
    references = {item.image_id: list(item.captions) for item in items}
    try:
        held = hold_out_references(list(references), references, seed)
    except InputError as error:
        raise InputError(f"evaluation.test_sets.{set_name}: {str(error).split(' (pass ')[0]}; the human row holds "
                         "one reference out of each image: set evaluation.human_baseline: false for this test set's "
                         "data") from None
    return held.captions, [dataclasses.replace(item, captions=held.remaining[item.image_id]) for item in items]


def check_human_rows(test_items: Mapping[str, Sequence[Any]], seed: int) -> None:
    """Refuse, before any training, a test set whose human row cannot be made (an image with one reference)."""
    for set_name, items in test_items.items():
        human_captions(set_name, items, seed)


def human_stage_parts(config: Any, stages: Any, set_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings and inputs of stage `eval/human/<set>`."""
    e, set_config = config.evaluation, config.evaluation.test_sets[set_name]
    return ({"test_set": set_config, "human_baseline": {"seed": config.seed}, "text_metrics": e.text_metrics,
             "max_images": e.max_images, "reward_models": reward_model_settings(config.reward_models)},
            {**data_inputs(set_config), **reward_model_inputs(stages, config.reward_models)})
