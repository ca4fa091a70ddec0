"""recipes/grpo_vlm_example.py: TRL GRPO on a tiny random LLaVA with the pacs reward, run as a script."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "grpo_vlm_example.py"

pytest.importorskip("trl")


def _load_recipe():
    """Import the recipe script as a module (recipes/ holds scripts, not a package)."""
    if "grpo_vlm_example" not in sys.modules:
        spec = importlib.util.spec_from_file_location("grpo_vlm_example", RECIPE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["grpo_vlm_example"]


def test_grpo_run_logs_the_pacs_reward_of_its_completions(shared_data, tmp_path):
    out = tmp_path / "run.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    command = [sys.executable, str(RECIPE), "--data", str(shared_data / "flickr8k"), "--steps", "3", "--out", str(out)]
    proc = subprocess.run(command, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [step["step"] for step in result["steps"]] == [1, 2, 3]
    assert proc.stdout.splitlines()[0].startswith("step 1: mean pacs reward (pac-s++) ")
    calls = result["reward_calls"]
    assert len(calls) == 3 and all(len(call["completions"]) == 8 for call in calls)  # one generation batch a step
    # recompute every reward from the logged completions and image files with an independent Scorer
    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    from pacs.metric.scoring.registry import default_w
    from pacs.metric.scoring.scorer import Scorer

    backbone = build_backbone_from_config(tiny_clip_config(), seed=0)
    scorer = Scorer(backbone, w=default_w("pac-s++", backbone), progress=False)
    for step, call in zip(result["steps"], calls):
        texts = [completion[-1]["content"] for completion in call["completions"]]  # conversational completions
        expected = scorer.score(call["image_paths"], texts).scores
        np.testing.assert_allclose(call["rewards"], expected, rtol=0, atol=1e-5)
        assert step["reward"] == pytest.approx(float(np.mean(expected)), abs=1e-5)  # what the trainer logged
        assert len(set(call["image_paths"])) == 2  # 8 completions = 2 images x 4 generations
    distinct = {path for call in calls for path in call["image_paths"]}
    assert result["images_encoded"] == len(distinct) < 6  # 3 steps x 2 images, each image encoded once
    assert any(step["grad_norm"] > 0 for step in result["steps"])


def test_the_tiny_llava_sees_the_image(shared_data):
    recipe = _load_recipe()
    tokenizer = recipe.build_tokenizer(["a dog runs", "a cat sleeps"])
    processor = recipe.build_processor(tokenizer, image_size=32, patch_size=8)
    model = recipe.build_vlm(tokenizer, image_size=32, patch_size=8, seed=0).eval()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": recipe.PROMPT}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert text == "USER: <image> Describe the image. ASSISTANT:"
    from PIL import Image

    red, blue = Image.new("RGB", (40, 40), (255, 0, 0)), Image.new("RGB", (40, 40), (0, 0, 255))
    inputs = processor(images=[red, blue], text=[text, text], return_tensors="pt")
    image_id = tokenizer.convert_tokens_to_ids(recipe.IMAGE_TOKEN)
    assert (inputs["input_ids"] == image_id).sum(dim=1).tolist() == [17, 17]  # 4x4 patches + the class token
    with torch.no_grad():
        logits = model(**inputs).logits[:, -1]
    assert not torch.allclose(logits[0], logits[1])  # the image changes the next-token distribution
    assert tokenizer.decode(tokenizer("A dog runs.")["input_ids"], skip_special_tokens=True) == "a dog runs."


@pytest.mark.slow
def test_normalised_components_and_the_monitor_through_the_recipe(shared_data, tmp_path):
    recipe = _load_recipe()
    config = recipe.GRPOExampleConfig(reward="pac-s++:1,rep-penalty:0.5", steps=1, images=2, batch_size=4,
                                      num_generations=2, aggregation="normalize_then_sum", monitor_every=1)
    result = recipe.run(config, shared_data / "flickr8k", tmp_path)
    assert result["weights"] == [1.0, 0.5] and list(result["component_calls"]) == ["pac-s++", "rep-penalty"]
    (pacs_call,), (rep_call,) = result["component_calls"].values()
    texts = [completion[-1]["content"] for completion in rep_call["completions"]]
    from pacs.eval.fluency import repetitions, words

    assert rep_call["rewards"] == [-float(repetitions(text, 2)) for text in texts]
    # TRL's logged reward is the weighted sum of the components' means; the monitor saw the same weighted sum
    total = [a + 0.5 * b for a, b in zip(pacs_call["rewards"], rep_call["rewards"])]
    (step,) = result["steps"]
    assert step["reward"] == pytest.approx(sum(total) / len(total), abs=1e-5)
    (row,) = result["monitor"]["rows"]
    assert row["reward"] == pytest.approx(sum(total) / len(total), abs=1e-6)
    assert row["length"] == pytest.approx(sum(len(words(text)) for text in texts) / len(texts))  # punctuation dropped
