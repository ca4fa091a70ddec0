"""A checkpoint's family, activation and normalisation are established (never guessed from a name prefix or a
layout); a metric that contradicts an established family exits 2 unless --allow-family-mismatch."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from pacs.cli import main
from pacs.metric.commands.flags import cli_message
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import (
    build_backbone_from_config,
    instantiate_open_clip,
    open_clip_name_config,
    save_backbone,
    tiny_clip_config,
)
from pacs.metric.models.factory import load_backbone
from pacs.metric.models.families import ARCH_PRESETS, OFFICIAL_CHECKPOINTS, FamilyMismatchError, establish_family
from pacs.metric.models.official import resolve_architecture
from pacs.metric.scoring.registry import default_w

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP's preprocessing constants, written out
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)


def zero_stride_state(name: str) -> dict[str, torch.Tensor]:
    """The state dict of open_clip's `name` with every tensor a zero-stride view of one 0 (shapes only, no memory)."""
    with torch.device("meta"):
        model = instantiate_open_clip(open_clip_name_config(name))
    return {key: torch.zeros(()).expand(value.shape) for key, value in model.state_dict().items()}


@pytest.fixture(scope="module")
def vit_l14_state() -> dict[str, torch.Tensor]:
    return zero_stride_state("ViT-L-14")


def test_official_table_matches_the_released_files():
    # REFERENCE.md §1.4 / §1.6 and fixtures/pacscore/FORMAT.md §2, by hand
    expected = {
        "clip_ViT-B-32.pth": ("pac-s", "ViT-B-32", True, OPENAI_MEAN, OPENAI_STD, 2.0),
        "openClip_ViT-L-14.pth": ("pac-s", "ViT-L-14", False, HALF, HALF, 2.0),
        "PAC++_clip_ViT-B-32.pth": ("pac-s++", "ViT-B-32", True, OPENAI_MEAN, OPENAI_STD, 2.5),
        "PAC++_clip_ViT-L-14.pth": ("pac-s++", "ViT-L-14", True, OPENAI_MEAN, OPENAI_STD, 3.0),
    }
    assert set(OFFICIAL_CHECKPOINTS) == set(expected)
    for file, (family, architecture, quick_gelu, mean, std, w) in expected.items():
        entry = OFFICIAL_CHECKPOINTS[file]
        preset = ARCH_PRESETS[entry.preset]
        assert (entry.family, entry.architecture, preset.quick_gelu, preset.mean, preset.std, entry.default_w) == (
            family, architecture, quick_gelu, mean, std, w), file
        # the metric registry's default w agrees with the table for that architecture
        assert default_w(family, open_clip_name_config(architecture)) == w, file


def test_renamed_official_vit_l14_is_refused_naming_arch(vit_l14_state, tmp_path, image_dir, capsys):
    """A renamed openClip_ViT-L-14.pth used to get QuickGELU + OpenAI mean/std silently; now it is refused."""
    for name in ("pacs_vit_l14.pth", "openClip_ViT-L-14_copy.pth"):  # the old prefix rule no longer applies
        path = tmp_path / name
        torch.save({"state_dict": vit_l14_state}, path)
        with pytest.raises(InputError, match=r"ViT-L-14 has more than one official variant \(openai, openclip-laion\)"
                                             r".*arch=openai .*arch=openclip-laion"):
            load_backbone(checkpoint=str(path))
    (tmp_path / "c.json").write_text(json.dumps({"img0": "a photo"}))
    out = tmp_path / "out.json"
    code = main(["score", "--metric", "pac-s", "--images", str(image_dir), "--candidates", str(tmp_path / "c.json"),
                 "--checkpoint", str(tmp_path / "pacs_vit_l14.pth"), "--out", str(out)])
    assert code == 2 and "--arch openclip-laion" in capsys.readouterr().err and not out.exists()


