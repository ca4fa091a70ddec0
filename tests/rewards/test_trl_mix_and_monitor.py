"""The GRPO path for a causal VLM with pacs components (issue 34 item 5): `pacs.rewards.trl.reward_functions` with
TRL's `multi_objective_aggregation="normalize_then_sum"`, the guards as components, and the completion monitor."""
from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from pacs.eval.caption_drift import distinct_n
from pacs.eval.fluency import repetitions, words
from pacs.metric.common.errors import InputError
from pacs.metric.scoring.registry import default_w
from pacs.metric.scoring.scorer import Scorer
from pacs.rewards.monitor import CompletionMonitor, completion_signals
from pacs.rewards.trl import reward_function, reward_functions

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "grpo_vlm_example.py"
SPEC = "clip-s:1,rep-penalty:0.5,length-penalty:0.25"
RED, BLUE = Image.new("RGB", (40, 40), (220, 20, 20)), Image.new("RGB", (40, 40), (20, 20, 220))
REFS = [["a red square", "a red box"], ["a blue square on white", "a blue box"]]


def _kwargs(completions: list[str]) -> dict:
    """GRPOTrainer's keyword arguments for 2 prompts x 2 generations (each prompt's columns repeated)."""
    return {"prompts": ["Describe."] * 4, "completions": completions, "completion_ids": [[1]] * 4,
            "image": [RED, RED, BLUE, BLUE], "references": [REFS[0], REFS[0], REFS[1], REFS[1]],
            "trainer_state": None, "log_extra": lambda column, values: None}


def test_reward_functions_are_the_components_of_the_mix_called_like_trl(tiny_backbone):
    completions = ["a red red red square", "a red square", "a blue box", "a blue square on a white table top now"]
    functions, weights = reward_functions(SPEC, backbone=tiny_backbone)
    assert [f.__name__ for f in functions] == ["clip-s", "rep-penalty", "length-penalty"]
    assert weights == [1.0, 0.5, 0.25]
    values = [f(**_kwargs(completions)) for f in functions]
    scorer = Scorer(tiny_backbone, w=default_w("clip-s", tiny_backbone), progress=False)
    clip = scorer.score([RED, RED, BLUE, BLUE], completions).scores
    assert values[0] == pytest.approx(list(clip), abs=1e-5)
    assert values[1] == [-float(repetitions(c, 2)) for c in completions] == [-1.0, 0.0, 0.0, 0.0]  # "red red" x2
    longest = [max(len(words(r)) for r in refs) for refs in (REFS[0], REFS[0], REFS[1], REFS[1])]
    assert values[2] == [-max(0.0, len(words(c)) - n) for c, n in zip(completions, longest)] == [-2, 0, 0, -4]
    # the one-function mix returns their weighted sum (what TRL's default sum_then_normalize sums itself)
    mixed = reward_function(SPEC, backbone=tiny_backbone)(**_kwargs(completions))
    assert mixed == pytest.approx([a + 0.5 * b + 0.25 * c for a, b, c in zip(*values)], abs=1e-6)


def test_mix_normalisation_in_reward_function_points_to_trl_s_option(tiny_backbone):
    with pytest.raises(InputError, match="use reward_functions.*multi_objective_aggregation='normalize_then_sum'"):
        reward_function(SPEC, backbone=tiny_backbone, mix_normalisation="normalize_then_sum")


def test_the_monitor_signals_by_hand():
    captions = ["a dog dog dog runs", "a red square on the", "two cats", ""]
    ours = completion_signals(captions)  # pacs.eval.caption_drift.caption_stats, the SCST monitor's columns too
    # by hand: words per caption; distinct-n over the batch's n-grams
    assert ours["length"] == (5 + 5 + 2 + 0) / 4
    # 12 words, 9 distinct (a dog runs red square on the two cats); Rep-1: "dog" x3 is 2 repeats over 4 captions
    assert ours["distinct1"] == 9 / 12 and ours["rep1"] == 2 / 4
    bigrams = [("a", "dog"), ("dog", "dog"), ("dog", "dog"), ("dog", "runs"), ("a", "red"), ("red", "square"),
               ("square", "on"), ("on", "the"), ("two", "cats")]
    assert distinct_n(captions, 2) == len(set(bigrams)) / len(bigrams) == 8 / 9
    assert ours["rep2"] == 1 / 4 and ours["incorrect"] == 25.0  # "dog dog" repeated once; "... on the" ends badly


