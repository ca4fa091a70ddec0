"""pacs.rewards.trl: pacs rewards called exactly as TRL's GRPOTrainer calls reward functions."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pacs.metric.common.errors import InputError
from pacs.metric.scoring.registry import default_w
from pacs.metric.scoring.scorer import Scorer
from pacs.rewards import build_reward
from pacs.rewards.trl import reward_function

G = 3  # completions per prompt (GRPOConfig.num_generations)


@pytest.fixture(scope="module")
def flickr(shared_data):
    """Two real Flickr8k training images with their references."""
    from pacs.captioner.data import load_dataset

    items = load_dataset("flickr8k", shared_data / "flickr8k").split("train").items[:2]
    return [str(item.image_path) for item in items], [list(item.captions) for item in items]


def grpo_batch(paths, references):
    """The keyword arguments GRPOTrainer._calculate_rewards passes: each prompt's columns repeated G times."""
    captions = ["a dog runs on the grass", "A man in a red shirt.", "",
                "two children play in the water", "a dog", "people walking down a street"]
    rows = [b for b in range(len(paths)) for _ in range(G)]
    return {"prompts": ["Describe the image."] * len(rows), "completions": captions,
            "completion_ids": [[7, 8, 9]] * len(rows), "image": [paths[b] for b in rows],
            "references": [references[b] for b in rows], "trainer_state": object(),
            "log_extra": lambda column, values: None, "log_metric": lambda name, value: None}, rows


class EncodeCounter:
    """Counts the images the backbone encodes."""

    def __init__(self, backbone):
        self.backbone, self.original, self.images = backbone, backbone.encode_image, 0

    def __enter__(self):
        def counting(pixels, *args, **kwargs):
            self.images += pixels.shape[0]
            return self.original(pixels, *args, **kwargs)

        self.backbone.encode_image = counting
        return self

    def __exit__(self, *exc):
        del self.backbone.encode_image  # back to the class method


def test_called_like_grpo_trainer_equals_the_scorer(tiny_backbone, flickr):
    paths, references = flickr
    fn = reward_function("pac-s++", backbone=tiny_backbone)
    kwargs, rows = grpo_batch(paths, references)
    values = fn(**kwargs)
    assert isinstance(values, list) and len(values) == 6 and all(type(v) is float for v in values)
    w = default_w("pac-s++", tiny_backbone)
    expected = Scorer(tiny_backbone, w=w, progress=False).score([paths[b] for b in rows], kwargs["completions"]).scores
    np.testing.assert_allclose(values, expected, rtol=0, atol=1e-6)
    assert len(set(values)) == 6  # six different completions, six different rewards


def test_image_embeddings_cached_across_calls(tiny_backbone, flickr):
    paths, references = flickr
    fn = reward_function("clip-s", backbone=tiny_backbone)
    kwargs, _ = grpo_batch(paths, references)
    with EncodeCounter(tiny_backbone) as counter:
        first = fn(**kwargs)
        assert counter.images == 2  # 6 completions of 2 images: each image encoded once
        for column in ("completions", "image", "references"):
            kwargs[column] = list(reversed(kwargs[column]))
        second = fn(**kwargs)
        assert counter.images == 2  # no image encoded again
    assert fn.n_encoded == 2
    np.testing.assert_allclose(second, first[::-1], rtol=0, atol=1e-6)  # the batch reversed, rewards reversed


def test_conversational_completions_and_pil_images_column(tiny_backbone, flickr):
    paths, references = flickr
    fn = reward_function("ref-pac-s++", backbone=tiny_backbone)
    kwargs, rows = grpo_batch(paths, references)
    plain = fn(**kwargs)
    conversational = dict(kwargs)
    conversational["completions"] = [[{"role": "assistant", "content": c}] for c in kwargs["completions"][:3]] + [
        [{"role": "assistant", "content": [{"type": "text", "text": c}]}] for c in kwargs["completions"][3:]]
    pil = {b: Image.open(paths[b]).convert("RGB") for b in range(2)}
    conversational["images"] = [[pil[b]] for b in rows]  # TRL's multi-image column, one image per prompt
    del conversational["image"]
    np.testing.assert_allclose(fn(**conversational), plain, rtol=0, atol=1e-6)


