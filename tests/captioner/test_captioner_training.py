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
from captioner_testkit import overlap_reward, tiny_checkpoint, tiny_data, tiny_model_config
from safetensors.torch import load_file

from pacs.captioner.modeling.checkpoints import CheckpointError, load_captioner
from pacs.captioner.modeling.decoding import sample
from pacs.captioner.modeling.example_rng import DROPOUT, SAMPLING, ExampleRNG, example_generators, example_seed
from pacs.captioner.modeling.model import shift_right
from pacs.captioner.modeling.train_scst import NonFiniteRewardError, SCSTConfig, train_scst
from pacs.captioner.modeling.train_xe import XEConfig, train_xe
from pacs.captioner.modeling.training_setup import ScheduleConfig
from pacs.captioner.modeling.vocab import build_vocab

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
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=400, check=False)
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
                                              final_lr=1e-4), eval_every=20, save_every=20, log_every=1,
                      trackers=[])
    result = train_xe(config, tiny_model_config(), vocab, cache, train, val)
    assert result.losses[-1] < 0.3 * result.losses[0]
    assert result.best_step in (20, 40) and result.best_score > 50.0  # CIDEr-D x100 on held-out images
    _model, loaded_vocab, info = load_captioner(result.best_dir)
    assert info["provenance"]["stage"] == "xe" and loaded_vocab.itos == vocab.itos
    rows = (tmp_path / "xe" / "log.csv").read_text().splitlines()
    assert rows[0].startswith("step,loss,lr") and len(rows) == 41
    assert [p.name for p in (tmp_path / "xe" / "checkpoints").iterdir()] == ["step-00000020", "step-00000040"] or \
        sorted(p.name for p in (tmp_path / "xe" / "checkpoints").iterdir()) == ["step-00000020", "step-00000040"]


# The literal command: accelerate's `--cpu` launcher starts one process (without MPI); the driver, like
# the recipes, re-executes itself as 2 gloo CPU processes (captioner/orchestration/launching.py).
LAUNCH_2 = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]


@pytest.mark.slow
def test_two_processes_match_one_for_features_xe_and_scst(tmp_path, shared_data):
    """`accelerate launch --num_processes 2 --cpu` with the same global batches as one process (dropout off)."""
    images = str(shared_data / "flickr8k" / "images")
    _, one = _driver(["multi", str(tmp_path / "one"), images, "16", "4"])
    _, two = _driver(["multi", str(tmp_path / "two"), images, "8", "4"], LAUNCH_2)
    assert one["world"] == [1.0] and two["world"] == [2.0]
    # bit-equal: every image is encoded alone (the driver's batch_size=1) on one process as on two
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


@pytest.mark.slow
def test_sigkill_then_resume_with_a_learned_reward_gives_bit_identical_losses(tmp_path):
    """RefCLIP-S of a tiny CLIP as the reward: the resumed run restores the reward's embedding caches from the
    checkpoint, so it encodes the same texts and images in the same batches as the run it continues."""
    _, full = _driver(["scst-learned", str(tmp_path / "full"), "4", "8", "0"])
    code, _ = _driver(["scst-learned", str(tmp_path / "killed"), "4", "8", "10"], check=False)
    assert code == -9
    checkpoint = tmp_path / "killed" / "checkpoints" / "step-00000003"
    saved = torch.load(checkpoint / "extra_state_0.pt", weights_only=True)["reward"]["fn"]
    assert len(saved["images"]["ids"]) == 24 and len(saved["scorer"]["texts"]) > 24  # 3 steps of 8 images
    _, resumed = _driver(["scst-learned", str(tmp_path / "killed"), "4", "8", "0"])
    assert len(resumed["scst"]) == 5 and len(set(full["scst"])) > 1
    assert resumed["scst"] == full["scst"][3:]  # exact float equality


@pytest.mark.slow
def test_xe_sigkill_then_resume_gives_bit_identical_losses_and_micro_batch_size_does_not_matter(tmp_path):
    """XE with dropout on: SIGKILL during step 5's validation, resume from step 3 (checkpoints every 3 steps)."""
    _, full = _driver(["xe", str(tmp_path / "full"), "8", "8", "0"])
    code, _ = _driver(["xe", str(tmp_path / "killed"), "8", "8", "5"], check=False)
    assert code == -9
    assert sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir()) == ["step-00000003"]
    shutil.copytree(tmp_path / "killed", tmp_path / "killed-micro4")
    _, resumed = _driver(["xe", str(tmp_path / "killed"), "8", "8", "0"])
    assert len(full["xe"]) == 8 and len(resumed["xe"]) == 5
    assert resumed["xe"] == full["xe"][3:]  # exact float equality (dropout on)
    logged = [line.split(",")[0] for line in (tmp_path / "killed" / "log.csv").read_text().splitlines()[1:]]
    assert logged == [str(i) for i in range(1, 9)]
    # The same checkpoint resumed with half the micro-batch (2 accumulation steps instead of 1): the dropout masks
    # are drawn per caption, so only the summation order of the gradients differs (float rounding, 1e-5).
    _, micro4 = _driver(["xe", str(tmp_path / "killed-micro4"), "4", "8", "0"])
    assert len(micro4["xe"]) == 5
    for a, b in zip(micro4["xe"], full["xe"][3:]):
        assert abs(a - b) <= 1e-5 * abs(b), (micro4["xe"], full["xe"][3:])


