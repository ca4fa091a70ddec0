"""SCST guards against reward hacking (issue 24): KL to a frozen reference, the end token in the gradient,
the hacking monitor and its warning, checkpoint selection by a validation signal, config checks."""
from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path

import pytest
import torch
from captioner_testkit import overlap_reward, tiny_checkpoint, tiny_data, tiny_pipeline_recipe
from safetensors.torch import load_file

from pacs.captioner.modeling.checkpoints import load_captioner
from pacs.captioner.modeling.decoding import sample
from pacs.captioner.modeling.hacking_monitor import GamingThresholds, HackingMonitor, gaming_warning
from pacs.captioner.modeling.model import shift_right
from pacs.captioner.modeling.reference_policy import ReferencePolicy, token_log_ratio
from pacs.captioner.modeling.train_scst import (
    GUARD_FIELDS,
    MONITOR_THRESHOLD_FIELDS,
    SCSTConfig,
    guard_settings,
    scst_loss,
    train_scst,
)
from pacs.captioner.modeling.vocab import EOS_ID, PAD_ID
from pacs.captioner.orchestration.pipeline_config import PipelineConfig
from pacs.captioner.orchestration.stage_fingerprints import trainer_settings
from pacs.eval.caption_drift import caption_stats, distinct_n
from pacs.metric.common.config import from_dict, load_config
from pacs.metric.common.errors import InputError, NonFiniteError

torch.set_num_threads(1)
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "configs" / "coco_vitb32_pac-spp.yaml"
GAMED = ["a a dog dog dog area area area", "a a red red red area area area", "a a circle circle area area area"]
XE_LIKE = ["a red circle", "the square is blue", "a green triangle on white"]


def _log_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _scst(tmp_path: Path, out: str, steps: int, reward=overlap_reward, validation=None, on_step=None, **overrides):
    cache, train, val = tiny_data(tmp_path)
    init = tmp_path / "init"
    if not init.is_dir():
        tiny_checkpoint(tmp_path, dropout=0.1)
    config = SCSTConfig(output_dir=str(tmp_path / out), reward="overlap", lr=1e-3, batch_size=8, micro_batch_size=8,
                        epochs=3, max_steps=steps, k=3, save_every=100, trackers=[], samples="multinomial")
    for key, value in overrides.items():
        setattr(config, key, value)
    items = list({image_id: [caption] for image_id, caption in train}.items())
    return train_scst(config, init, cache, items, reward, on_step=on_step,
                      validation=val if validation is None else validation)


# -- KL to the reference policy ----------------------------------------------------------------------------------

def test_token_log_ratio_matches_a_hand_computation_on_a_tiny_vocabulary():
    # vocabulary: 0 <pad>, 1 <bos>, 2 <eos>, 3 "dog", 4 "runs"; the caption "dog runs <eos> <pad>"
    tokens = torch.tensor([[3, 4, EOS_ID, PAD_ID]])
    policy = torch.tensor([[[0.0, 0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 1.0, 0.0, 3.0],
                            [0.0, 0.0, 2.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0, 0.0]]])
    reference = torch.tensor([[[0.0, 0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0],
                               [0.0, 0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0, 9.0]]])

    def log_p(row: list[float], index: int) -> float:
        return row[index] - math.log(sum(math.exp(v) for v in row))

    expected = [log_p(policy[0, t].tolist(), i) - log_p(reference[0, t].tolist(), i)
                for t, i in enumerate([3, 4, EOS_ID])] + [0.0]  # nothing after the first <eos>
    got = token_log_ratio(policy, reference, tokens)
    torch.testing.assert_close(got, torch.tensor([expected]), rtol=0, atol=1e-6)
    assert got[0, 2] != 0  # the <eos> token is part of the KL


