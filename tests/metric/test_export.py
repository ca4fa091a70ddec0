"""`pacs export`: official PAC-S / PAC-S++ layout (fixtures A and C) with the trained scores, and a folder that reloads
bit-identically.

The trained model is a PAC-S++ LoRA model with fixture A's tensor shapes (vision width 128 x 2 layers, patch 32,
224 px; text width 64 x 2 layers; E = 64) whose LoRA matrices are all set to non-zero values through peft, saved
the way `pacs train-metric` saves it (`adapter/` + merged `checkpoint.safetensors`). Its text tower has 1 head
(width // 64, the official rule) where fixture A has 2: head counts change no tensor shape, so the exported file is
compared with fixture A's own key set, shapes and dtypes exactly (no layout derived from the config in the test).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch

from pacs.cli import main
from pacs.metric.common.errors import InputError
from pacs.metric.common.provenance import sha256_file
from pacs.metric.models.backbones import build_backbone_from_config, model_fingerprint, save_backbone
from pacs.metric.models.factory import load_backbone
from pacs.metric.models.lora import attach_lora, merge_lora, save_adapter
from pacs.metric.scoring.scorer import Scorer
from pacs.metric.training.export import export_model

N_INSTANCES = 8  # of the 32 fixture instances: enough images and captions, a few seconds per scoring


def _align(backbone) -> None:
    """Final LayerNorm biases along one shared direction, so the cosines are positive (as the fixtures do).

    Each bias has twice the norm of the normalised activations (sqrt(width)): random towers alone give cosines
    around 0, and half of all scores would be clipped to 0.
    """
    model = backbone.model
    direction = torch.randn(model.text_projection.shape[1], generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for norm, projection in ((model.visual.ln_post, model.visual.proj), (model.ln_final, model.text_projection)):
            bias = torch.linalg.lstsq(projection.T, direction[:, None]).solution[:, 0]
            norm.bias.copy_(2.0 * bias / bias.norm() * bias.numel() ** 0.5)
    backbone.fingerprint = model_fingerprint(model, backbone.open_clip_config, backbone.preprocess)


def _arch(fixtures: Path, name: str, **text_overrides) -> dict:
    config = json.loads((fixtures / name / "arch.json").read_text())["open_clip_equivalent"]
    config["text_cfg"].update(text_overrides)
    return config


def _train_lora_run(config: dict, folder: Path, seed: int = 3) -> Path:
    """A PAC-S++ run folder as `pacs train-metric` writes it, with every LoRA matrix non-zero."""
    base = build_backbone_from_config(config, seed=seed, name="tiny-pacspp")
    _align(base)
    save_backbone(base, folder / "base.safetensors")  # the untrained base, to show the deltas matter
    lora = attach_lora(base)  # peft adapts base.model in place
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in lora.model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    save_adapter(lora, folder / "adapter")
    save_backbone(merge_lora(lora), folder / "checkpoint.safetensors")
    return folder


@pytest.fixture(scope="module")
def lora_run(pacscore_fixtures, tmp_path_factory) -> Path:
    """Fixture-A-shaped PAC-S++ model trained (LoRA set) and saved by pacs."""
    return _train_lora_run(_arch(pacscore_fixtures, "A", heads=1), tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def score_inputs(pacscore_fixtures, tmp_path_factory) -> dict:
    """The first fixture instances as `pacs score` inputs (one image id per instance)."""
    folder = tmp_path_factory.mktemp("inputs")
    instances = json.loads((pacscore_fixtures / "inputs" / "inputs.json").read_text())
    instances = (instances["instances"] if isinstance(instances, dict) else instances)[:N_INSTANCES]
    ids = [f"i{index}" for index in range(len(instances))]
    images = pacscore_fixtures / "inputs" / "images"
    files = {
        "candidates": [{"image_id": i, "caption": inst["candidate"]} for i, inst in zip(ids, instances)],
        "references": {i: inst["references"] for i, inst in zip(ids, instances)},
        "image-map": {i: str(images / inst["image"]) for i, inst in zip(ids, instances)},
    }
    for name, data in files.items():
        (folder / f"{name}.json").write_text(json.dumps(data))
    return {"args": [arg for name in files for arg in (f"--{name}", str(folder / f"{name}.json"))],
            "images": list(files["image-map"].values()), "captions": [c["caption"] for c in files["candidates"]],
            "references": list(files["references"].values())}


def _cli_scores(score_inputs: dict, out: Path, metric: str, *model_args: str) -> np.ndarray:
    assert main(["score", "--metric", metric, *model_args, *score_inputs["args"], "--out", str(out)]) == 0
    return np.array([row["score"] for row in json.loads(out.read_text())["per_instance"]])


def _state(path: Path) -> dict:
    data = torch.load(str(path), map_location="cpu", weights_only=True)
    return data


def test_official_export_has_fixture_a_layout_and_merged_weights(lora_run, pacscore_fixtures, tmp_path):
    out = tmp_path / "pacspp_official.pth"
    assert main(["export", "--checkpoint", str(lora_run / "checkpoint.safetensors"), "--format", "official",
                 "--out", str(out)]) == 0
    fixture = _state(pacscore_fixtures / "A" / "PAC++_tiny_A.pth")
    exported = _state(out)
    assert set(exported) == set(fixture) == {"state_dict"}
    ours, theirs = exported["state_dict"], fixture["state_dict"]
    assert set(ours) == set(theirs) and len(ours) == 96
    assert {key: tuple(t.shape) for key, t in ours.items()} == {key: tuple(t.shape) for key, t in theirs.items()}
    assert {t.dtype for t in ours.values()} == {torch.float32}  # default: fp32, no rounding
    lora_keys = [key for key in ours if "lora_" in key]
    assert len(lora_keys) == 34 and all(torch.count_nonzero(ours[key]) == 0 for key in lora_keys)
    assert all(torch.count_nonzero(theirs[key]) > 0 for key in lora_keys)  # the fixture's are real deltas
    trained = load_backbone(checkpoint=str(lora_run / "checkpoint.safetensors")).model.state_dict()
    assert set(trained) == set(ours) - set(lora_keys)
    assert all(torch.equal(ours[key], trained[key]) for key in trained)  # every delta merged, nothing else changed

    # --dtype fp16: the fixture's dtypes key by key, values the fp32 export rounded
    half = tmp_path / "pacspp_fp16.pth"
    assert main(["export", "--checkpoint", str(lora_run / "checkpoint.safetensors"), "--format", "official",
                 "--dtype", "fp16", "--out", str(half)]) == 0
    half_state = _state(half)["state_dict"]
    assert {key: t.dtype for key, t in half_state.items()} == {key: t.dtype for key, t in theirs.items()}
    assert all(torch.equal(half_state[key], ours[key].half()) for key in ours)


def test_official_export_scores_like_the_trained_model(lora_run, score_inputs, tmp_path):
    out = tmp_path / "export.pth"
    export_model(lora_run / "checkpoint.safetensors", out, fmt="official")
    trained = _cli_scores(score_inputs, tmp_path / "trained.json", "pac-s++",
                          "--checkpoint", str(lora_run / "checkpoint.safetensors"))
    official = _cli_scores(score_inputs, tmp_path / "official.json", "pac-s++", "--checkpoint", str(out),
                           "--arch", "openai", "--lora-mode", "official")
    assert np.abs(official - trained).max() <= 1e-5
    assert (trained > 0).all()  # scores, not clipped zeros
    # the official "fresh model, then load" reading (mlp deltas merged too) gives the same: the LoRA tensors are 0
    fresh = Scorer(load_backbone(checkpoint=str(out), arch="openai", lora_mode="all"), w=2.5)
    assert np.abs(fresh.score(score_inputs["images"], score_inputs["captions"]).scores - trained).max() <= 1e-5
    # the test can see a lost delta: the untrained base scores differently
    base = Scorer(load_backbone(checkpoint=str(lora_run / "base.safetensors")), w=2.5)
    assert np.abs(base.score(score_inputs["images"], score_inputs["captions"]).scores - trained).max() > 1e-2


def test_adapter_folder_exports_the_same_file_as_the_merged_checkpoint(lora_run, tmp_path):
    from_checkpoint = export_model(lora_run / "checkpoint.safetensors", tmp_path / "a.pth", fmt="official")
    from_adapter = export_model(lora_run / "adapter", tmp_path / "b.pth", fmt="official")
    a, b = _state(from_checkpoint.path)["state_dict"], _state(from_adapter.path)["state_dict"]
    assert set(a) == set(b) and all(torch.equal(a[key], b[key]) for key in a)


def test_folder_export_reloads_bit_identically(lora_run, score_inputs, tmp_path):
    out = tmp_path / "exported"
    assert main(["export", "--checkpoint", str(lora_run / "checkpoint.safetensors"), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "open_clip_config.json",
                                                     "open_clip_model.safetensors"]
    original = load_backbone(checkpoint=str(lora_run / "checkpoint.safetensors"))
    reloaded = load_backbone(checkpoint=str(out))
    before, after = original.model.state_dict(), reloaded.model.state_dict()
    assert set(before) == set(after) and all(torch.equal(before[k], after[k]) for k in before)
    assert reloaded.fingerprint == original.fingerprint
    assert (reloaded.family, reloaded.family_source, reloaded.name) == ("pac-s++", "pacs-metadata", original.name)
    assert reloaded.preprocess.config() == original.preprocess.config()
    args = (score_inputs["images"], score_inputs["captions"], score_inputs["references"])
    first, second = Scorer(original, w=2.5).score(*args), Scorer(reloaded, w=2.5).score(*args)
    assert np.array_equal(first.scores, second.scores) and np.array_equal(first.ref_terms, second.ref_terms)

    config = json.loads((out / "open_clip_config.json").read_text())
    pacs = config["pacs"]
    assert (pacs["family"], pacs["metric"], pacs["w"]) == ("pac-s++", "pac-s++", 2.5)
    assert pacs["fingerprint"] == original.fingerprint
    assert pacs["provenance"]["exported_from"]["sha256"] == sha256_file(lora_run / "checkpoint.safetensors")
    assert config["model_cfg"]["text_cfg"]["heads"] == 1 and config["preprocess_cfg"]["size"] == 224
    card = (out / "README.md").read_text()
    assert "library_name: open_clip" in card and "w = 2.5" in card and original.fingerprint in card
    # open_clip reads the folder on its own (its local-dir convention)
    plain = open_clip.create_model(f"local-dir:{out}").state_dict()
    assert set(plain) == set(before) and all(torch.equal(plain[k], before[k]) for k in before)


def test_pac_s_export_has_fixture_c_layout(pacscore_fixtures, tmp_path):
    backbone = build_backbone_from_config(_arch(pacscore_fixtures, "C"), seed=4, name="tiny-pacs", family="pac-s")
    save_backbone(backbone, tmp_path / "checkpoint.safetensors")
    out = tmp_path / "pacs.pth"
    assert main(["export", "--checkpoint", str(tmp_path / "checkpoint.safetensors"), "--format", "official",
                 "--dtype", "fp16", "--out", str(out)]) == 0
    ours = _state(out)["state_dict"]
    theirs = _state(pacscore_fixtures / "C" / "clip_tiny_C.pth")["state_dict"]
    assert {k: (tuple(t.shape), t.dtype) for k, t in ours.items()} == \
        {k: (tuple(t.shape), t.dtype) for k, t in theirs.items()}
    weights = backbone.model.state_dict()
    assert all(torch.equal(ours[k], weights[k].half()) for k in weights)


def _listing(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_bad_inputs_exit_2_without_output(lora_run, pacscore_fixtures, tiny_backbone, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()

    def fails(*args: str, expected: str) -> None:
        assert main(["export", *args]) == 2
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and expected in error, error
        assert _listing(out) == before

    before = _listing(out)
    fails("--checkpoint", str(pacscore_fixtures / "A" / "PAC++_tiny_A.pth"), "--out", str(out / "x"),
          expected="not a model pacs trained")
    save_backbone(tiny_backbone, tmp_path / "clip.safetensors")  # pacs' own file, but a CLIP model
    fails("--checkpoint", str(tmp_path / "clip.safetensors"), "--out", str(out / "x"),
          expected="not a PAC-S / PAC-S++ model")
    fails("--checkpoint", str(tmp_path / "missing.safetensors"), "--out", str(out / "x"), expected="not found")
    (out / "taken.pth").write_bytes(b"keep")
    before = _listing(out)
    fails("--checkpoint", str(lora_run / "checkpoint.safetensors"), "--format", "official",
          "--out", str(out / "taken.pth"), expected="--overwrite")
    assert (out / "taken.pth").read_bytes() == b"keep"
    with pytest.raises(SystemExit) as exit_info:  # argparse: unknown --format
        main(["export", "--checkpoint", str(lora_run / "checkpoint.safetensors"), "--format", "onnx",
              "--out", str(out / "x")])
    assert exit_info.value.code == 2 and "invalid choice: 'onnx'" in capsys.readouterr().err
    with pytest.raises(InputError, match="unknown export format 'onnx'"):
        export_model(lora_run / "checkpoint.safetensors", out / "x", fmt="onnx")

    # an architecture the official code builds differently (fixture A's real 2 text heads of width 32)
    run = _train_lora_run(_arch(pacscore_fixtures, "A"), tmp_path / "run_a")
    fails("--checkpoint", str(run / "checkpoint.safetensors"), "--format", "official", "--out", str(out / "a.pth"),
          expected="2 text heads for width 64")
    assert main(["export", "--checkpoint", str(run / "checkpoint.safetensors"), "--format", "official",
                 "--out", str(out / "a.pth"), "--allow-nonstandard-arch"]) == 0
    assert len(_state(out / "a.pth")["state_dict"]) == 96

    # --overwrite replaces a folder whole; a failure while writing leaves the old one and no temporary files
    target = out / "folder"
    assert main(["export", "--checkpoint", str(lora_run / "checkpoint.safetensors"), "--out", str(target)]) == 0
    capsys.readouterr()
    card = (target / "README.md").read_text()
    before = _listing(out)
    fails("--checkpoint", str(lora_run / "checkpoint.safetensors"), "--out", str(target), expected="--overwrite")
    assert main(["export", "--checkpoint", str(run / "checkpoint.safetensors"), "--out", str(target),
                 "--overwrite", "--w", "3.0"]) == 0
    assert json.loads((target / "open_clip_config.json").read_text())["pacs"]["w"] == 3.0
    assert _listing(out) == before and (target / "README.md").read_text() != card


def test_failed_write_leaves_nothing(lora_run, tmp_path, monkeypatch):
    from pacs.metric.training import export

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export, "write_text_atomic", broken)
    with pytest.raises(OSError, match="disk full"):
        export_model(lora_run / "checkpoint.safetensors", tmp_path / "folder")
    assert _listing(tmp_path) == []


def test_official_differences_name_each_difference():
    """tiny_clip_config differs from what the official build_model rebuilds in four ways, each named."""
    from pacs.metric.models.backbones import tiny_clip_config
    from pacs.metric.training.export import official_differences

    tiny = build_backbone_from_config(tiny_clip_config(), family="pac-s++")
    assert official_differences(tiny) == [
        "vision heads of width 32 (the official code uses width // 64 heads)",
        "2 text heads for width 32 (the official code uses width // 64 = 0)",
        "vision MLP ratio 2.0 (the official code builds 4)",
        "text MLP ratio 2.0 (the official code builds 4)",
    ]
    official_like = tiny_clip_config(vision_cfg={"head_width": 64, "mlp_ratio": 4.0},
                                     text_cfg={"width": 64, "heads": 1, "mlp_ratio": 4.0})
    assert official_differences(build_backbone_from_config(official_like, family="pac-s++")) == []
    gelu = build_backbone_from_config({**official_like, "quick_gelu": False}, quick_gelu=False, family="pac-s++")
    assert official_differences(gelu) == [
        "PAC-S++ needs QuickGELU and the OpenAI mean/std (the official clip_lora model)"]
