"""Strict JSON (no NaN/Infinity, the key path named, no file left) and output modes that follow the umask."""
from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from pacs.metric.common import io
from pacs.metric.common.errors import InputError, NonFiniteError
from pacs.metric.common.io import (
    atomic_path,
    current_umask,
    finite_or_none,
    first_nonfinite,
    nonfinite_to_none,
    write_json_atomic,
    write_text_atomic,
)


@pytest.mark.parametrize(("value", "where"), [(float("nan"), "rows[1].score"), (math.inf, "rows[1].score"),
                                              (-math.inf, "rows[1].score")])
def test_write_json_refuses_non_finite_numbers_naming_file_and_key(tmp_path, value, where):
    target = tmp_path / "out.json"
    data = {"n": 2, "rows": [{"score": 1.0}, {"score": value, "ok": 2.0}]}
    with pytest.raises(NonFiniteError) as caught:
        write_json_atomic(target, data)
    assert str(caught.value).startswith(f"{target}: refusing to write {value} at {where}: JSON has no NaN/Infinity")
    assert isinstance(caught.value, InputError) and isinstance(caught.value, ValueError)
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary


def test_key_paths_of_odd_keys_tuples_and_the_top_level(tmp_path):
    assert first_nonfinite({"Halluc.": [(1.0, float("nan"))]}) == ("[\"Halluc.\"][0][1]", pytest.approx(math.nan,
                                                                                                     nan_ok=True))
    assert first_nonfinite(float("inf")) == ("$", math.inf)
    assert first_nonfinite({"a": [1, "x", None, True, {"b": 2.5}]}) is None
    with pytest.raises(NonFiniteError, match=r"at \$: JSON"):
        write_json_atomic(tmp_path / "top.json", float("nan"))
    assert not (tmp_path / "top.json").exists()


def test_an_existing_file_is_kept_when_the_new_content_is_refused(tmp_path):
    target = tmp_path / "out.json"
    write_json_atomic(target, {"mean": 0.5})
    with pytest.raises(NonFiniteError, match="at mean"):
        write_json_atomic(target, {"mean": float("nan")})
    assert json.loads(target.read_text(encoding="utf-8")) == {"mean": 0.5}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_undefined_values_are_written_as_null():
    data = {"tau": float("nan"), "inf": [math.inf, 1.5], "np": np.float32(2.0), "nan32": np.float32("nan"),
            "array": np.array([1.0, np.nan]), "int": np.int64(3), "text": "x", "none": None}
    assert nonfinite_to_none(data) == {"tau": None, "inf": [None, 1.5], "np": 2.0, "nan32": None,
                                       "array": [1.0, None], "int": 3, "text": "x", "none": None}
    assert [finite_or_none(v) for v in (None, float("nan"), -math.inf, 3, 2.5)] == [None, None, None, 3.0, 2.5]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _write_every_kind(folder: Path) -> list[Path]:
    """A JSON, a text file and a safetensors checkpoint written through atomic_path."""
    from safetensors.torch import save_file

    write_json_atomic(folder / "a.json", {"x": 1})
    write_text_atomic(folder / "sub" / "b.txt", "hello")
    with atomic_path(folder / "c.safetensors") as tmp:
        save_file({"w": torch.zeros(2)}, str(tmp))
    return [folder / "a.json", folder / "sub" / "b.txt", folder / "c.safetensors"]


