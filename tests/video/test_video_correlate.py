"""`pacs correlate vatex-eval` and `pacs correlate activitynet-foil` end to end on small released-format data."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pacs.cli import main
from pacs.eval.benchmarks.vatex_eval import load_vatex_eval
from pacs.metric.models.backbones import save_backbone
from pacs.metric.video.frames import FrameSampling
from pacs.metric.video.scorer import VideoScorer

from .video_support import build_tiny_backbone, tau_b_by_pairs, write_activitynet_foil, write_vatex_eval


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny backbone saved as a pacs PAC-S++ checkpoint."""
    return save_backbone(build_tiny_backbone("pac-s++"), tmp_path_factory.mktemp("ckpt") / "tiny.safetensors")


def test_correlate_vatex_eval(checkpoint, tmp_path, capsys):
    data = write_vatex_eval(tmp_path / "VATEX-EVAL", n_videos=3, per_video=4, n_refs=10, videos_dir=tmp_path / "v")
    out = tmp_path / "vatex.json"
    code = main(["--log-level", "WARNING", "correlate", "vatex-eval", "--data", str(data), "--videos",
                 str(tmp_path / "v"), "--metrics", "pac-s++,ref-pac-s++,bleu1", "--checkpoint", str(checkpoint),
                 "--num-frames", "4", "--bootstrap", "20", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "ref-pac-s++@9" in printed
    result = json.loads(out.read_text())
    for key in ("pac-s++", "ref-pac-s++@1", "ref-pac-s++@9", "bleu1@1", "bleu1@9"):
        row = result[key]
        assert row["n"] == 12 and {"tau_b", "tau_c", "spearman", "tau_b_ci"} <= set(row)
    assert result["benchmark"] == "vatex-eval"
    # expected tau-b: the Python API's scores (4 frames, IDF from the released train corpus) rounded to 4 decimals
    # as EMScore's evaluation does, against each of the 3 annotators by counting pairs, averaged, x100
    loaded = load_vatex_eval(data)
    scorer = VideoScorer(build_tiny_backbone("pac-s++"), FrameSampling(fps=None, num_frames=4), progress=False)
    idf = scorer.idf(loaded.idf_corpus)
    videos = [tmp_path / "v" / f"{v}.mp4" for v in loaded.video_ids]
    for key, n_refs in (("pac-s++", 0), ("ref-pac-s++@1", 1), ("ref-pac-s++@9", 9)):
        refs = [group[:n_refs] for group in loaded.references] if n_refs else None
        scores = np.around(scorer.score(videos, loaded.candidates, refs, idf=idf).scores, 4)
        expected = 100 * np.mean([tau_b_by_pairs(scores, loaded.human_scores[:, a]) for a in range(3)])
        assert result[key]["tau_b"] == pytest.approx(expected, abs=1e-6)
    # bleu1: per-caption BLEU-1 of PTB-tokenized captions computed by pycocoevalcap directly
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tokenizer = PTBTokenizer()
    for key, n_refs in (("bleu1@1", 1), ("bleu1@9", 9)):
        gts = tokenizer.tokenize({i: [{"caption": r} for r in group[:n_refs]]
                                  for i, group in enumerate(loaded.references)})
        res = tokenizer.tokenize({i: [{"caption": c}] for i, c in enumerate(loaded.candidates)})
        _, per = Bleu(1).compute_score(gts, res, verbose=0)
        bleu = np.around(np.asarray(per[0]), 4)
        expected = 100 * np.mean([tau_b_by_pairs(bleu, loaded.human_scores[:, a]) for a in range(3)])
        assert result[key]["tau_b"] == pytest.approx(expected, abs=1e-6)


def test_correlate_activitynet_foil(checkpoint, tmp_path, capsys):
    data = write_activitynet_foil(tmp_path / "ActivityNet-FOIL", videos_dir=tmp_path / "v")
    out = tmp_path / "anet.json"
    args = ["--log-level", "WARNING", "correlate", "activitynet-foil", "--data", str(data), "--videos",
            str(tmp_path / "v"), "--metrics", "pac-s++,ref-pac-s++,length", "--checkpoint", str(checkpoint),
            "--fps", "2", "--out", str(out)]
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
