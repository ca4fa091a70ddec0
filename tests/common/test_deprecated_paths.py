"""Every pre-0.3 import path still works for one release: it is the moved module (or reads from its new homes)."""
from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

# old path -> new home(s), written out by hand (the first module holds the names; later ones fill in)
MOVED = {
    "metric.backbones": ("metric.models.backbones", "metric.models.factory"),
    "metric.official": ("metric.models.official",),
    "metric.lora": ("metric.models.lora", "metric.models.factory"),
    "metric.families": ("metric.models.families", "metric.scoring.registry"),
    "metric.normalisation": ("metric.models.normalisation",),
    "metric.preprocess": ("metric.models.preprocess",),
    "metric.tokenizer": ("metric.models.tokenizer",),
    "metric.pruned_forward": ("metric.models.pruned_forward",),
    "metric.grid": ("metric.models.grid",),
    "metric.export": ("metric.training.export",),
    "metric.scores": ("metric.scoring.scores",),
    "metric.scorer": ("metric.scoring.scorer",),
    "metric.embedding_cache": ("metric.scoring.embedding_cache",),
    "metric.score_inputs": ("metric.scoring.inputs",),
    "metric.registry": ("metric.scoring.registry",),
    "metric.images": ("metric.scoring.images",),
    "metric.api": ("metric.scoring.api",),
    "metric.tm_metrics": ("metric.scoring.tm_metrics",),
    "metric.train": ("metric.training.trainer",),
    "metric.losses": ("metric.training.losses",),
    "metric.train_data": ("metric.training.data",),
    "metric.positives": ("metric.training.positives",),
    "metric.grad_cache": ("metric.training.grad_cache",),
    "metric.distributed": ("metric.training.distributed",),
    "metric.train_correlation": ("eval.training_hook",),
    "metric.video_frames": ("metric.video.frames",),
    "metric.video_idf": ("metric.video.idf",),
    "metric.cli": ("metric.commands.score",),
    "metric.train_cli": ("metric.commands.train",),
    "metric.video_cli": ("metric.commands.score_video",),
    "metric.export_cli": ("metric.commands.export",),
    "eval.cli": ("eval.commands.correlate",),
    "eval.report_cli": ("eval.commands.report",),
    "captioner.model": ("captioner.modeling.model",),
    "captioner.vocab": ("captioner.modeling.vocab",),
    "captioner.decoding": ("captioner.modeling.decoding",),
    "captioner.features": ("captioner.modeling.features",),
    "captioner.training": ("captioner.modeling.training",),
    "captioner.train_xe": ("captioner.modeling.train_xe",),
    "captioner.train_scst": ("captioner.modeling.train_scst",),
    "captioner.checkpoints": ("captioner.modeling.checkpoints",),
    "captioner.example_rng": ("captioner.modeling.example_rng",),
    "captioner.pipeline": ("captioner.orchestration.pipeline", "captioner.entry"),
    "captioner.stages": ("captioner.orchestration.stages",),
    "captioner.recipe_stages": ("captioner.orchestration.recipe_stages",),
    "captioner.evaluation": ("captioner.orchestration.evaluation",),
    "captioner.eval_intervals": ("captioner.orchestration.eval_intervals",),
    "captioner.eval_processes": ("captioner.orchestration.eval_processes",),
    "captioner.launching": ("captioner.orchestration.launching",),
    "captioner.backbone_source": ("captioner.orchestration.backbone_source",),
    "captioner.cli": ("captioner.commands.caption_train",),
}


def _fresh_import(old: str) -> object:
    """Import `old` in this process with its DeprecationWarning recorded."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sys.modules.pop(old, None)
        module = importlib.import_module(old)
    return module, [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_stands_for_the_new_module(old: str) -> None:
    homes = [importlib.import_module(name) for name in MOVED[old]]
    module, messages = _fresh_import(old)
    assert any(f"`{old}` moved to `{MOVED[old][0]}`" in message for message in messages), messages
    if len(homes) == 1:
        assert module is homes[0]
        return
    for home in homes:  # every public name of every home is the very same object through the old path
        for name in [n for n in vars(home) if not n.startswith("__")]:
            if homes.index(home) and any(hasattr(h, name) for h in homes[:homes.index(home)]):
                continue  # an earlier home holds this name
            assert getattr(module, name) is getattr(home, name), f"{old}.{name}"


def test_video_package_keeps_the_scorer_names() -> None:
    from metric.video import VideoScorer
    from metric.video.scorer import VideoScorer as moved

    assert VideoScorer is moved


def test_a_patch_through_an_old_path_reaches_the_new_home(monkeypatch: pytest.MonkeyPatch) -> None:
    import metric.backbones as old_backbones
    from metric.models import factory

    sentinel = object()
    monkeypatch.setattr(old_backbones, "load_backbone", sentinel)
    assert factory.load_backbone is sentinel


def test_old_paths_import_in_a_fresh_interpreter() -> None:
    code = "import warnings; warnings.simplefilter('error', DeprecationWarning)\ntry:\n import metric.scorer\nexcept DeprecationWarning as w:\n print(w)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "`metric.scorer` moved to `metric.scoring.scorer`" in result.stdout