def test_mix_spec_is_the_weighted_sum_of_independent_terms(tiny_backbone, flickr):
    paths, references = flickr
    logged = {}
    fn = reward_function("cider:1,ref-pac-s++:0.5", backbone=tiny_backbone, train_references=references)
    assert fn.__name__ == "cider:1,ref-pac-s++:0.5"
    kwargs, rows = grpo_batch(paths, references)
    kwargs["log_metric"] = logged.__setitem__
    values = fn(**kwargs)
    cider = build_reward("cider", train_references=references)(
        ["a", "b"], [kwargs["completions"][:3], kwargs["completions"][3:]], references).reshape(-1).numpy()
    ref_pac = Scorer(tiny_backbone, w=default_w("pac-s++", tiny_backbone), progress=False).score(
        [paths[b] for b in rows], kwargs["completions"], references=[references[b] for b in rows]).scores
    np.testing.assert_allclose(values, cider + 0.5 * ref_pac, rtol=0, atol=1e-5)
    assert cider.max() > 0  # the mix really contains a non-zero CIDEr term
    assert logged["cider:1,ref-pac-s++:0.5/cider"] == pytest.approx(float(cider.mean()), abs=1e-5)
    assert logged["cider:1,ref-pac-s++:0.5/ref-pac-s++"] == pytest.approx(float(ref_pac.mean()), abs=1e-5)


def test_missing_columns_are_named(tiny_backbone, flickr):
    paths, references = flickr
    kwargs, _ = grpo_batch(paths, references)
    no_refs = {key: value for key, value in kwargs.items() if key != "references"}
    with pytest.raises(InputError, match=r"column 'references', which the batch lacks \(columns: \['image'\]\)"):
        reward_function("ref-clip-s", backbone=tiny_backbone)(**no_refs)
    assert len(reward_function("clip-s", backbone=tiny_backbone)(**no_refs)) == 6  # reference-free: not needed
    no_image = {key: value for key, value in kwargs.items() if key != "image"}
    with pytest.raises(InputError, match=r"column 'image' or 'images'"):
        reward_function("clip-s", backbone=tiny_backbone)(**no_image)
    with pytest.raises(InputError, match=r"column 'photo'.*image_column="):
        reward_function("clip-s", backbone=tiny_backbone, image_column="photo")(**kwargs)
    renamed = dict(no_image, photo=kwargs["image"], refs=kwargs["references"])
    custom = reward_function("ref-clip-s", backbone=tiny_backbone, image_column="photo", references_column="refs")
    np.testing.assert_allclose(custom(**renamed), reward_function("ref-clip-s", backbone=tiny_backbone)(**kwargs),
                               atol=1e-6)
    # cider reads no image: a text-only dataset works
    assert len(reward_function("cider", train_references=references)(**no_image)) == 6


def test_bad_rows_are_named_and_none_rows_are_skipped(tiny_backbone, flickr):
    paths, references = flickr
    fn = reward_function("clip-s", backbone=tiny_backbone)
    kwargs, _ = grpo_batch(paths, references)
    with pytest.raises(InputError, match=r"column 'images', row 0: 2 images"):
        fn(**{**{k: v for k, v in kwargs.items() if k != "image"}, "images": [[paths[0], paths[1]]] * 6})
    with pytest.raises(InputError, match=r"completions\[2\]"):
        fn(**{**kwargs, "completions": ["a", "b", 3, "c", "d", "e"]})
    with pytest.raises(InputError, match=r"column 'image' has 5 rows for 6 completions"):
        fn(**{**kwargs, "image": kwargs["image"][:5]})
    with_gap = fn(**{**kwargs, "image": [None] + kwargs["image"][1:]})  # a text-only row: TRL reads None as NaN
    assert with_gap[0] is None
    np.testing.assert_allclose(with_gap[1:], fn(**kwargs)[1:], atol=1e-6)


def test_trl_sees_the_name_and_a_synchronous_callable(tiny_backbone):
    utils = pytest.importorskip("trl.trainer.utils")
    fn = reward_function("pac-s++", backbone=tiny_backbone, name="pacs")
    assert utils.get_callable_name(fn) == "pacs"
    assert not utils.is_async_callable(fn)
    with pytest.raises(InputError, match="image_paths= is not used"):
        reward_function("pac-s++", backbone=tiny_backbone, image_paths={})


def test_docstring_example_runs():
    import doctest

    import pacs.rewards.trl
    failures, tried = doctest.testmod(pacs.rewards.trl, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0
