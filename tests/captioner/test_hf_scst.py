"""SCST on transformers captioners (issue 34 items 1-2): tiny random BLIP and GIT folders built offline.

The policy-gradient loss is recomputed here by hand, caption by caption, from the model's raw logits (its own
forward, `log_softmax` of one position at a time, summed up to and including the end token); the KL guard is
exactly 0 at the first step (policy = reference); one step changes the weights; the trained folder loads in
plain transformers and in `pacs caption`; LoRA adapters saved beside the merged folder give the same captions.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
import transformers

from pacs.captioner.modeling.hf_captioning import HFCaptionOptions, generate_captions, load_hf_captioner
from pacs.captioner.modeling.hf_policy import ADAPTER_DIR, HFPolicy, HFTrainOptions
from pacs.captioner.modeling.train_scst import SCSTConfig, policy_gradient_loss, train_scst
from tests.captioner.hf_tiny import LLAVA_PROMPT, build_blip, build_git, build_llava, coloured_images

BUILDERS = {"blip": build_blip, "git": build_git}
# BLIP with a prompt (echo rule), GIT without (start token), LLaVA with its chat template (image tokens in the ids)
PROMPTS = {"blip": "a picture of", "git": None, "llava": LLAVA_PROMPT}


def word_reward(image_ids, captions, references):
    """Words of the caption found in the image's first reference, minus 0.1 per word (deterministic)."""
    return torch.tensor([[len(set(c.split()) & set(refs[0].split())) - 0.1 * len(c.split()) for c in row]
                         for row, refs in zip(captions, references)], dtype=torch.float32)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Images and the two tiny folders."""
    root = tmp_path_factory.mktemp("hf-scst")
    paths, refs = coloured_images(root / "images", 6)
    return {"paths": paths, "refs": refs, "blip": build_blip(root / "blip"), "git": build_git(root / "git"),
            "llava": build_llava(root / "llava")}


def _config(out: Path, **overrides) -> SCSTConfig:
    values = {"output_dir": str(out), "reward": "test", "lr": 1e-3, "batch_size": 2, "micro_batch_size": 2,
              "samples": "multinomial", "k": 3, "max_length": 6, "max_steps": 1, "save_every": 0,
              "trackers": [], "seed": 3}
    return SCSTConfig(**(values | overrides))


def _hand_log_prob(model, image_inputs: dict, prefix: list[int], caption: list[int], end: int) -> float:
    """Σ_t log softmax(logits of the position before y_t)[y_t], t up to and including the first end token."""
    sequence = torch.tensor([prefix + caption])
    with torch.no_grad():
        logits = model(**image_inputs, input_ids=sequence, attention_mask=torch.ones_like(sequence)).logits[0]
    logits = logits[-sequence.shape[1]:]  # GIT prepends its image tokens to the output
    total = 0.0
    for t, token in enumerate(caption):
        row = logits[len(prefix) - 1 + t].double()
        total += float(row[token] - torch.logsumexp(row, 0))
        if token == end:
            break
    return total


@pytest.mark.parametrize("kind", ["blip", "git", "llava"])
def test_policy_gradient_loss_equals_hand_computation(world, kind):
    """Loss of sampled captions = −mean(A·Σ_t log p(y_t)) computed caption by caption from the raw logits."""
    options = HFTrainOptions(prompt=PROMPTS[kind])
    policy = HFPolicy.load(world[kind], world["paths"], options, max_length=6)
    ids = ["img0", "img1"]
    batch = policy.batch(ids, "cpu")
    # captions over five words (ids 6..10) and the end token 3: ended early (padded with 3 after it) or not at all
    tokens = torch.tensor([[[6, 7, 3, 3, 3], [8, 3, 3, 3, 3], [9, 10, 6, 7, 8]],
                           [[10, 10, 3, 3, 3], [7, 8, 9, 3, 3], [6, 3, 3, 3, 3]]])
    advantages = torch.tensor([[0.5, -1.0, 0.25], [2.0, -0.75, 1.5]])
    flat = tokens.reshape(6, -1)
    loss = policy_gradient_loss(policy.token_log_probs(policy.module, policy.module, batch, flat, 3), advantages)
    # by hand: the processor's inputs of one image, the prefix generate starts from, one caption at a time
    processor = transformers.AutoProcessor.from_pretrained(world[kind])
    model = transformers.AutoModelForImageTextToText.from_pretrained(world[kind]).eval()
    end = 3  # [SEP]: BLIP's sep_token_id, GIT's eos_token_id; </s>: LLaVA's eos_token_id
    if kind == "blip":
        prefix = [5] + processor.tokenizer(PROMPTS[kind], add_special_tokens=False)["input_ids"]  # [DEC] prompt
    elif kind == "git":
        prefix = [2]  # GIT without a prompt starts from bos ([CLS])
    else:  # LLaVA: the chat turn with the image, as its documentation builds it (image tokens expanded)
        turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPTS[kind]}]}]
        text = processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    from pacs.captioner.modeling.hf_captioning import read_rgb

    expected = 0.0
    for b, image_id in enumerate(ids):
        if kind == "llava":
            inputs = processor(images=[read_rgb(world["paths"][image_id])], text=[text], return_tensors="pt")
            pixels, prefix = inputs["pixel_values"], inputs["input_ids"][0].tolist()
            assert prefix.count(4) > 1  # the <image> token expanded to one per patch (+ CLS)
        else:
            pixels = processor(images=[read_rgb(world["paths"][image_id])], return_tensors="pt")["pixel_values"]
        for j in range(3):
            caption = tokens[b, j].tolist()
            expected += float(advantages[b, j]) * _hand_log_prob(model, {"pixel_values": pixels}, prefix, caption, end)
    expected = -expected / 6
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5, abs=1e-6)  # float32 model vs float64 sums


@pytest.mark.parametrize("kind", ["blip", "git", "llava"])
def test_one_step_changes_weights_kl_is_zero_and_the_folder_loads(world, kind, tmp_path):
    """One SCST step with the KL guard: KL exactly 0 (policy = reference), weights changed, folder loads."""
    options = HFTrainOptions(prompt=PROMPTS[kind])
    policy = HFPolicy.load(world[kind], world["paths"], options, max_length=6)
    before = {n: p.detach().clone() for n, p in policy.module.named_parameters()}
    train = [(i, world["refs"][i]) for i in ["img0", "img1", "img2", "img3"]]
    result = train_scst(_config(tmp_path / "scst", kl_coef=0.5), world[kind], None, train, word_reward,
                        policy=policy)
    rows = list(csv.DictReader((tmp_path / "scst" / "log.csv").open()))
    assert float(rows[0]["kl"]) == 0.0
    changed = [n for n, p in policy.module.named_parameters() if not torch.equal(p, before[n])]
    vision = [n for n in changed if "vision_model" in n or "image_encoder" in n or "vision_tower" in n]
    assert changed and not vision  # the vision tower is frozen by default
    loaded = transformers.AutoModelForImageTextToText.from_pretrained(result.final_dir)
    state = dict(loaded.named_parameters())
    assert torch.equal(state[changed[0]], dict(policy.module.named_parameters())[changed[0]])
    captions = generate_captions(load_hf_captioner(result.final_dir), world["paths"],
                                 HFCaptionOptions(prompt=PROMPTS[kind], beam_size=1, max_new_tokens=6))
    greedy = policy.decode(policy.greedy(policy.module, policy.batch(list(world["paths"]), "cpu"), 6))
    assert list(captions.values()) == [row[0] for row in greedy]


def test_lora_adapters_saved_and_reloaded_give_the_same_captions(world, tmp_path):
    """LoRA on GIT: the merged folder, the base + adapter/ through peft, and the trained policy caption alike."""
    from peft import PeftModel

    options = HFTrainOptions(finetune="lora", lora_r=4, lora_alpha=8.0)
    policy = HFPolicy.load(world["git"], world["paths"], options, max_length=6)
    trainable = [n for n, p in policy.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    train = [(i, world["refs"][i]) for i in ["img0", "img1", "img2", "img3"]]
    result = train_scst(_config(tmp_path / "scst", lr=0.05, max_steps=2), world["git"], None, train, word_reward,
                        policy=policy)
    ids = list(world["paths"])
    trained = [row[0] for row in policy.decode(policy.greedy(policy.module, policy.batch(ids, "cpu"), 6))]
    base = HFPolicy.load(world["git"], world["paths"], HFTrainOptions(), max_length=6, trainable=False)
    untrained = [row[0] for row in base.decode(base.greedy(base.module, base.batch(ids, "cpu"), 6))]
    assert trained != untrained  # the adapters changed the captions
    merged = generate_captions(load_hf_captioner(result.final_dir), world["paths"],
                               HFCaptionOptions(beam_size=1, max_new_tokens=6))
    assert list(merged.values()) == trained
    reloaded = PeftModel.from_pretrained(transformers.AutoModelForImageTextToText.from_pretrained(world["git"]),
                                         result.final_dir / ADAPTER_DIR).eval()
    base.module = reloaded
    assert [row[0] for row in base.decode(base.greedy(reloaded, base.batch(ids, "cpu"), 6))] == trained
    assert not math.isnan(result.losses[-1])


def test_lora_adapters_start_from_the_policy_seed(world):
    """peft draws the adapters' A matrices from torch's global generator: the policy seeds them itself, so two
    loads with one seed start alike whatever the global generator's state, another seed starts elsewhere, and the
    global generator is left where it was."""
    options = HFTrainOptions(finetune="lora", lora_r=4, lora_alpha=8.0)

    def adapters(seed: int) -> dict[str, torch.Tensor]:
        policy = HFPolicy.load(world["git"], world["paths"], options, max_length=6, seed=seed)
        return {n: p.detach().clone() for n, p in policy.module.named_parameters() if "lora_A" in n}

    torch.manual_seed(1)
    first = adapters(5)
    after = torch.rand(3)
    torch.manual_seed(2)
    second = adapters(5)
    torch.manual_seed(1)
    adapters(7)
    assert torch.equal(torch.rand(3), after)  # the global generator is untouched by the adapters' draw
    other = adapters(7)
    assert first and set(first) == set(second) == set(other)
    assert all(torch.equal(first[n], second[n]) for n in first)
    assert all(not torch.equal(first[n], other[n]) for n in first)


def test_gradient_checkpointing_changes_nothing_and_bf16_runs(world, tmp_path):
    """GIT: the model's own gradient checkpointing recomputes the same forward (bit-identical losses and weights);
    scst.mixed_precision=bf16 (CPU autocast) trains with finite losses."""
    train = [(i, world["refs"][i]) for i in ["img0", "img1", "img2", "img3"]]
    runs = {}
    for name, options, precision in (("plain", HFTrainOptions(), "no"),
                                     ("checkpointed", HFTrainOptions(gradient_checkpointing=True), "no"),
                                     ("bf16", HFTrainOptions(), "bf16")):
        policy = HFPolicy.load(world["git"], world["paths"], options, max_length=6)
        result = train_scst(_config(tmp_path / name, max_steps=2, mixed_precision=precision), world["git"], None,
                            train, word_reward, policy=policy)
        runs[name] = (result.losses, dict(policy.module.named_parameters()))
    assert runs["checkpointed"][0] == runs["plain"][0]
    assert all(torch.equal(p, runs["checkpointed"][1][n]) for n, p in runs["plain"][1].items())
    assert len(runs["bf16"][0]) == 2 and all(math.isfinite(x) for x in runs["bf16"][0])