def test_the_monitor_warns_when_the_reward_rises_while_the_completions_degenerate(caplog):
    monitor = CompletionMonitor(every=2)
    plain, gamed = ["a red square", "a blue box on white"], ["a red red red red square square", "a box box box box"]
    with caplog.at_level(logging.WARNING, logger="pacs.rewards.monitor"):
        for rewards in ([0.5, 0.4], [0.5, 0.5]):
            monitor.observe(plain, rewards)
        assert not monitor.warnings  # two windows needed
        monitor.observe(plain, [0.5, 0.45])
        monitor.observe(plain, [0.4, None])  # same captions, no rise: quiet
        assert not monitor.warnings
        monitor.observe(gamed, [0.9, 0.8])
        monitor.observe(gamed, [0.9, 0.9])
    (text,) = monitor.warnings
    assert "calls 5-6: mean reward +0.4" in text and "repetition gaming" in text and "diversity collapse" in text
    assert text in caplog.text
    assert monitor.rows[3]["reward"] == 0.4 and len(monitor.rows) == 6  # None left out of the mean
    quiet = CompletionMonitor(every=1)
    quiet.observe(plain, [0.9, 0.9])
    quiet.observe(gamed, [0.1, 0.1])  # degenerate but the reward fell: not gaming
    assert quiet.warnings == []


def _recipe():
    """recipes/grpo_vlm_example.py as a module (its tiny LLaVA, tokenizer and processor builders)."""
    if "grpo_vlm_example" not in sys.modules:
        spec = importlib.util.spec_from_file_location("grpo_vlm_example", RECIPE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["grpo_vlm_example"]


class Recording:
    """Passes TRL's call on and keeps the completions and values (the wrapped function keeps its name)."""

    def __init__(self, function) -> None:
        self.function, self.__name__, self.calls = function, function.__name__, []

    def __call__(self, **kwargs):
        """The wrapped function's values; the call is recorded."""
        values = self.function(**kwargs)
        self.calls.append({"completions": [c[-1]["content"] for c in kwargs["completions"]], "values": values,
                           "references": kwargs["references"]})
        return values


def test_one_grpo_step_of_a_tiny_llava_with_normalised_pacs_components_and_the_monitor(tiny_backbone, tmp_path):
    pytest.importorskip("trl")
    import datasets
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    recipe = _recipe()
    dataset = datasets.Dataset.from_dict({
        "prompt": [[{"role": "user", "content": recipe.PROMPT}]] * 2, "image": [RED, BLUE],
        "references": REFS}).cast_column("image", datasets.Image())
    tokenizer = recipe.build_tokenizer([c for refs in REFS for c in refs] + ["dog runs", "on the grass"])
    processor = recipe.build_processor(tokenizer, image_size=32, patch_size=8)
    model = recipe.build_vlm(tokenizer, image_size=32, patch_size=8, seed=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    monitor = CompletionMonitor(every=1)
    functions, weights = reward_functions(SPEC, monitor=monitor, backbone=tiny_backbone)
    recorded = [Recording(f) for f in functions]
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), max_steps=1, per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=8, learning_rate=1e-2, beta=0.0, logging_steps=1,
                      save_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=0,
                      dataloader_num_workers=0, disable_tqdm=True, activation_checkpointing=False,
                      reward_weights=weights, multi_objective_aggregation="normalize_then_sum")
    trainer = GRPOTrainer(model=model, reward_funcs=recorded, args=args, train_dataset=dataset,
                          processing_class=processor)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    (logged,) = [entry for entry in trainer.state.log_history if "rewards/clip-s/mean" in entry]
    # TRL logged each pacs component's mean over the 4 completions it scored
    for function in recorded:
        (call,) = function.calls
        assert logged[f"rewards/{function.__name__}/mean"] == pytest.approx(
            sum(call["values"]) / len(call["values"]), abs=1e-6)
    completions = recorded[0].calls[0]["completions"]
    assert [-float(repetitions(c, 2)) for c in completions] == recorded[1].calls[0]["values"]
    # the monitor saw the weighted sum of the components and the completions' signals, and TRL logged them
    (row,) = monitor.rows
    total = [sum(w * f.calls[0]["values"][i] for f, w in zip(recorded, weights)) for i in range(4)]
    assert row["reward"] == pytest.approx(sum(total) / 4, abs=1e-6)
    assert row["length"] == sum(len(words(c)) for c in completions) / 4
    assert logged["monitor/length"] == pytest.approx(row["length"]) and "monitor/distinct2" in logged
    # the step moved the policy (the normalised advantages are not all 0 when some component varies)
    if any(len(set(f.calls[0]["values"][i:i + 2])) > 1 for f in recorded for i in (0, 2)):
        assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())
