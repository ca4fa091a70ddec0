"""pacs.rewards.guards: `rep-penalty` and `length-penalty`, values by hand, mixed like any reward, usable through TRL."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from pacs.metric.common.errors import InputError
from pacs.rewards import build_reward, reward_names
from pacs.rewards.trl import reward_function

GAMED = "a a dog dog dog area area area"


def test_guard_rewards_are_registered():
    assert {"rep-penalty", "length-penalty"} <= set(reward_names())


def test_rep_penalty_is_minus_the_repeated_ngrams_of_each_caption():
    captions = [[GAMED, "A dog, a dog.", "a red circle"]]
    # bigrams of GAMED: (a a) (a dog) (dog dog) (dog dog) (dog area) (area area) (area area): 2 repeats
    # unigrams: a x2, dog x3, area x3: 1 + 2 + 2 = 5 repeats; "A dog, a dog." -> a dog / dog a / a dog: 1
    two = build_reward("rep-penalty")(["img"], captions, [["ref"]])
    assert two.tolist() == [[-2.0, -1.0, 0.0]]
    one = build_reward("rep-penalty", rep_n=1)(["img"], captions, [["ref"]])
    assert one.tolist() == [[-5.0, -2.0, 0.0]]
    three = build_reward("rep-penalty", rep_n=3)(["img"], captions, [["ref"]])
    assert three.tolist() == [[0.0, 0.0, 0.0]]  # (dog dog dog) and (area area area) occur once each


def test_length_penalty_counts_words_beyond_the_longest_reference_of_the_image():
    refs = [["a dog runs on the grass", "a dog"], ["a man"]]  # longest: 6 words, 2 words
    captions = [["a dog runs on the green grass near trees", "a dog, running."],
                ["a man rides a horse", "a man"]]
    values = build_reward("length-penalty")(["dog", "man"], captions, refs)
    assert values.tolist() == [[-3.0, 0.0], [-3.0, 0.0]]  # 9 - 6 and 5 - 2 words; punctuation is no word


def test_length_penalty_with_a_percentile_of_the_training_references_or_a_fixed_limit():
    train = {"a": ["one two", "one two three four"], "b": ["one two three four five six",
                                                          "one two three four five six seven eight"]}
    # word counts 2, 4, 6, 8: the median (numpy's linear interpolation) is 5, the 100th percentile 8
    caption = [["w " * 7]]
    median = build_reward("length-penalty", length_limit="train", length_percentile=50, train_references=train)
    assert median(["x"], caption, [[]]).tolist() == [[-2.0]]
    top = build_reward("length-penalty", length_limit="train", length_percentile=100, train_references=train)
    assert top(["x"], caption, [[]]).tolist() == [[0.0]]
    fixed = build_reward("length-penalty", length_limit=3)
    assert fixed(["x"], caption, [[]]).tolist() == [[-4.0]]
    assert build_reward("length-penalty", length_limit="3")(["x"], caption, [[]]).tolist() == [[-4.0]]


def test_guard_rewards_mix_like_any_registry_reward():
    train = [["a dog runs on the grass", "the dog is in a field"], ["a man on a horse", "a rider and his horse"]]
    reward = build_reward("cider:1,rep-penalty:0.5,length-penalty:0.25", train_references=train)
    captions = [[GAMED, "a dog runs on the grass"], ["a man on a horse horse horse horse horse", "a man"]]
    values = reward(["d", "m"], captions, train)
    parts = reward.last_components
    assert parts["rep-penalty"].tolist() == [[-2.0, 0.0], [-3.0, 0.0]]
    assert parts["length-penalty"].tolist() == [[-2.0, 0.0], [-4.0, 0.0]]  # 8 - 6 and 9 - 5 words
    cider = build_reward("cider", train_references=train)(["d", "m"], captions, train)
    torch.testing.assert_close(values, cider + 0.5 * parts["rep-penalty"] + 0.25 * parts["length-penalty"])


@pytest.mark.parametrize("context, message", [
    ({"rep_n": 0}, "rep_n=0: expected an int >= 1"),
    ({"rep_n": "2"}, "rep_n='2': expected an int >= 1"),
])
def test_rep_penalty_options_are_checked(context, message):
    with pytest.raises(InputError, match=message):
        build_reward("rep-penalty", **context)


@pytest.mark.parametrize("context, message", [
    ({"length_limit": "bogus"}, "length_limit='bogus': expected 'refs', 'train' or a number"),
    ({"length_limit": 0}, "length_limit=0: expected a number of words >= 1"),
    ({"length_limit": "train"}, "length_limit='train' needs the training references"),
    ({"length_limit": "train", "length_percentile": 0, "train_references": [["a b"]]}, "length_percentile=0"),
    ({"length_limit": "train", "length_percentile": 101, "train_references": [["a b"]]}, "length_percentile=101"),
])
def test_length_penalty_options_are_checked(context, message):
    with pytest.raises(InputError, match=message):
        build_reward("length-penalty", **context)


def test_length_penalty_names_an_image_without_references():
    with pytest.raises(InputError, match="image 'img7' has no reference captions"):
        build_reward("length-penalty")(["img7"], [["a dog"]], [[]])


def test_trl_reward_function_users_get_the_guard_terms(tiny_backbone):
    red = Image.new("RGB", (64, 64), (220, 20, 20))
    completions = ["a red red red red square", "a red square", "a red square on a white table top"]
    columns = {"image": [red] * 3, "references": [["a red square on white", "a red box"]] * 3}
    guarded = reward_function("clip-s:1,rep-penalty:0.5,length-penalty:0.25", backbone=tiny_backbone, rep_n=1)
    plain = reward_function("clip-s", backbone=tiny_backbone)
    got = guarded(prompts=["Describe."] * 3, completions=completions, **columns)
    clip = plain(prompts=["Describe."] * 3, completions=completions, **columns)
    # rep_n=1: "red" x4 -> 3 repeats; "a" x2 in the third -> 1; longest reference: 5 words
    rep, length = [-3.0, 0.0, -1.0], [-1.0, 0.0, -3.0]  # 6 - 5, 3 <= 5, 8 - 5 words
    expected = [c + 0.5 * r + 0.25 * n for c, r, n in zip(clip, rep, length)]
    assert got == pytest.approx(expected, abs=1e-6)


def test_trl_length_penalty_needs_the_references_column():
    fn = reward_function("rep-penalty:1,length-penalty:1")
    with pytest.raises(InputError, match="needs the references in the dataset column 'references'"):
        fn(prompts=["p"], completions=["a dog"])
    assert reward_function("rep-penalty")(prompts=["p"], completions=["a dog dog a dog"]) == [-1.0]


def _dropin_recipe():
    """recipes/dropin_reward_example.py as a module (recipes/ holds scripts, not a package)."""
    import importlib.util
    import sys
    from pathlib import Path

    if "dropin_reward_example" not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "recipes" / "dropin_reward_example.py"
        spec = importlib.util.spec_from_file_location("dropin_reward_example", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["dropin_reward_example"]


def test_dropin_kl_step_is_plain_scst_at_the_reference_then_penalises_drift(shared_data):
    import copy

    recipe = _dropin_recipe()
    torch.set_num_threads(1)
    dataset = recipe.load_dataset("flickr8k", shared_data / "flickr8k").split("train")
    batch = dataset.items[:2]
    tokenizer = recipe.build_tokenizer([c for item in batch for c in item.captions])
    model = recipe.build_captioner(tokenizer, 32, seed=0)
    twin = copy.deepcopy(model)
    reference = recipe.frozen_reference(model)
    reward = build_reward("cider:1,rep-penalty:1,length-penalty:0.5", train_references=[i.captions for i in batch])
    pixels = recipe.build_image_processor(32)(images=[Image.open(i.image_path).convert("RGB") for i in batch],
                                              return_tensors="pt").pixel_values
    ids, refs = [i.image_id for i in batch], [i.captions for i in batch]
    plain_opt, kl_opt = torch.optim.SGD(twin.parameters(), lr=0.5), torch.optim.SGD(model.parameters(), lr=0.5)
    torch.manual_seed(3)
    plain = recipe.scst_step(twin, plain_opt, tokenizer, reward, pixels, ids, refs, 3, 10)
    torch.manual_seed(3)
    guarded = recipe.scst_step_with_kl(model, reference, 10.0, kl_opt, tokenizer, reward, pixels, ids, refs, 3, 10)
    # the model equals its reference at the first step: KL exactly 0, the plain SCST update
    assert torch.equal(guarded["kl"], torch.zeros(2, 3)) and guarded["captions"] == plain["captions"]
    assert guarded["loss"] == plain["loss"]
    after = recipe.scst_step_with_kl(model, reference, 10.0, kl_opt, tokenizer, reward, pixels, ids, refs, 3, 10)
    assert (after["kl"] != 0).any()  # the model moved away from the reference, which did not move
    start = recipe.build_captioner(tokenizer, 32, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), start.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), start.parameters()))