def test_exact_official_names_establish_activation_normalisation_and_family(vit_l14_state, tmp_path, monkeypatch):
    from pacs.metric.models import official

    config, overrides, how = resolve_architecture(vit_l14_state, Path("openClip_ViT-L-14.pth"))
    assert config["quick_gelu"] is False and overrides == {"mean": HALF, "std": HALF}
    assert how.startswith("official file name openClip_ViT-L-14.pth")
    assert (config["vision_cfg"]["width"], config["text_cfg"]["width"], config["text_cfg"]["heads"]) == (1024, 768, 12)
    config, overrides, _ = resolve_architecture(vit_l14_state, Path("PAC++_clip_ViT-L-14.pth"))
    assert config["quick_gelu"] is True and overrides == {"mean": OPENAI_MEAN, "std": OPENAI_STD}
    # ViT-B/32 has a single official variant (OpenAI), whatever the file is called
    config, overrides, how = resolve_architecture(zero_stride_state("ViT-B-32"), Path("my_finetune.pth"))
    assert config["quick_gelu"] is True and overrides == {"mean": OPENAI_MEAN, "std": OPENAI_STD}
    assert "ViT-B-32" in how
    # the whole load path, with the ViT-L/14 model replaced by a tiny one (the config it gets is recorded)
    built: list[dict] = []
    tiny = build_backbone_from_config(tiny_clip_config(), seed=0).model
    monkeypatch.setattr(official, "instantiate_open_clip", lambda cfg: built.append(cfg) or tiny)
    monkeypatch.setattr(official, "load_state_strict", lambda model, state, path: None)
    path = tmp_path / "openClip_ViT-L-14.pth"
    torch.save({"state_dict": vit_l14_state}, path)
    loaded = load_backbone(checkpoint=str(path))
    assert built[0]["quick_gelu"] is False and loaded.preprocess.mean == HALF and loaded.preprocess.std == HALF
    assert (loaded.family, loaded.family_source) == ("pac-s", "official-name:openClip_ViT-L-14.pth")
    assert loaded.source["family_source"] == "official-name:openClip_ViT-L-14.pth"


def test_official_name_on_other_shapes_is_an_error(tmp_path):
    config = tiny_clip_config(vision_cfg={"head_width": 64}, text_cfg={"width": 64, "heads": 1})
    path = tmp_path / "clip_ViT-B-32.pth"
    torch.save({"state_dict": build_backbone_from_config(config).model.state_dict()}, path)
    with pytest.raises(InputError, match=r"named like the official clip_ViT-B-32.pth \(ViT-B-32\)"):
        load_backbone(checkpoint=str(path))


def test_family_sources_and_contradictions(pacscore_fixtures, tiny_backbone, tmp_path):
    assert establish_family("model.pth", False, None) == (None, "not established")
    assert establish_family("model.pth", False, "pac-s") == ("pac-s", "user --family")
    assert establish_family("model.pth", True, None) == ("pac-s++", "lora-keys")
    assert establish_family("PAC++_clip_ViT-B-32.pth", False, None) == (
        "pac-s++", "official-name:PAC++_clip_ViT-B-32.pth")
    with pytest.raises(InputError, match="rename"):  # a PAC-S name on a file with LoRA keys
        establish_family("clip_ViT-B-32.pth", True, None)
    fixture_a = pacscore_fixtures / "A"
    with pytest.raises(FamilyMismatchError, match="family= pac-s contradicts PAC\\+\\+_tiny_A.pth.*lora-keys"):
        load_backbone(checkpoint=str(fixture_a / "PAC++_tiny_A.pth"), arch=str(fixture_a / "arch.json"), family="pac-s")
    saved = save_backbone(dataclasses.replace(tiny_backbone, family="pac-s++"), tmp_path / "m.safetensors")
    loaded = load_backbone(checkpoint=str(saved), family="pac-s++")
    assert (loaded.family, loaded.family_source) == ("pac-s++", "pacs-metadata")
    with pytest.raises(FamilyMismatchError, match="family= clip contradicts") as raised:  # the Python name
        load_backbone(checkpoint=str(saved), family="clip")
    assert raised.value.parameters == ("family",)
    assert cli_message(raised.value).startswith("--family clip contradicts")  # what `pacs score` prints
    unlabelled = save_backbone(dataclasses.replace(tiny_backbone, family=None), tmp_path / "u.safetensors")
    assert load_backbone(checkpoint=str(unlabelled)).family is None


