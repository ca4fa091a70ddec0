"""`pacs correlate vatex-eval` and `pacs correlate activitynet-foil` end to end on small released-format data."""
from __future__ import annotations

import json

import pytest

from metric.backbones import save_backbone
from pacs_cli import main

from .video_support import build_tiny_backbone, write_activitynet_foil, write_vatex_eval


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny backbone saved as a pacs PAC-S++ checkpoint."""
    return save_backbone(build_tiny_backbone("pac-s++"), tmp_path_factory.mktemp("ckpt") / "tiny.safetensors")


def test_correlate_vatex_eval(checkpoint, tmp_path, capsys):
    data = write_vatex_eval(tmp_path / "VATEX-EVAL", n_videos=3, per_video=4, n_refs=10, videos_dir=tmp_path / "v")
    out = tmp_path / "vatex.json"
    code = main(["--log-level", "WARNING", "correlate", "vatex-eval", "--data", str(data), "--videos",
                 str(tmp_path / "v"), "--metrics", "pac-s++,ref-pac-s++,bleu1", "--checkpoint", str(checkpoint),
                 "--num-frames", "4", "--bootstrap", "20", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "ref-pac-s++@9" in printed
    result = json.loads(out.read_text())
    for key in ("pac-s++", "ref-pac-s++@1", "ref-pac-s++@9", "bleu1@1", "bleu1@9"):
        row = result[key]
        assert row["n"] == 12 and {"tau_b", "tau_c", "spearman", "tau_b_ci"} <= set(row)
        assert -100 <= row["tau_b"] <= 100
    assert result["benchmark"] == "vatex-eval"


def test_correlate_activitynet_foil(checkpoint, tmp_path, capsys):
    data = write_activitynet_foil(tmp_path / "ActivityNet-FOIL", videos_dir=tmp_path / "v")
    out = tmp_path / "anet.json"
    args = ["--log-level", "WARNING", "correlate", "activitynet-foil", "--data", str(data), "--videos",
            str(tmp_path / "v"), "--metrics", "pac-s++,ref-pac-s++,length", "--checkpoint", str(checkpoint),
            "--fps", "2", "--json", str(out)]
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert {"pac-s++", "ref-pac-s++", "length"} <= set(result)
    assert result["pac-s++"]["n"] == 2 and result["pac-s++"]["1-ref"] == result["pac-s++"]["mean"]
    (tmp_path / "v" / "v_a.mp4").unlink()
    out.unlink()
    capsys.readouterr()
    assert main(args) == 2
    assert "v_a" in capsys.readouterr().err and not out.exists()
    assert main(args + ["--skip-missing-images"]) == 0
    result = json.loads(out.read_text())
    assert result["pac-s++"]["n"] == 1 and result["counts"]["skipped_missing_video"] == 1