def test_kl_is_exactly_zero_when_the_policy_equals_the_reference(tmp_path):
    init = tiny_checkpoint(tmp_path, dropout=0.1)
    cache, train, _ = tiny_data(tmp_path)
    policy, vocab, _ = load_captioner(init)
    reference = ReferencePolicy(init, vocab)
    feats = cache.get([image_id for image_id, _ in train[:12:3]])
    tokens = sample(policy, feats, k=3, generator=torch.Generator().manual_seed(0)).tokens.flatten(0, 1)
    policy.train()  # the KL is taken in eval mode (no dropout) whatever the policy's mode, which is kept
    kl = reference.sequence_kl(policy, feats, tokens, repeats=3)
    assert policy.training and kl.shape == (12,) and torch.equal(kl, torch.zeros(12))
    assert all(not p.requires_grad for p in reference.model.parameters()) and not reference.model.training
    # and it is the sum of the per-token log-ratios otherwise (a perturbed policy)
    with torch.no_grad():
        policy.head.weight.add_(0.05 * torch.randn_like(policy.head.weight))
    policy.eval()
    with torch.no_grad():
        by_hand = token_log_ratio(policy(feats, shift_right(tokens), repeats=3),
                                  reference.model(feats, shift_right(tokens), repeats=3), tokens).sum(1)
    kl = reference.sequence_kl(policy, feats, tokens, repeats=3)
    assert (kl != 0).any()
    torch.testing.assert_close(kl, by_hand, rtol=0, atol=0)


def test_kl_guard_shapes_the_reward_before_the_baseline_and_logs_the_mean_kl(tmp_path):
    plain = _scst(tmp_path, "plain", 3)
    guarded = _scst(tmp_path, "kl", 3, kl_coef=5.0)
    # step 1 samples from the init model, which is the reference: KL 0 and the very same update
    assert guarded.losses[0] == plain.losses[0]
    assert guarded.losses[1] != plain.losses[1]
    rows = _log_rows(tmp_path / "kl" / "log.csv")
    assert float(rows[0]["kl"]) == 0.0 and all(float(row["kl"]) != 0.0 for row in rows[1:])
    assert all(row["kl"] == "" for row in _log_rows(tmp_path / "plain" / "log.csv"))  # off: not computed


def test_kl_reference_with_another_vocabulary_is_refused(tmp_path):
    from pacs.captioner.modeling.checkpoints import save_captioner
    from pacs.captioner.modeling.vocab import build_vocab

    init = tiny_checkpoint(tmp_path)
    model, vocab, _ = load_captioner(init)
    other = save_captioner(tmp_path / "other", model, build_vocab("word", ["a b c d e f"], min_count=1, max_length=8),
                           {"backbone": "test"})
    with pytest.raises(InputError, match="kl_reference=.*its vocabulary differs"):
        ReferencePolicy(other, vocab)


# -- the end token in the policy gradient ------------------------------------------------------------------------

def test_the_end_token_log_probability_gets_a_gradient():
    tokens = torch.tensor([[3, EOS_ID, PAD_ID]])
    logits = torch.tensor([[[0.0, 0.0, 0.5, 1.0, 0.2], [0.0, 0.0, 0.3, 0.7, 0.1], [0.0, 0.0, 0.0, 0.0, 0.0]]],
                          requires_grad=True)
    advantage = torch.tensor([[0.7]])
    scst_loss(logits, tokens, advantage).backward()
    p_eos = torch.softmax(logits.detach()[0, 1], -1)[EOS_ID]
    # d/dz_eos of −A·log softmax(z)_eos = −A·(1 − p_eos)
    assert logits.grad[0, 1, EOS_ID] == pytest.approx(float(-0.7 * (1 - p_eos)), abs=1e-7)
    assert torch.equal(logits.grad[0, 2], torch.zeros(5))  # nothing after the first <eos>


def test_the_end_token_of_sampled_captions_gets_a_gradient_through_the_captioner(tmp_path):
    init = tiny_checkpoint(tmp_path, dropout=0.0)
    cache, train, _ = tiny_data(tmp_path)
    model, _, _ = load_captioner(init)
    feats = cache.get([image_id for image_id, _ in train[:6:3]])
    tokens = sample(model, feats, k=2, generator=torch.Generator().manual_seed(1)).tokens.flatten(0, 1)
    ends = [(row, int((tokens[row] == EOS_ID).nonzero()[0])) for row in range(len(tokens))
            if (tokens[row] == EOS_ID).any()]
    assert ends  # sampled captions that end with <eos>
    logits = model(feats, shift_right(tokens), repeats=2)
    logits.retain_grad()
    scst_loss(logits, tokens, torch.tensor([[1.0, -0.5], [0.3, -0.8]])).backward()
    for row, position in ends:
        assert logits.grad[row, position, EOS_ID] != 0
        assert torch.equal(logits.grad[row, position + 1:], torch.zeros_like(logits.grad[row, position + 1:]))


