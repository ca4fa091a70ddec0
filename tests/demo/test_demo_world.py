"""The procedural world is deterministic and its references, web captions and positives describe the scene."""
from __future__ import annotations

import numpy as np

from pacs.captioner.demo.judge import judge_caption
from pacs.captioner.demo.world import COLOURS, SHAPE_WORDS, DemoWorld, WorldConfig


def test_demo_world_is_deterministic_from_the_seed() -> None:
    first, second = DemoWorld(WorldConfig(seed=3)), DemoWorld(WorldConfig(seed=3))
    for index in range(5):
        a, b = first.item("train", index), second.item("train", index)
        assert a == b
        assert np.array_equal(np.asarray(first.render(a)), np.asarray(second.render(b)))
        assert first.web_captions(a, 3) == second.web_captions(b, 3)
        image_a, text_a = first.positive(a)
        image_b, text_b = second.positive(b)
        assert text_a == text_b and np.array_equal(np.asarray(image_a), np.asarray(image_b))
    other = DemoWorld(WorldConfig(seed=4))
    assert [other.item("train", i).scene for i in range(5)] != [first.item("train", i).scene for i in range(5)]
    assert first.item("train", 0).scene != first.item("val", 0).scene


def test_demo_world_scenes_are_valid_and_rendered_at_size() -> None:
    world = DemoWorld(WorldConfig(seed=0, image_size=32))
    counts = set()
    for item in world.items("train", 60):
        objects = item.scene.objects
        counts.add(len(objects))
        assert len({o.shape for o in objects}) == len(objects)
        assert len({(o.column, o.row) for o in objects}) == len(objects)
        image = world.render(item)
        assert image.size == (32, 32) and image.mode == "RGB"
        # every object's colour is visible near its centre
        pixels = np.asarray(image, dtype=float)
        for obj in objects:
            x, y = int(obj.x * 32), int(obj.y * 32)
            patch = pixels[max(0, y - 1):y + 2, max(0, x - 1):x + 2].reshape(-1, 3)
            distance = np.abs(patch - np.array(COLOURS[obj.colour])).sum(axis=1).min()
            assert distance < 150, (item.image_id, obj)
    assert counts == {1, 2, 3}


def test_demo_world_references_are_correct_and_varied() -> None:
    world = DemoWorld(WorldConfig(seed=1, n_references=5))
    for item in world.items("train", 200):
        assert len(item.references) == 5
        assert len(set(item.references)) >= 3
        for reference in item.references:
            assert judge_caption(reference, item.scene).is_correct, (reference, item.scene)


def test_demo_world_positive_text_is_another_correct_caption_and_image_keeps_the_layout() -> None:
    world = DemoWorld(WorldConfig(seed=2))
    changed_text = 0
    for item in world.items("train", 50):
        image, text = world.positive(item, 0)
        assert judge_caption(text, item.scene).is_correct
        changed_text += text != item.references[0]
        assert not np.array_equal(np.asarray(image), np.asarray(world.render(item)))
    assert changed_text >= 45


def test_demo_world_web_captions_are_noisy_but_about_the_scene() -> None:
    world = DemoWorld(WorldConfig(seed=5))
    shape_words = {w for words in SHAPE_WORDS.values() for w in words}
    mentioned, distractors, total = 0, 0, 0
    for item in world.items("train", 100):
        for caption in world.web_captions(item, 2):
            total += 1
            words = caption.split()
            scene_words = {w for o in item.scene.objects for w in SHAPE_WORDS[o.shape]}
            mentioned += bool(scene_words & set(words))
            distractors += any(w not in shape_words and w not in COLOURS and w not in
                               ("small", "little", "tiny", "large", "big") for w in words)
            assert "a" not in words
    assert mentioned / total > 0.95
    assert 0.2 < distractors / total < 0.9


def test_the_world_tokenizer_equals_the_java_ptb_tokenizer_on_every_world_caption():
    """The demo's Java-free tokenization (its system table's) is pycocoevalcap's PTB tokenization of its captions."""
    import numpy as np

    from pacs.captioner.demo.candidates import long_candidates_for
    from pacs.captioner.demo.world import DemoWorld, WorldConfig, ptb_tokenize_world
    from pacs.eval.tokenize import java_ptb_tokenize

    world = DemoWorld(WorldConfig(image_size=48))
    rng = np.random.default_rng(0)
    captions = []
    for split in ("train", "val"):
        for item in world.items(split, 400):
            captions += item.references + world.web_captions(item, 2)
            captions += [caption for _, caption in long_candidates_for(item, rng)]
    words = sorted({w for c in captions for w in c.split()})
    # what a captioner trained on the world can write: any sequence of its words, empty and degenerate ones too
    captions += ["", "a", ", ,", ": a", *(" ".join(rng.choice(words, size=int(rng.integers(1, 15))))
                                        for _ in range(2000))]
    assert ptb_tokenize_world(captions) == java_ptb_tokenize(captions)
