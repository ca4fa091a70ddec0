"""A recipe run's gallery for its report: a few test images (copied into the run directory) with every system's
caption, its per-image scores and the references.

The report reads only files inside the run directory (`pacs.eval.report_inputs`), so the photographs of the test
set (Flickr8k's JPEGs, outside it) are copied, scaled down, into `<run_dir>/gallery/`, and `<run_dir>/gallery.json`
lists them in the report's layout (`pacs.eval.report`). The images are the first `GALLERY_SIZE` of the first test
set in the order the evaluation captioned them; the captions are each model's `eval/<model>/<set>.results.json`
(a run over several seeds: the first seed's), the scores its `eval/<model>/<set>.json` per-image values.
"""
from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from PIL import Image

from pacs.captioner.data import load_dataset
from pacs.captioner.orchestration.pipeline_config import DataConfig, PipelineConfig
from pacs.captioner.orchestration.shared_stages import select_test_items
from pacs.metric.common.config import from_dict
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import write_json_atomic
from pacs.metric.common.json_input import read_json_file
from pacs.rewards.slug import reward_slug

logger = logging.getLogger(__name__)

GALLERY_SIZE = 8
GALLERY_PIXELS = 320  # the longer side of a copied photograph (the report embeds it as it is)
SCORE_COLUMNS = ("C", "B-4", "CLIP-S", "PAC-S++", "RefPAC-S++")


def _eval_folder(config: PipelineConfig, folder: str) -> Path:
    """Where the run's per-model evaluation files are: eval/, or the first seed's for a run over several seeds."""
    run_dir = Path(config.run_dir)
    return run_dir / f"seed-{config.seeds[0]}" / "eval" if folder == "seeds" and config.seeds else run_dir / "eval"


def gallery_sources(config: PipelineConfig, test_items: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """{image id: {"image": path, "references": [...]}} of the first test set's items as the run read them, so
    the gallery does not read the data set again (None-free; empty when the run has no test set)."""
    if not config.evaluation.test_sets:
        return {}
    set_name = next(iter(config.evaluation.test_sets))
    return {str(item.image_id): {"image": str(item.image_path), "references": list(item.captions)}
            for item in test_items.get(set_name, [])}


def gallery_entries(config: PipelineConfig, folder: str = "eval",
                    sources: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The gallery of a finished recipe run (see the module), images not yet copied: `source` is each image's
    path on disk. Empty when the run has no evaluated test set. `sources` (`gallery_sources`): the test items
    the run read; without them the test set is read again."""
    if not config.evaluation.test_sets:
        return []
    set_name, set_config = next(iter(config.evaluation.test_sets.items()))
    evaluated = _eval_folder(config, folder)
    models = ["xe", *config.rewards]
    captions, scores = {}, {}
    for model in models:
        path = evaluated / reward_slug(model) / f"{set_name}.results.json"
        if not path.is_file():
            continue
        captions[model] = {str(r["image_id"]): str(r["caption"]) for r in read_json_file(path, path.name)}
        detail = evaluated / reward_slug(model) / f"{set_name}.json"
        values = (read_json_file(detail, detail.name).get("per_image") or {}).get(set_name) if detail.is_file() else None
        if values:
            index = {str(i): n for n, i in enumerate(values["image_ids"])}
            scores[model] = {column: (index, values["values"][column]) for column in SCORE_COLUMNS
                             if column in values.get("values", {})}
    if not captions:
        return []
    if sources:
        items = {key: SimpleNamespace(image_path=value["image"], captions=value["references"])
                 for key, value in sources.items()}
    else:
        data = from_dict(DataConfig, {k: v for k, v in set_config.items() if k != "split"}, "evaluation.test_sets")
        dataset = load_dataset(*data.loader_arguments(), **data.options)
        items = {str(i.image_id): i for i in select_test_items(dataset, set_config, config.evaluation.max_images)}
    first = next(iter(captions.values()))
    entries = []
    for image_id in [i for i in first if i in items][:GALLERY_SIZE]:
        item = items[image_id]
        entry_captions = {}
        for model, by_id in captions.items():
            if image_id not in by_id:
                continue
            found = {}
            for column, (index, column_values) in scores.get(model, {}).items():
                if image_id in index and column_values[index[image_id]] is not None:
                    found[column] = column_values[index[image_id]]
            entry_captions[model] = {"caption": by_id[image_id], "scores": found}
        entries.append({"image_id": image_id, "source": str(item.image_path), "references": list(item.captions),
                        "captions": entry_captions})
    return entries


def write_recipe_gallery(config: PipelineConfig, folder: str = "eval",
                         sources: dict[str, dict[str, Any]] | None = None) -> Path | None:
    """Copy the gallery's images into `<run_dir>/gallery/` and write `<run_dir>/gallery.json`; the file's path, or
    None when there is nothing to show. A data set that cannot be read again is a warning, not a failed run: the
    run's results are already written."""
    run_dir = Path(config.run_dir)
    try:
        entries = gallery_entries(config, folder, sources)
    except (InputError, OSError, KeyError, ValueError) as error:
        logger.warning("report gallery left out: %s", error)
        return None
    if not entries:
        return None
    images = run_dir / "gallery"
    images.mkdir(parents=True, exist_ok=True)
    for number, entry in enumerate(entries):
        source = entry.pop("source")
        target = images / f"{number:02d}.jpg"
        try:
            with Image.open(source) as image:
                photo = image.convert("RGB")
                photo.thumbnail((GALLERY_PIXELS, GALLERY_PIXELS))
                photo.save(target, format="JPEG", quality=85)
            entry["image"] = target.relative_to(run_dir).as_posix()
        except OSError as error:
            logger.warning("report gallery: image %s not copied (%s)", source, error)
    path = run_dir / "gallery.json"
    write_json_atomic(path, entries)
    return path