# -- the hacking monitor -----------------------------------------------------------------------------------------

def test_caption_stats_by_hand():
    stats = caption_stats(["a a dog dog", "a red circle"])
    # words 4 and 3; Rep-1: (1 + 1) + 0 over 2 captions; Rep-2: 0; distinct-1: {a, dog, red, circle} / 7
    assert stats["length"] == 3.5 and stats["rep1"] == 1.0 and stats["rep2"] == 0.0
    assert stats["distinct1"] == pytest.approx(4 / 7)
    assert stats["distinct2"] == pytest.approx(5 / 5)  # (a a) (a dog) (dog dog) (a red) (red circle)
    assert stats["incorrect"] == 0.0
    assert math.isnan(distinct_n(["a"], 2))


def _row(step: int, reward: float, captions: list[str], cider: float = 50.0) -> dict[str, float]:
    return {"step": float(step), "reward": reward, "cider": cider, **caption_stats(captions)}


def test_the_warning_names_repetition_and_length_gaming_when_the_reward_rises():
    start = _row(0, 0.30, XE_LIKE)
    message = gaming_warning(40, start, _row(40, 0.45, GAMED, cider=20.0), GamingThresholds())
    assert message is not None
    assert message.startswith("scst step 40: validation reward +0.15 (0.3 -> 0.45) while rep2 +")
    for signature in ("repetition gaming", "length gaming", "diversity collapse", "reward/CIDEr-D divergence"):
        assert signature in message


def test_no_warning_on_xe_like_captions_or_without_a_rising_reward():
    start = _row(0, 0.30, XE_LIKE)
    later = _row(40, 0.35, ["a red circle", "the blue square", "a green triangle on a white table"])
    assert gaming_warning(40, start, later, GamingThresholds()) is None  # the reward rose, nothing drifted
    assert gaming_warning(40, start, _row(40, 0.29, GAMED), GamingThresholds()) is None  # drift, no reward gain
    assert gaming_warning(40, start, _row(40, 0.31, GAMED), GamingThresholds(reward_rise=0.05)) is None


class _Process:
    """The accelerator fields the monitor reads, for one process."""

    is_main_process, num_processes, process_index, device = True, 1, 0, "cpu"


def _scripted_monitor(tmp_path, monkeypatch, captions_by_step, rewards_by_step):
    """A HackingMonitor whose captions and reward follow a script (step -> captions, step -> reward)."""
    cache, _, val = tiny_data(tmp_path)
    ids = list(val)[:3]
    calls = {"step": 0}

    def captions(self, accelerator, model):
        return dict(zip(ids, captions_by_step[calls["step"]]))

    def reward(image_ids, captions, references):
        return torch.full((len(image_ids), 1), rewards_by_step[calls["step"]])

    monkeypatch.setattr(HackingMonitor, "captions", captions)
    monitor = HackingMonitor(tmp_path / "monitor.csv", {i: val[i] for i in ids}, cache, None, reward,
                             GamingThresholds(), max_length=8, every=10, last_step=30)

    def run(step: int) -> dict:
        calls["step"] = step
        return monitor(_Process(), None, step)

    return monitor, run


def test_the_monitor_warns_on_a_gamed_sequence_of_captions(tmp_path, monkeypatch, caplog):
    script = {0: XE_LIKE, 10: XE_LIKE, 20: ["a a dog dog dog area", "a red red red area", "a circle circle area"],
              30: GAMED}
    _, run = _scripted_monitor(tmp_path, monkeypatch, script, {0: 0.30, 10: 0.30, 20: 0.40, 30: 0.50})
    with caplog.at_level(logging.WARNING, logger="pacs.captioner.modeling.hacking_monitor"):
        for step in (0, 10, 20, 30):
            run(step)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and warnings[0].startswith("scst step 20: validation reward +0.1")
    assert "repetition gaming" in warnings[0] and "repetition gaming" in warnings[1]
    assert "length gaming" in warnings[1]
    rows = _log_rows(tmp_path / "monitor.csv")
    assert [int(r["step"]) for r in rows] == [0, 10, 20, 30]
    # Rep-2 of GAMED: 2, 2 and 1 repeated bigrams; lengths 8, 8 and 7 words
    assert float(rows[3]["rep2"]) == pytest.approx(5 / 3) and float(rows[3]["length"]) == pytest.approx(23 / 3)
    assert float(rows[3]["reward"]) == pytest.approx(0.5)