@pytest.mark.slow
def test_two_processes_match_one_for_scst_with_sampled_captions_and_dropout(tmp_path):
    """`samples: multinomial`, dropout 0.1: 1 process × micro 4 vs 2 gloo processes × micro 2, same global batches."""
    _, one = _driver(["scst", str(tmp_path / "one"), "4", "4", "0"])
    _, two = _driver(["scst", str(tmp_path / "two"), "2", "4", "0"], LAUNCH_2)
    assert one["world"] == [1.0] and two["world"] == [2.0]
    assert len(one["scst"]) == len(two["scst"]) == 4 and len(set(one["scst"])) > 1
    # Tolerance: the two runs differ only by the order of floating-point sums (gradient accumulation over micro-
    # batches vs. a gloo all-reduce of two halves), the same 1e-5 as the beam/no-dropout equivalence test.
    for a, b in zip(one["scst"], two["scst"]):
        assert abs(a - b) <= 1e-5 * max(abs(a), 1e-6), (one["scst"], two["scst"])
    weights_one = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    weights_two = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    init = load_file(str(tmp_path / "data" / "init" / "model.safetensors"))
    assert any(not torch.equal(weights_one[name], init[name]) for name in init)  # training moved the weights
    for name, tensor in weights_one.items():
        other = weights_two[name]
        if name.endswith("key_value.bias"):
            # The key half of these biases has an exactly zero gradient (softmax ignores a shift shared by all
            # keys), so Adam turns the float noise in it into lr-sized steps: compare only the value half.
            tensor, other = tensor[tensor.shape[0] // 2:], other[other.shape[0] // 2:]
        assert torch.allclose(tensor, other, rtol=0, atol=1e-6), name  # weights moved by ~4e-3


def _tiny_model(tmp_path: Path, dropout: float):
    cache, _, _ = tiny_data(tmp_path)
    model, _, _ = load_captioner(tiny_checkpoint(tmp_path, dropout=dropout, name=f"model-{dropout}"))
    return model, cache.get([f"img{i}" for i in range(4)])


def test_sampled_captions_of_an_example_do_not_depend_on_the_rest_of_the_batch(tmp_path):
    model, feats = _tiny_model(tmp_path, dropout=0.0)
    indices = [10, 11, 12, 13]  # global example indices of the 4 images

    def drawn(rows: slice) -> torch.Tensor:
        rng = ExampleRNG(example_generators(42, 7, indices[rows], SAMPLING))
        return sample(model, feats[rows], k=3, max_length=8, rng=rng).tokens

    four, last_two = drawn(slice(0, 4)), drawn(slice(2, 4))
    alone = torch.cat([drawn(slice(i, i + 1)) for i in range(4)])  # the simplest batch: one image at a time
    assert torch.equal(four, alone)
    assert torch.equal(four[2:], last_two)
    assert not torch.equal(four[2], four[3]) or not torch.equal(four[0], four[1])  # different streams per example
    # A different step draws different captions for the same example.
    other_step = sample(model, feats, k=3, max_length=8, rng=ExampleRNG(example_generators(42, 8, indices, SAMPLING)))
    assert not torch.equal(other_step.tokens, four)


def test_dropout_masks_come_from_the_example_generator(tmp_path):
    model, _feats = _tiny_model(tmp_path, dropout=0.3)
    drop = model.decoder[0].drop
    drop.train()
    x = torch.ones(4, 2, 5)
    with model.example_rng(ExampleRNG(example_generators(1, 2, [5, 6], DROPOUT))):
        out = drop(x)  # 2 rows per example
    # Independent oracle: each example's 2 rows are one torch.rand draw from Generator().manual_seed(example_seed).
    draws = [torch.rand((2, 2, 5), generator=torch.Generator().manual_seed(example_seed(1, 2, i, DROPOUT)))
             for i in (5, 6)]
    expected = torch.cat([(d >= 0.3).float() / 0.7 for d in draws])
    assert torch.equal(out, expected)
    assert drop.rng is None  # the context is closed


def test_training_forward_with_dropout_does_not_depend_on_batch_composition(tmp_path):
    model, feats = _tiny_model(tmp_path, dropout=0.3)
    tokens = torch.randint(4, model.config.vocab_size, (8, 6), generator=torch.Generator().manual_seed(0))
    indices = [3, 1, 4, 0]
    model.train()

    def logits(rows: slice) -> torch.Tensor:
        rng = ExampleRNG(example_generators(42, 0, indices[rows], DROPOUT))
        with model.example_rng(rng):  # 2 captions per image (SCST's repeats)
            return model(feats[rows], shift_right(tokens[2 * rows.start:2 * rows.stop]), repeats=2)

    four, last_two = logits(slice(0, 4)), logits(slice(2, 4))
    torch.testing.assert_close(four[4:], last_two, rtol=1e-5, atol=1e-6)
    model.eval()
    plain = model(feats, shift_right(tokens), repeats=2)
    assert (four - plain).abs().max() > 1e-2  # dropout really was on


def _scst(tmp_path: Path, out: str, steps: int, reward=overlap_reward, **overrides) -> object:
    cache, train, _ = tiny_data(tmp_path)
    init = tmp_path / "init"
    if not init.is_dir():
        tiny_checkpoint(tmp_path, dropout=0.1)
    config = SCSTConfig(output_dir=str(tmp_path / out), reward="overlap", lr=1e-3, batch_size=8, micro_batch_size=8,
                        epochs=3, max_steps=steps, k=3, save_every=2, trackers=[])
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
        _scst(tmp_path, "run", 6, resume=str(folder / "step-00000002"))


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
