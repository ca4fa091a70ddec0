"""`features.cache_dir`: a pipeline's feature stage over features extracted elsewhere, checked instead of extracted."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pacs.captioner.orchestration.stages import StageRunner, file_input
from pacs.metric.common.errors import InputError


def precomputed_feature_stage(stages: StageRunner, features: Any, backbone: Callable[[], Any], name: str,
                              image_paths: dict[str, Any], selection: dict[str, Any], inputs: dict[str, Any]) -> Any:
    """Stage `features/<name>` over `features.cache_dir/<name>` (main process): the cache must record `source`'s
    fingerprint and hold every image of the set; its files are the stage's inputs. Returns the FeatureCache."""
    from pacs.captioner.modeling.features import FeatureCache

    folder = Path(features.cache_dir).expanduser() / name

    def check() -> dict[str, Any]:
        cache = FeatureCache(folder)
        model = backbone()
        if cache.fingerprint != model.fingerprint:
            raise InputError(f"features.cache_dir: {folder / 'meta.json'} records features of backbone "
                             f"{cache.meta.get('backbone', '?')!r} (fingerprint {cache.fingerprint or 'none'!r}), but "
                             f"features.source is {model.name!r} (fingerprint {model.fingerprint!r}); set "
                             "features.source to the backbone that extracted them", parameter="features.cache_dir")
        missing = cache.missing(image_paths)
        if missing:
            raise InputError(f"features.cache_dir: {folder} lacks the features of {len(missing)} image(s) of set "
                             f"{name!r}, e.g. {missing[:3]}", parameter="features.cache_dir")
        return {"images": len(image_paths), "cache": str(folder)}

    stages.run(f"features/{name}", check, *precomputed_parts(stages, features, name, selection, inputs), outputs=[])
    return FeatureCache(folder)


def precomputed_parts(stages: StageRunner, features: Any, name: str, selection: dict[str, Any],
                      inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings and inputs of stage `features/<name>` over `features.cache_dir` (its run and its plan)."""
    from pacs.captioner.orchestration.stage_fingerprints import settings_of, source_inputs

    folder = Path(features.cache_dir).expanduser() / name
    return ({"source": settings_of(features.source), "images": selection, "cache_dir": str(folder)},
            {**inputs, **source_inputs(stages, features.source), "meta": file_input(folder / "meta.json"),
             "shards": file_input(folder / "shards")})
