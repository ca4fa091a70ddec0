"""XE and SCST under accelerate: learning, two-process equivalence, SIGKILL + resume, checkpoint safety."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from captioner.checkpoints import CheckpointError, load_captioner
from captioner.train_scst import NonFiniteRewardError, SCSTConfig, train_scst
from captioner.train_xe import XEConfig, train_xe
from captioner.training import ScheduleConfig
from captioner.vocab import build_vocab
from captioner_testkit import overlap_reward, tiny_checkpoint, tiny_data, tiny_model_config

torch.set_num_threads(1)
HERE = Path(__file__).resolve().parent
DRIVER = HERE / "captioner_driver.py"


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


def _driver(args: list[str], launcher: list[str] | None = None, check: bool = True) -> tuple[int, dict]:
    """Run the driver; return its exit code and {name: values} of its RESULT lines."""
    command = (launcher or [sys.executable]) + [str(DRIVER), *args]
    env = _env()
    if launcher:
        env["ACCELERATE_USE_CPU"] = "1"
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=400)
    results = {line.split(" ", 2)[1]: [float(x) for x in json.loads(line.split(" ", 2)[2])]
               for line in done.stdout.splitlines() if line.startswith("RESULT ")}
    if check and (done.returncode != 0 or not results):
        raise AssertionError(f"driver failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done.returncode, results


def test_xe_learns_validates_and_keeps_best_checkpoint(tmp_path):
    cache, train, val = tiny_data(tmp_path)
    vocab = build_vocab("word", [c for _, c in train], min_count=1, max_length=8)
    config = XEConfig(output_dir=str(tmp_path / "xe"), max_steps=40, batch_size=32, micro_batch_size=16,
                      schedule=ScheduleConfig(warmup_steps=5, constant_until=25, decay_until=35, peak_lr=3e-3,
                                              final_lr=1e-4), val_every=20, checkpoint_every=20, log_every=1,
                      tensorboard=False)
    result = train_xe(config, tiny_model_config(), vocab, cache, train, val)
    assert result.losses[-1] < 0.3 * result.losses[0]
    assert result.best_step in (20, 40) and result.best_score > 50.0  # CIDEr-D x100 on held-out images
    model, loaded_vocab, info = load_captioner(result.best_dir)
    assert info["provenance"]["stage"] == "xe" and loaded_vocab.itos == vocab.itos
    rows = (tmp_path / "xe" / "log.csv").read_text().splitlines()
    assert rows[0].startswith("step,loss,lr") and len(rows) == 41
    assert [p.name for p in (tmp_path / "xe" / "checkpoints").iterdir()] == ["step-00000020", "step-00000040"] or \
        sorted(p.name for p in (tmp_path / "xe" / "checkpoints").iterdir()) == ["step-00000020", "step-00000040"]


# The literal command: accelerate's `--cpu` launcher starts one process (without MPI); the driver, like
# the recipes, re-executes itself as 2 gloo CPU processes (captioner/launching.py).
LAUNCH_2 = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]


@pytest.mark.slow
def test_two_processes_match_one_for_features_xe_and_scst(tmp_path, shared_data):
    """`accelerate launch --num_processes 2 --cpu` with the same global batches as one process (dropout off)."""
    images = str(shared_data / "flickr8k" / "images")
    _, one = _driver(["multi", str(tmp_path / "one"), images, "16", "4"])
    _, two = _driver(["multi", str(tmp_path / "two"), images, "8", "4"], LAUNCH_2)
    assert one["world"] == [1.0] and two["world"] == [2.0]
    assert len(one["features"]) == 7 and one["features"] == two["features"]
    for stage, steps in (("xe", 6), ("scst", 4)):
        assert len(one[stage]) == len(two[stage]) == steps
        for a, b in zip(one[stage], two[stage]):
            assert abs(a - b) <= 1e-5 * max(abs(a), 1e-6), (stage, one[stage], two[stage])
    assert one["xe"][-1] < one["xe"][0] and len(set(one["scst"])) > 1
    assert one["xe_best_cider"] == pytest.approx(two["xe_best_cider"], rel=1e-6)  # validation split + gathered


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_gives_bit_identical_losses(tmp_path):
    _, full = _driver(["scst", str(tmp_path / "full"), "4", "8", "0"])
    # 2 micro-batches (= reward calls) per step, checkpoints every 3 steps: call 10 is inside step 5.
    code, _ = _driver(["scst", str(tmp_path / "killed"), "4", "8", "10"], check=False)
    assert code == -9
    assert sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir()) == ["step-00000003"]
    _, resumed = _driver(["scst", str(tmp_path / "killed"), "4", "8", "0"])
    assert len(resumed["scst"]) == 5
    assert resumed["scst"] == full["scst"][3:]  # exact float equality, dropout and multinomial sampling on
    logged = [line.split(",")[0] for line in (tmp_path / "killed" / "log.csv").read_text().splitlines()[1:]]
    assert logged == [str(i) for i in range(1, 9)]  # rows of the killed run beyond step 3 were dropped


def _scst(tmp_path: Path, out: str, steps: int, reward=overlap_reward, **overrides) -> object:
    cache, train, _ = tiny_data(tmp_path)
    init = tmp_path / "init"
    if not init.is_dir():
        tiny_checkpoint(tmp_path, dropout=0.1)
    config = SCSTConfig(output_dir=str(tmp_path / out), reward="overlap", lr=1e-3, batch_size=8, micro_batch_size=8,
                        epochs=3, max_steps=steps, k=3, checkpoint_every=2, tensorboard=False)
    for key, value in overrides.items():
        setattr(config, key, value)
    items = list({image_id: [caption] for image_id, caption in train}.items())
    return train_scst(config, init, cache, items, reward)


def test_scst_improves_the_reward_with_each_baseline(tmp_path):
    for baseline in ("mean", "loo", "greedy"):
        result = _scst(tmp_path, f"scst-{baseline}", 12, baseline=baseline, samples="multinomial")
        rows = [line.split(",") for line in (tmp_path / f"scst-{baseline}" / "log.csv").read_text().splitlines()]
        header, rows = rows[0], rows[1:]
        reward = [float(r[header.index("reward_mean")]) for r in rows]
        assert len(rows) == 12 and all(math.isfinite(x) for x in result.losses)
        assert sum(reward[-3:]) > sum(reward[:3]), (baseline, reward)
        assert (tmp_path / f"scst-{baseline}" / "final" / "captioner.json").is_file()


def test_resume_without_rng_state_or_data_position_fails_loudly(tmp_path):
    _scst(tmp_path, "run", 2)
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000002"
    (checkpoint / "random_states_0.pkl").unlink()
    with pytest.raises(CheckpointError, match="random_states_0.pkl.*RNG state"):
        _scst(tmp_path, "run", 4)
    shutil.rmtree(tmp_path / "run")
    _scst(tmp_path, "run", 2)
    (checkpoint / "trainer_state.json").unlink()
    with pytest.raises(CheckpointError, match="position in the data"):
        _scst(tmp_path, "run", 4)


def test_corrupt_or_truncated_checkpoint_is_refused_and_previous_kept(tmp_path):
    _scst(tmp_path, "run", 4, keep_checkpoints=3)
    folder = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000002", "step-00000004"]
    weights = folder / "step-00000004" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"truncated.*previous checkpoint .*step-00000002 is kept"):
        _scst(tmp_path, "run", 6)
    assert (folder / "step-00000002").is_dir() and (folder / "step-00000004").is_dir()
    optimizer = folder / "step-00000002" / "optimizer.bin"
    data = bytearray(optimizer.read_bytes())
    data[len(data) // 2] ^= 0xFF
    optimizer.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="optimizer.bin is corrupt"):
        _scst(tmp_path, "run", 6, resume_from=str(folder / "step-00000002"))


def test_failed_checkpoint_write_keeps_previous_and_leaves_no_partial_folder(tmp_path, monkeypatch):
    _scst(tmp_path, "run", 2)
    folder = tmp_path / "run" / "checkpoints"
    from accelerate import Accelerator

    def broken(self, output_dir, **kwargs):
        Path(output_dir, "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(Accelerator, "save_state", broken)
    with pytest.raises(OSError, match="disk full"):
        _scst(tmp_path, "run", 4)
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["step-00000002"]


def test_nonfinite_rewards_are_replaced_counted_and_stop_training_when_persistent(tmp_path):
    def sometimes_nan(image_ids, captions, references):
        values = overlap_reward(image_ids, captions, references)
        values[0, 0] = float("nan")
        return values

    result = _scst(tmp_path, "nan-once", 2, reward=sometimes_nan, nonfinite_patience=5)
    assert result.nonfinite_total == 2 and all(math.isfinite(x) for x in result.losses)
    with pytest.raises(NonFiniteRewardError, match="3 consecutive steps"):
        _scst(tmp_path, "nan-always", 6, reward=sometimes_nan, nonfinite_patience=3)