def _score(tmp_path: Path, image_dir: Path, metric: str, *model: str) -> tuple[int, Path]:
    (tmp_path / "c.json").write_text(json.dumps({"img0": "a red square", "img1": "noise"}))
    (tmp_path / "r.json").write_text(json.dumps({"img0": ["a square"], "img1": ["random pixels"]}))
    out = tmp_path / f"{metric}-{len(model)}.json"
    code = main(["score", "--metric", metric, "--images", str(image_dir), "--candidates", str(tmp_path / "c.json"),
                 "--references", str(tmp_path / "r.json"), "--out", str(out), *model])
    return code, out


def test_metric_contradicting_the_family_exits_2_unless_allowed(pacscore_fixtures, tiny_backbone, image_dir,
                                                                 tmp_path, capsys):
    pac_s_file = save_backbone(dataclasses.replace(tiny_backbone, family="pac-s"), tmp_path / "pacs.safetensors")
    code, out = _score(tmp_path, image_dir, "pac-s++", "--checkpoint", str(pac_s_file))
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert "pac-s++ needs a pac-s++ model" in err and "pacs-metadata" in err and "--allow-family-mismatch" in err
    code, out = _score(tmp_path, image_dir, "pac-s++", "--checkpoint", str(pac_s_file), "--allow-family-mismatch")
    provenance = json.loads(out.read_text())["provenance"]
    assert code == 0 and (provenance["family"], provenance["family_source"]) == ("pac-s", "pacs-metadata")
    fixture_a = pacscore_fixtures / "A"
    code, out = _score(tmp_path, image_dir, "clip-s", "--checkpoint", str(fixture_a / "PAC++_tiny_A.pth"),
                       "--arch", str(fixture_a / "arch.json"))
    assert code == 2 and "clip-s needs a clip model" in capsys.readouterr().err and not out.exists()
    fixture_c = pacscore_fixtures / "C"
    c_model = ["--checkpoint", str(fixture_c / "clip_tiny_C.pth"), "--arch", str(fixture_c / "arch.json")]
    code, out = _score(tmp_path, image_dir, "ref-pac-s++", *c_model, "--family", "pac-s")
    assert code == 2 and "user --family" in capsys.readouterr().err
    code, out = _score(tmp_path, image_dir, "pac-s", *c_model, "--family", "pac-s")
    provenance = json.loads(out.read_text())["provenance"]
    assert code == 0 and (provenance["family"], provenance["family_source"]) == ("pac-s", "user --family")
    code, out = _score(tmp_path, image_dir, "pac-s", *c_model)  # nothing establishes C's family: nothing contradicts
    provenance = json.loads(out.read_text())["provenance"]
    assert code == 0 and (provenance["family"], provenance["family_source"]) == (None, "not established")


def test_evaluate_provenance_names_how_the_family_was_established(tiny_backbone, image_dir, tmp_path):
    checkpoint = save_backbone(tiny_backbone, tmp_path / "clip.safetensors")  # family "clip" in its metadata
    (tmp_path / "c.json").write_text(json.dumps({"img0": "a red square"}))
    (tmp_path / "r.json").write_text(json.dumps({"img0": ["a square"]}))
    out = tmp_path / "eval.json"
    assert main(["evaluate", "--candidates", str(tmp_path / "c.json"), "--references", str(tmp_path / "r.json"),
                 "--metrics", "clip-s", "--images", str(image_dir), "--checkpoint", str(checkpoint),
                 "--out", str(out)]) == 0
    models = json.loads(out.read_text())["provenance"]["models"]
    assert models["clip-s"]["family"] == "clip" and models["clip-s"]["family_source"] == "pacs-metadata"


def test_cli_message_writes_parameters_as_flags_with_and_without_values() -> None:
    error = InputError("pass arch=openai, arch=FILE or image_map= (arch= alone, and not xarch=)",
                       parameter=("arch", "image_map"))
    assert cli_message(error) == "pass --arch openai, --arch FILE or --image-map (--arch alone, and not xarch=)"
    assert str(error).startswith("pass arch=openai")  # what a Python user reads
