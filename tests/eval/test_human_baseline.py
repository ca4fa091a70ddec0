"""`pacs evaluate --human-baseline`: the human row recomputed by hand with pycocoevalcap from the JSON's
held-out indices, both protocols, B-4 left out, images with a single reference."""
from __future__ import annotations

import collections
import json

import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

from pacs import cli as pacs_cli
from pacs.eval.human_baseline import hold_out_references, recompute_from_held_out

N_IMAGES = 6


@pytest.fixture(scope="module")
def flickr(shared_data, tmp_path_factory):
    """Six Flickr8k images with their five references, and a system captioning them with other images' captions."""
    refs: dict[str, list[str]] = collections.OrderedDict()
    for line in (shared_data / "flickr8k" / "Flickr8k.token.txt").read_text().splitlines()[:5 * (N_IMAGES + 1)]:
        key, caption = line.split("\t")
        refs.setdefault(key.split("#")[0], []).append(caption)
    images = list(refs)[:N_IMAGES]
    system = {image: refs[list(refs)[k + 1]][0] for k, image in enumerate(images)}  # the next image's caption
    folder = tmp_path_factory.mktemp("human")
    (folder / "refs.json").write_text(json.dumps({i: refs[i] for i in images}))
    (folder / "sys.json").write_text(json.dumps(system))
    return folder, images, {i: refs[i] for i in images}, system


def _pycocoevalcap(captions: dict[str, str], references: dict[str, list[str]]) -> dict[str, float]:
    """BLEU-1/4, ROUGE-L and CIDEr-D straight from pycocoevalcap (its own PTB tokenizer)."""
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({k: [{"caption": r} for r in v] for k, v in references.items()})
    res = tokenizer.tokenize({k: [{"caption": c}] for k, c in captions.items()})
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    return {"bleu1": bleu[0], "bleu4": bleu[3], "rouge": Rouge().compute_score(gts, res)[0],
            "cider": Cider().compute_score(gts, res)[0]}


def _table(folder, *argv):
    out = folder / "human.json"
    assert pacs_cli.main(["evaluate", "--candidates", f"sys={folder / 'sys.json'}", "--references",
                          str(folder / "refs.json"), "--metrics", "bleu1,bleu4,rouge,cider,length",
                          "--human-baseline", "--bootstrap", "0", "--out", str(out),
                          "--csv", str(out.with_suffix(".csv")), *argv]) == 0  # named: each call replaces it
    return json.loads(out.read_text())


@pytest.mark.parametrize("equal_refs", [False, True], ids=["papers", "equal-refs"])
def test_human_row_recomputed_by_hand(flickr, equal_refs):
    folder, images, refs, system = flickr
    table = _table(folder, "--seed", "3", *(["--human-baseline-equal-refs"] if equal_refs else []))
    held = table["human_baseline"]
    assert held["seed"] == 3 and held["protocol"] == ("equal-refs" if equal_refs else "papers")
    assert sorted(held["held_out"]) == sorted(images)
    assert ("same remaining references" if equal_refs else "the papers' protocol") in table["header"]
    human_captions = {i: refs[i][held["held_out"][i]] for i in images}
    remaining = {i: [r for k, r in enumerate(refs[i]) if k != held["held_out"][i]] for i in images}
    sys_row, human_row = table["rows"]
    assert human_row["system"] == "human" and human_row["kind"] == "human" and table["baseline"] == "human"
    expected = _pycocoevalcap(human_captions, remaining)
    for name in ("bleu1", "rouge", "cider"):
        assert human_row["values"][name] == pytest.approx(expected[name], abs=1e-9)
    assert human_row["values"]["bleu4"] is None  # left out for humans, as in the papers
    assert human_row["values"]["length"] == pytest.approx(sum(len(c.split()) for c in human_captions.values())
                                                          / N_IMAGES)
    expected = _pycocoevalcap(system, remaining if equal_refs else refs)
    for name in ("bleu1", "bleu4", "rouge", "cider"):
        assert sys_row["values"][name] == pytest.approx(expected[name], abs=1e-9)
    assert sys_row["delta"]["cider"] == pytest.approx(sys_row["values"]["cider"] - human_row["values"]["cider"])
    assert "bleu4" not in sys_row["delta"]


def test_held_out_indices_follow_the_seed(flickr):
    _, images, refs, _ = flickr
    first, again = hold_out_references(images, refs, 11), hold_out_references(images, refs, 11)
    assert first.held_out == again.held_out and all(0 <= k < 5 for k in first.held_out.values())
    assert any(hold_out_references(images, refs, s).held_out != first.held_out for s in range(12, 20))
    captions, remaining = recompute_from_held_out(first.held_out, refs)
    for image in images:
        assert sorted(remaining[image] + [captions[image]]) == sorted(refs[image]) and len(remaining[image]) == 4


def test_images_with_a_single_reference(tmp_path, capsys):
    (tmp_path / "refs.json").write_text(json.dumps({"1": ["a dog runs", "a brown dog", "the dog"],
                                                    "2": ["a cat sleeps"], "3": ["a red car", "a car"]}))
    (tmp_path / "sys.json").write_text(json.dumps({"1": "a dog", "2": "a cat", "3": "a red car"}))
    out = tmp_path / "t.json"
    argv = ["evaluate", "--candidates", f"sys={tmp_path / 'sys.json'}", "--references", str(tmp_path / "refs.json"),
            "--metrics", "length", "--human-baseline", "--bootstrap", "0", "--out", str(out)]
    assert pacs_cli.main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "'2'" in error[0] and "--skip-single-reference-images" in error[0]
    assert not out.exists()
    assert pacs_cli.main([*argv, "--skip-single-reference-images"]) == 0
    table = json.loads(out.read_text())
    assert table["images"]["ids"] == ["1", "3"] and table["images"]["skipped_single_reference"] == {
        "n": 1, "ids": ["2"]}
    assert "1 image(s) with fewer than 2 references skipped" in table["header"]
    assert table["rows"][0]["values"]["length"] == 2.5 and set(table["human_baseline"]["held_out"]) == {"1", "3"}


def test_a_system_named_human_and_equal_refs_without_baseline_are_errors(tmp_path, capsys):
    (tmp_path / "refs.json").write_text(json.dumps({"1": ["a dog runs", "a brown dog"]}))
    (tmp_path / "human.json").write_text(json.dumps({"1": "a dog"}))
    base = ["evaluate", "--references", str(tmp_path / "refs.json"), "--metrics", "length"]
    assert pacs_cli.main([*base, "--candidates", str(tmp_path / "human.json"), "--human-baseline"]) == 2
    assert "'human'" in capsys.readouterr().err
    assert pacs_cli.main([*base, "--candidates", f"h={tmp_path / 'human.json'}", "--human-baseline-equal-refs"]) == 2
    assert "needs --human-baseline" in capsys.readouterr().err