def test_the_monitor_stays_quiet_on_xe_like_captions(tmp_path, monkeypatch, caplog):
    script = {0: XE_LIKE, 10: ["a red circle", "the blue square", "a green triangle"], 20: XE_LIKE, 30: XE_LIKE}
    _, run = _scripted_monitor(tmp_path, monkeypatch, script, {0: 0.30, 10: 0.35, 20: 0.40, 30: 0.50})
    with caplog.at_level(logging.WARNING, logger="pacs.captioner.modeling.hacking_monitor"):
        for step in (0, 10, 20, 30):
            run(step)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_monitor_csv_written_during_scst(tmp_path):
    _scst(tmp_path, "run", 4, monitor_every=2, monitor_images=4)
    rows = _log_rows(tmp_path / "run" / "monitor.csv")
    assert [int(r["step"]) for r in rows] == [0, 2, 4]
    columns = ("reward", "cider", "length", "rep1", "rep2", "rep3", "rep4", "distinct1", "distinct2", "incorrect",
               "grammar_errors")
    assert set(columns) <= set(rows[0])
    assert all(math.isfinite(float(rows[0][c])) for c in columns if c != "grammar_errors")


# -- selection by a validation signal ----------------------------------------------------------------------------

def test_selection_by_validation_keeps_the_best_scored_step_and_never_a_nan(tmp_path, monkeypatch):
    scores = {0: 99.0, 2: 5.0, 4: 9.0, 6: float("nan"), 8: 7.0}  # step 0 (the XE model) is never a candidate
    original = HackingMonitor.score

    def scripted(self, step, captions):
        return dict(original(self, step, captions), cider=scores[step])

    monkeypatch.setattr(HackingMonitor, "score", scripted)
    weights = {}

    def keep(step, model):
        weights[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    result = _scst(tmp_path, "run", 8, on_step=keep, monitor_every=2, monitor_images=3, select_by="cider")
    assert result.best_step == 4 and result.best_score == 9.0 and result.selected_dir == tmp_path / "run" / "best"
    saved = load_file(str(tmp_path / "run" / "best" / "model.safetensors"))
    assert all(torch.equal(saved[k], weights[4][k]) for k in saved)
    assert not all(torch.equal(saved[k], weights[8][k]) for k in saved)
    info = json.loads((tmp_path / "run" / "best" / "captioner.json").read_text())["provenance"]
    assert info["step"] == 4 and info["select_by"] == "cider" and info["val_cider"] == 9.0


def test_selection_without_any_finite_score_is_an_error(tmp_path, monkeypatch):
    original = HackingMonitor.score
    monkeypatch.setattr(HackingMonitor, "score",
                        lambda self, step, captions: dict(original(self, step, captions), reward=float("nan")))
    with pytest.raises(NonFiniteError, match="select_by=reward: no monitored step had a finite validation reward"):
        _scst(tmp_path, "run", 2, monitor_every=1, monitor_images=2, select_by="reward")


def test_last_step_is_reported_by_default(tmp_path):
    result = _scst(tmp_path, "run", 2)
    assert result.best_dir is None and result.selected_dir == tmp_path / "run" / "final"
    assert not (tmp_path / "run" / "best").exists() and not (tmp_path / "run" / "monitor.csv").exists()


# -- configuration -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("values, message", [
    ({"kl_coef": -0.1}, "kl_coef=-0.1: expected float >= 0"),
    ({"monitor_every": -1}, "monitor_every=-1: expected int >= 0"),
    ({"monitor_images": -2}, "monitor_images=-2: expected int >= 0"),
    ({"monitor_rep_rise": -1.0}, "monitor_rep_rise=-1.0: expected float >= 0"),
    ({"select_by": "bleu"}, "select_by='bleu': unknown (known: last, cider, reward)"),
    ({"select_by": "cider"}, "select_by='cider' needs monitor_every > 0"),
    ({"kl_reference": "runs/xe/best"}, "kl_reference='runs/xe/best' has no effect with kl_coef=0"),
])
def test_guard_config_errors_name_the_key(values, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_dict(SCSTConfig, values, "scst")


def test_guard_keys_load_from_the_recipe_yaml_with_their_names_in_errors():
    config = load_config(PipelineConfig, RECIPE, ["scst.kl_coef=0.05", "scst.monitor_every=20",
                                                  "scst.select_by=cider", "reward_guards.rep_n=3"])
    assert (config.scst.kl_coef, config.scst.select_by, config.reward_guards.rep_n) == (0.05, "cider", 3)
    with pytest.raises(InputError, match=r"scst\.kl_coef=-1: expected float >= 0"):
        load_config(PipelineConfig, RECIPE, ["scst.kl_coef=-1"])
    with pytest.raises(InputError, match=r"reward_guards\.length_percentile=0: expected float > 0 and <= 100"):
        load_config(PipelineConfig, RECIPE, ["reward_guards.length_percentile=0"])
    with pytest.raises(InputError, match="reward_guards: length_limit='long': expected refs, train or a number"):
        load_config(PipelineConfig, RECIPE, ["reward_guards.length_limit=long"])


def test_guards_off_leave_the_scst_fingerprint_as_before():
    settings = guard_settings(trainer_settings(SCSTConfig()))
    assert not set(settings) & set(GUARD_FIELDS + MONITOR_THRESHOLD_FIELDS)
    on = guard_settings(trainer_settings(SCSTConfig(kl_coef=0.1, monitor_every=5, monitor_rep_rise=2.0)))
    assert on["kl_coef"] == 0.1 and on["monitor_every"] == 5 and "monitor_rep_rise" not in on


# -- the recipe pipeline -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_pipeline_evaluates_the_selected_checkpoint_and_records_it(tmp_path, shared_data, caplog):
    import yaml

    from pacs.captioner.entry import run_from_config

    recipe = tiny_pipeline_recipe(
        tmp_path / "run", shared_data / "flickr8k",
        scst={"batch_size": 4, "micro_batch_size": 4, "max_steps": 3, "epochs": 2, "k": 2, "lr": 1e-3,
              "save_every": 10, "trackers": [], "kl_coef": 0.1, "monitor_every": 1, "select_by": "cider"},
        rewards=["cider:1,rep-penalty:0.5,length-penalty:0.25"],
        reward_guards={"rep_n": 1, "length_limit": "train", "length_percentile": 90})
    recipe["data"]["max_val_images"] = 3
    recipe["xe"]["save_every"] = 10
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    run_from_config(str(path), [])
    run = tmp_path / "run"
    folder = run / "scst-cider_1_rep-penalty_0.5_length-penalty_0.25"
    record = json.loads((run / "stages" / f"{folder.name}.json").read_text())
    summary = record["summary"]
    monitor = _log_rows(folder / "monitor.csv")
    assert [int(r["step"]) for r in monitor] == [0, 1, 2, 3]
    scores = {int(r["step"]): float(r["cider"]) for r in monitor}
    best = max((1, 2, 3), key=lambda step: scores[step])  # step 0 (the XE model) is no candidate
    assert summary["select_by"] == "cider" and summary["best_step"] == best
    assert summary["best_score"] == pytest.approx(scores[best], rel=1e-6)
    assert record["settings"]["reward_guards"] == {"rep_n": 1, "length_limit": "train", "length_percentile": 90.0}
    assert record["settings"]["scst"]["kl_coef"] == 0.1 and "monitor_rep_rise" not in record["settings"]["scst"]
    info = json.loads((folder / "best" / "captioner.json").read_text())["provenance"]
    assert info["step"] == best
    # the evaluated model is best/: its test captions are what best/ writes
    from pacs.captioner.modeling.features import FeatureCache
    from pacs.captioner.modeling.train_xe import generate_captions

    evaluated = json.loads((run / "eval" / folder.name.replace("scst-", "") / "flickr8k.results.json").read_text())
    model, vocab, _ = load_captioner(folder / "best")
    ids = [str(entry["image_id"]) for entry in evaluated]
    expected = generate_captions(model, vocab, FeatureCache(run / "features" / "flickr8k"), ids, beam_size=1)
    assert [entry["caption"] for entry in evaluated] == [expected[i] for i in ids]
    # a changed warning threshold re-runs nothing
    with caplog.at_level(logging.INFO, logger="pacs.captioner.orchestration.stages"):
        run_from_config(str(path), ["scst.monitor_rep_rise=3.0"])
    assert f"stage {folder.name}: unchanged, skipped" in caplog.messages


@pytest.mark.slow
def test_two_processes_match_one_with_every_guard_on(tmp_path):
    """KL guard + monitor + selection: 1 process × micro 8 vs 2 gloo processes × micro 4, same global batches."""
    import os
    import subprocess
    import sys

    here = Path(__file__).resolve().parent
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(here), env.get("PYTHONPATH", "")])

    def drive(out: str, micro: str, launcher: list[str]) -> dict[str, list[float]]:
        done = subprocess.run([*launcher, str(here / "guards_driver.py"), str(tmp_path / out), micro],
                              capture_output=True, text=True, env=dict(env, ACCELERATE_USE_CPU="1") if len(launcher) > 1
                              else env, timeout=400, check=False)
        assert done.returncode == 0, done.stderr[-4000:]
        return {line.split(" ", 2)[1]: [float(x) for x in json.loads(line.split(" ", 2)[2])]
                for line in done.stdout.splitlines() if line.startswith("RESULT ")}

    one = drive("one", "8", [sys.executable])
    two = drive("two", "4", [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
                             "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                             "--main_process_port", "0"])
    assert one["world"] == [1.0] and two["world"] == [2.0]
    assert one["kl"][0] == two["kl"][0] == 0.0 and any(v != 0 for v in one["kl"][1:])
    for name in ("losses", "kl", "cider"):
        assert len(one[name]) == len(two[name])
        for a, b in zip(one[name], two[name]):
            assert abs(a - b) <= 1e-5 * max(abs(a), 1e-6), (name, one[name], two[name])
    assert one["best_step"] == two["best_step"] and one["best_step"][0] in (2.0, 4.0)


def test_a_resumed_run_monitors_and_selects_as_an_uninterrupted_one(tmp_path):
    guards = {"kl_coef": 0.5, "monitor_every": 2, "monitor_images": 4, "select_by": "reward", "save_every": 2}
    full = _scst(tmp_path, "full", 6, **guards)
    _scst(tmp_path, "resumed", 4, **guards)  # stops after step 4 (checkpointed), then goes on to step 6
    resumed = _scst(tmp_path, "resumed", 6, **guards)
    assert resumed.losses == full.losses[4:]  # bit-identical after the resume
    assert _log_rows(tmp_path / "resumed" / "monitor.csv") == _log_rows(tmp_path / "full" / "monitor.csv")
    assert (resumed.best_step, resumed.best_score) == (full.best_step, full.best_score)
    best = load_file(str(tmp_path / "resumed" / "best" / "model.safetensors"))
    assert all(torch.equal(t, load_file(str(tmp_path / "full" / "best" / "model.safetensors"))[k])
               for k, t in best.items())


def test_grammar_errors_are_nan_with_one_note_without_a_backend(monkeypatch, caplog):
    import pacs.eval.grammar
    from pacs.captioner.modeling.hacking_monitor import GrammarRate
    from pacs.metric.common.errors import MissingResourceError

    def missing(*args, **kwargs):
        raise MissingResourceError("the offline grammar backend needs Harper: pip install harper-py")

    monkeypatch.setattr(pacs.eval.grammar, "build_grammar_checker", missing)
    rate = GrammarRate()
    with caplog.at_level(logging.WARNING, logger="pacs.captioner.modeling.hacking_monitor"):
        assert math.isnan(rate(XE_LIKE)) and math.isnan(rate(GAMED))
    assert [r.getMessage() for r in caplog.records] == [
        "scst monitor: grammar_errors not measured (NaN): the offline grammar backend needs Harper: pip install harper-py"]


def test_grammar_errors_with_the_harper_backend():
    pytest.importorskip("harper")
    from pacs.captioner.modeling.hacking_monitor import GrammarRate

    # Harper flags the repeated words of the gamed captions ("a a", "dog dog"), not the plain ones
    assert GrammarRate()(XE_LIKE + GAMED) == pytest.approx(50.0)