@pytest.mark.parametrize(("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                               (0o002, 0o664, 0o775)])
def test_outputs_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    old = os.umask(umask)
    try:
        assert current_umask() == umask
        files = _write_every_kind(tmp_path / "out")
        modes = {path.name: _mode(path) for path in files}
        folder_mode = _mode(tmp_path / "out" / "sub")
    finally:
        os.umask(old)
    assert modes == {"a.json": file_mode, "b.txt": file_mode, "c.safetensors": file_mode}
    assert folder_mode == dir_mode


def test_the_umask_fallback_without_proc(monkeypatch):
    def no_proc(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr(io, "open", no_proc, raising=False)
    old = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        assert os.umask(0o027) == 0o027  # the fallback restored it
    finally:
        os.umask(old)


def _checkpoints(folder: Path) -> list[Path]:
    """A metric checkpoint (save_backbone), a captioner folder (save_captioner) and a chmod'ed private folder."""
    import tempfile

    from pacs.captioner.modeling.checkpoints import save_captioner
    from pacs.captioner.modeling.model import Captioner, CaptionerConfig
    from pacs.captioner.modeling.vocab import build_vocab
    from pacs.metric.models.backbones import build_backbone_from_config, save_backbone, tiny_clip_config

    backbone = build_backbone_from_config(tiny_clip_config(), seed=0, name="tiny-umask")
    save_backbone(backbone, folder / "clip.safetensors")
    vocab = build_vocab("word", ["a red circle", "a blue square"], min_count=1, max_length=5)
    config = CaptionerConfig(d_model=8, n_heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=8, vocab_size=len(vocab),
                             feature_dim=4, max_length=vocab.max_length)
    save_captioner(folder / "captioner", Captioner(config), vocab, {"backbone": "test"})
    private = Path(tempfile.mkdtemp(dir=folder))
    (private / "x.txt").write_text("x")
    io.chmod_like_umask(private)
    return [folder / "clip.safetensors", folder / "captioner" / "model.safetensors",
            folder / "captioner" / "captioner.json", private / "x.txt", folder / "captioner", private]


@pytest.mark.parametrize(("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_checkpoints_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    old = os.umask(umask)
    try:
        paths = _checkpoints(tmp_path)
    finally:
        os.umask(old)
    assert [_mode(path) for path in paths] == [file_mode] * 4 + [dir_mode] * 2


def _files_and_folders(root: Path) -> tuple[set[int], set[int]]:
    paths = [root, *root.rglob("*")]
    return ({_mode(p) for p in paths if p.is_file()}, {_mode(p) for p in paths if p.is_dir()})


@pytest.mark.parametrize(("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_training_runs_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    """Every file of a metric training run (states, adapter, checkpoint, log) and of an XE run (accelerate
    states, best/final captioner folders, log) has the umask's mode."""
    from pacs.captioner.modeling.features import write_feature_cache
    from pacs.captioner.modeling.model import CaptionerConfig
    from pacs.captioner.modeling.train_xe import XEConfig, train_xe
    from pacs.captioner.modeling.training_setup import ScheduleConfig
    from pacs.captioner.modeling.vocab import build_vocab
    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    from pacs.metric.training.data import TensorPositivesDataset
    from pacs.metric.training.trainer import MetricTrainConfig, train_metric

    generator = torch.Generator().manual_seed(0)
    images = torch.randn(8, 3, 32, 32, generator=generator)
    captions = [f"thing {i % 3}" for i in range(8)]
    data = TensorPositivesDataset(images, captions, images + 0.1, [c.upper() for c in captions])
    backbone = build_backbone_from_config(tiny_clip_config(vision_cfg={"image_size": 32, "patch_size": 8},
                                                           text_cfg={"context_length": 16}), seed=0)
    features = {f"img{i}": torch.randn(3, 4, generator=generator) for i in range(6)}
    train = [(f"img{i}", "a red circle" if i % 2 else "a blue square") for i in range(4)]
    vocab = build_vocab("word", [c for _, c in train], min_count=1, max_length=5)
    xe = XEConfig(output_dir=str(tmp_path / "xe"), max_steps=2, batch_size=4, micro_batch_size=4,
                  schedule=ScheduleConfig(warmup_steps=0, constant_until=2, decay_until=2, peak_lr=1e-3,
                                          final_lr=1e-3),
                  eval_every=1, val_beam_size=1, save_every=1, keep_checkpoints=2, trackers=[])
    old = os.umask(umask)
    try:
        train_metric(MetricTrainConfig(mode="lora", random_init=True, batch_size=4, max_steps=2, eval_every=1,
                                       save_every=1, log_every=0, seed=0, output_dir=str(tmp_path / "metric")),
                     data, data, backbone=backbone)
        cache = write_feature_cache(features, tmp_path / "features")
        train_xe(xe, CaptionerConfig(d_model=8, n_heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=8), vocab,
                 cache, train, {"img4": ["a red circle"], "img5": ["a blue square"]})
    finally:
        os.umask(old)
    for run in ("metric", "xe", "features"):
        assert _files_and_folders(tmp_path / run) == ({file_mode}, {dir_mode}), run
    assert (tmp_path / "metric" / "adapter").is_dir() and (tmp_path / "metric" / "state").is_dir()
    assert (tmp_path / "xe" / "checkpoints" / "step-00000002" / "model.safetensors").is_file()
