"""The exact judge on hand-written captions."""
from __future__ import annotations

from pacs.captioner.demo.judge import judge_accuracy, judge_caption, parse_caption
from pacs.captioner.demo.world import Scene, SceneObject


def _scene() -> Scene:
    return Scene(objects=(
        SceneObject("circle", "red", "large", column=0, row=1, x=0.17, y=0.5),
        SceneObject("square", "blue", "small", column=2, row=0, x=0.83, y=0.17),
    ))


def test_demo_judge_accepts_a_full_correct_caption() -> None:
    scene = _scene()
    for caption in ("a large red circle and a small blue square",
                    "a red circle to the left of a blue box",
                    "a small blue square to the right of a big red disc",
                    "two shapes : a red circle and a blue square",
                    "A big circle that is red, and a square that is blue."):
        judgement = judge_caption(caption, scene)
        assert judgement.verdict == "correct", (caption, judgement)
        assert judgement.score == 1.0


def test_demo_judge_partial_caption_is_incomplete_with_f1() -> None:
    judgement = judge_caption("a red circle on the left", _scene())
    assert judgement.verdict == "incomplete"
    assert judgement.missed == 1
    assert abs(judgement.score - 2 * 1.0 * 0.5 / 1.5) < 1e-9


def test_demo_judge_penalises_wrong_attributes_hallucinations_relations_counts() -> None:
    scene = _scene()
    wrong_colour = judge_caption("a green circle and a blue square", scene)
    assert wrong_colour.verdict == "wrong" and wrong_colour.wrong_attributes == 1 and wrong_colour.correct == 1
    wrong_position = judge_caption("a red circle on the right and a blue square", scene)
    assert wrong_position.wrong_attributes == 1
    hallucination = judge_caption("a red circle , a blue square and a yellow triangle", scene)
    assert hallucination.hallucinated == 1 and hallucination.verdict == "wrong"
    assert abs(hallucination.score - 2 * (2 / 3) * 1.0 / (2 / 3 + 1.0)) < 1e-9
    relation = judge_caption("a red circle to the right of a blue square", scene)
    assert relation.relations_wrong == 1 and relation.score == 0.5 and relation.verdict == "wrong"
    count = judge_caption("three shapes : a red circle and a blue square", scene)
    assert count.count_errors == 1 and count.score == 0.5
    assert judge_caption("a yellow triangle", scene).score == 0.0
    assert judge_caption("", scene).verdict == "wrong"


def test_demo_judge_penalises_repetitions_and_dangling_words() -> None:
    scene = _scene()
    repeated = judge_caption("a red circle and a red circle and a blue square", scene)
    assert repeated.repetitions == 1 and repeated.score == 0.5
    stutter = judge_caption("a red red circle and a blue square", scene)
    assert stutter.repetitions >= 1 and stutter.verdict == "wrong"
    dangling = judge_caption("a red circle and a blue square and a blue", scene)
    assert dangling.dangling == 1 and dangling.score == 0.5


def test_demo_judge_parser_and_accuracy() -> None:
    mentions, relations, counts, repeats, dangling = parse_caption("two shapes : a small blue box above a red circle")
    assert [m.shape for m in mentions] == ["square", "circle"]
    assert mentions[0].colours == ["blue"] and mentions[0].sizes == ["small"]
    assert relations == [(0, "above", 1)] and counts == [2] and repeats == 0 and dangling == 0
    scene = _scene()
    assert judge_caption("a small blue box above a red circle", scene).relations_correct == 1
    assert judge_accuracy(["a red circle and a blue square", "a red circle"], [scene, scene]) == 50.0


def test_demo_judge_counts_a_repeated_position_phrase() -> None:
    judgement = judge_caption("a red circle on the left on the left and a blue square", _scene())
    assert judgement.repetitions == 1 and judgement.verdict == "wrong"


def test_demo_judge_counts_a_cut_off_ending() -> None:
    judgement = judge_caption("a red circle and a blue square on the", _scene())
    assert judgement.dangling == 1 and judgement.verdict == "wrong" and judgement.score == 0.5


def test_demo_judge_highlights_absent_shapes_and_dangling_endings() -> None:
    from pacs.captioner.demo.judge import highlight_spans

    scene = _scene()  # a red circle and a blue square: a triangle is absent
    caption = "a red circle and a green triangle and a"
    # by hand: "triangle" is characters 25..33, the cut-off final "a" is 38..39
    assert highlight_spans(caption, scene) == [(25, 33, "absent"), (38, 39, "dangling")]
    assert caption[25:33] == "triangle" and caption[38:39] == "a"
    # attribute words with no shape after them dangle (the judge counts two)
    assert highlight_spans("a large blue", scene) == [(2, 7, "dangling"), (8, 12, "dangling")]
    assert judge_caption("a large blue", scene).dangling == 2
    # attributes after "that is" belong to the previous shape: nothing dangles; a correct caption has no mark
    assert highlight_spans("a circle that is red", scene) == []
    assert highlight_spans("a large red circle and a small blue square", scene) == []
    # upper case and punctuation keep the original character positions
    assert highlight_spans("A Diamond, and", scene) == [(2, 9, "absent"), (11, 14, "dangling")]
