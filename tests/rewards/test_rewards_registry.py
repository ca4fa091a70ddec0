"""The reward registry, spec parsing, the batch contract and weighted mixes."""
from __future__ import annotations

import pytest
import torch

from pacs.metric.common.errors import InputError
from pacs.rewards import REWARDS, Reward, build_reward, parse_reward_spec, register_reward, reward_names

BUILTIN = {"cider", "clip-s", "ref-clip-s", "pac-s", "ref-pac-s", "pac-s++", "ref-pac-s++"}


def test_builtin_rewards_are_registered():
    assert BUILTIN <= set(reward_names())


def test_parse_spec_is_case_and_space_insensitive():
    assert parse_reward_spec("CIDEr") == [("cider", 1.0)]
    assert parse_reward_spec(" CIDEr : 1 , PAC-S++:0.5 ") == [("cider", 1.0), ("pac-s++", 0.5)]
    assert parse_reward_spec("ref-pac-s++:-0.25") == [("ref-pac-s++", -0.25)]


def test_unknown_reward_lists_known_names():
    with pytest.raises(InputError) as error:
        build_reward("cider:1,spice:1")
    message = str(error.value)
    assert "unknown reward 'spice'" in message
    assert all(name in message for name in BUILTIN)


@pytest.mark.parametrize("spec, message", [
    ("cider:abc", "weight 'abc' of 'cider' is not a number"),
    ("cider:", "weight '' of 'cider' is not a number"),
    ("cider:1:2", "term 'cider:1:2' is not of the form name:weight"),
    (":1", "term ':1' is not of the form name:weight"),
    ("cider:1,,clip-s:1", "term '' is not of the form name:weight"),
    ("cider,clip-s", "term 'cider' is not of the form name:weight"),
    ("cider:1,CIDEr:2", "'cider' appears twice"),
    ("cider:nan", "weight of 'cider' must be finite"),
    ("", "empty reward spec"),
])
def test_bad_spec_syntax_is_a_clear_error(spec, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace("+", r"\+")):
        parse_reward_spec(spec)


@pytest.fixture
def toy_rewards():
    """Two rewards registered by one decorated function each (removed afterwards)."""
    @register_reward("test-words")
    def word_count(**context):
        return lambda image_ids, captions, references: torch.tensor(
            [[float(len(c.split())) for c in row] for row in captions])

    @register_reward("test-overlap")
    def overlap(**context):
        def reward(image_ids, captions, references):
            vocab = [set(" ".join(refs).split()) for refs in references]
            return [[float(len(set(c.split()) & v)) for c in row] for row, v in zip(captions, vocab)]
        return reward

    yield
    del REWARDS["test-words"], REWARDS["test-overlap"]


def test_new_reward_is_one_decorated_function_and_mixes_are_weighted_sums(toy_rewards):
    ids, captions, refs = ["a", "b"], [["a cat", "a cat on a mat"], ["dog", "big dog runs"]], [["a cat"], ["a dog"]]
    words = build_reward("test-words")(ids, captions, refs)
    overlap = build_reward("TEST-OVERLAP")(ids, captions, refs)
    assert torch.equal(words, torch.tensor([[2.0, 5.0], [1.0, 3.0]]))
    assert torch.equal(overlap, torch.tensor([[2.0, 2.0], [1.0, 1.0]]))  # list output is converted
    mix = build_reward("test-words:0.5,test-overlap:-2")
    total = mix(ids, captions, refs)
    assert total.dtype == torch.float32 and total.shape == (2, 2)
    assert torch.allclose(total, 0.5 * words - 2 * overlap)
    assert set(mix.last_components) == {"test-words", "test-overlap"}
    assert torch.equal(mix.last_components["test-overlap"], overlap)


def test_duplicate_registration_is_refused(toy_rewards):
    with pytest.raises(ValueError, match="already registered"):
        register_reward("test-words")(lambda **context: None)
    with pytest.raises(ValueError, match="no ',' or ':'"):
        register_reward("a:b")


def test_batch_contract_is_enforced(toy_rewards):
    reward = build_reward("test-words")
    with pytest.raises(InputError, match="2 image ids, 1 caption rows and 2 reference rows"):
        reward(["a", "b"], [["x"]], [["r"], ["r"]])
    with pytest.raises(InputError, match="image 'b' has 1 captions, the first row 2"):
        reward(["a", "b"], [["x", "y"], ["z"]], [["r"], ["r"]])
    with pytest.raises(InputError, match=r"captions\[0\] \(image 'a'\) is a string"):
        reward(["a"], ["a caption"], [["r"]])
    broken = Reward("broken", lambda ids, caps, refs: torch.zeros(len(ids)))
    with pytest.raises(RuntimeError, match=r"reward 'broken' returned shape \(2,\), expected \[2, 1\]"):
        broken(["a", "b"], [["x"], ["y"]], [["r"], ["r"]])
