"""recipes/dropin_reward_example.py: SCST on a tiny Hugging Face VisionEncoderDecoderModel with build_reward."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "dropin_reward_example.py"


def _load_recipe():
    """Import the recipe script as a module (recipes/ holds scripts, not a package)."""
    if "dropin_reward_example" not in sys.modules:
        spec = importlib.util.spec_from_file_location("dropin_reward_example", RECIPE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["dropin_reward_example"]


def test_scst_steps_on_a_vision_encoder_decoder(shared_data):
    recipe = _load_recipe()
    torch.set_num_threads(1)
    config = recipe.DropInConfig(reward="cider:1,clip-s:1", steps=2, batch_size=3, k=4, images=6, lr=1e-2)
    dataset = recipe.load_dataset("flickr8k", shared_data / "flickr8k").split("train")
    dataset.items = dataset.items[:config.images]
    tokenizer = recipe.build_tokenizer([c for item in dataset for c in item.captions])
    assert tokenizer.tokenize("A DOG, a dog.") == ["a", "dog", ",", "a", "dog", "."]
    assert tokenizer.decode(tokenizer("A DOG, a dog.")["input_ids"]) == "a dog, a dog."
    model = recipe.build_captioner(tokenizer, config.image_size, seed=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    reward = recipe.build_reward(config.reward, **recipe.reward_context(config, dataset))
    processor = recipe.build_image_processor(config.image_size)
    from PIL import Image

    batch = dataset.items[:3]
    pixels = processor(images=[Image.open(i.image_path).convert("RGB") for i in batch], return_tensors="pt").pixel_values
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    ids, refs = [i.image_id for i in batch], [i.captions for i in batch]
    losses = []
    for _ in range(config.steps):
        result = recipe.scst_step(model, optimizer, tokenizer, reward, pixels, ids, refs, config.k, config.max_length)
        assert result["rewards"].shape == (3, 4) and result["rewards"].dtype == torch.float32
        assert torch.isfinite(result["rewards"]).all()
        assert all(len(row) == 4 and all(isinstance(c, str) for c in row) for row in result["captions"])
        losses.append(result["loss"])
    assert all(torch.isfinite(torch.tensor(losses)))
    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert any(name.startswith("decoder.") for name in changed) and any(n.startswith("encoder.") for n in changed)
    # the mixed reward is the sum of its two terms, each [B, k]
    terms = reward.last_components
    assert set(terms) == {"cider", "clip-s"} and all(t.shape == (3, 4) for t in terms.values())
    assert torch.allclose(result["rewards"], terms["cider"] + terms["clip-s"])


def test_sequence_log_probs_stop_at_first_eos(shared_data):
    recipe = _load_recipe()
    tokenizer = recipe.build_tokenizer(["a dog runs", "a cat sleeps"])
    model = recipe.build_captioner(tokenizer, 32, seed=0).eval()
    pixels = torch.zeros(1, 3, 32, 32)
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    dog = tokenizer.convert_tokens_to_ids(["a", "dog"])
    short = torch.tensor([[bos, *dog, eos, pad, pad]])
    tail = torch.tensor([[bos, *dog, eos, dog[0], dog[1]]])
    with torch.no_grad():
        a = recipe.sequence_log_probs(model, pixels, short, eos)
        b = recipe.sequence_log_probs(model, pixels, tail, eos)
        logits = model(pixel_values=pixels, decoder_input_ids=short[:, :3]).logits.log_softmax(-1)[0]
    expected = logits[0, dog[0]] + logits[1, dog[1]] + logits[2, eos]
    assert torch.allclose(a, b) and torch.allclose(a[0], expected, atol=1e-5)


def test_main_runs_from_the_command_line(shared_data, capsys):
    recipe = _load_recipe()
    code = recipe.main(["--data", str(shared_data / "flickr8k"), "--steps", "1", "--batch-size", "2", "--k", "2",
                        "--images", "4", "--reward", "cider"])
    assert code == 0
    assert capsys.readouterr().out.startswith("step 0: loss ")
    assert recipe.main(["--data", str(shared_data / "flickr8k"), "--steps", "1", "--reward", "bleu"]) == 2
