"""`pacs evaluate --candidates NAME=FILE ...`: system-level tables on real Flickr8k captions and images.

Systems are the expert-judged candidate captions of Flickr8k (real captions written for other images); the
references are each image's five Flickr8k captions.
"""
from __future__ import annotations

import collections
import csv
import json

import numpy as np
import pytest

from pacs import cli as pacs_cli

N_IMAGES = 8


@pytest.fixture(scope="module")
def flickr(shared_data, tmp_path_factory):
    """Folder with refs.json and three systems: a (dict), b (COCO list in reverse order), c (lacks 2 images)."""
    source = shared_data / "flickr8k"
    refs: dict[str, list[str]] = collections.OrderedDict()
    for line in (source / "Flickr8k.token.txt").read_text().splitlines():
        key, caption = line.split("\t")
        refs.setdefault(key.split("#")[0], []).append(caption)
    candidates: dict[str, list[str]] = collections.OrderedDict()
    for line in (source / "ExpertAnnotations.txt").read_text().splitlines():
        image, candidate = line.split("\t")[:2]
        name, number = candidate.split("#")
        candidates.setdefault(image, []).append(refs[name][int(number)])
    on_disk = {p.name for p in (source / "images").iterdir()}
    images = [i for i, c in candidates.items() if len(c) >= 3 and i in on_disk][:N_IMAGES]
    folder = tmp_path_factory.mktemp("systems")
    (folder / "refs.json").write_text(json.dumps({i: refs[i] for i in images}))
    (folder / "a.json").write_text(json.dumps({i: candidates[i][0] for i in images}))
    (folder / "b.json").write_text(json.dumps([{"image_id": i, "caption": candidates[i][1]} for i in reversed(images)]))
    (folder / "c.json").write_text(json.dumps({i: candidates[i][2] for i in images[:-2]}))
    return {"dir": folder, "images": images, "refs": {i: refs[i] for i in images},
            "a": {i: candidates[i][0] for i in images}, "b": {i: candidates[i][1] for i in images},
            "c": {i: candidates[i][2] for i in images[:-2]}, "image_dir": source / "images"}


def _evaluate(folder, *argv):
    return pacs_cli.main(["evaluate", "--references", str(folder / "refs.json"), *map(str, argv)])


def _single(folder, file, metrics, *extra):
    out = folder / f"single-{file.stem}-{len(extra)}.json"
    assert _evaluate(folder, "--candidates", file, "--metrics", metrics, "--out", out, *extra) == 0
    return json.loads(out.read_text())["metrics"]


TEXT = "bleu1,bleu4,rouge,cider,rep1,incorrect,length"


def test_rows_equal_single_system_runs_exactly(flickr, capsys):
    folder = flickr["dir"]
    out = folder / "table.json"
    assert _evaluate(folder, "--candidates", f"A={folder / 'a.json'}", f"B={folder / 'b.json'}",
                     "--metrics", TEXT + ",meteor", "--bootstrap", "20", "--out", out) == 0
    table = json.loads(out.read_text())
    assert table["systems"] == ["A", "B"] and table["images"]["n"] == N_IMAGES
    assert table["images"]["ids"] == flickr["images"]  # the references file's order
    assert table["rows"][0]["values"] == _single(folder, folder / "a.json", TEXT + ",meteor")  # exactly
    b_values = dict(table["rows"][1]["values"])
    del b_values["meteor"]  # (one METEOR jar start less)
    assert b_values == _single(folder, folder / "b.json", TEXT)
    printed = capsys.readouterr().out
    assert printed.index("\nA ") < printed.index("\nB ")  # a row per system, in the given order
    assert "A,system," in (folder / "table.csv").read_text()  # the CSV next to the JSON


def test_contrastive_rows_equal_single_runs_and_each_image_is_encoded_once(flickr, monkeypatch):
    from pacs.metric.scoring.scorer import Scorer

    folder = flickr["dir"]
    model = ["--images", flickr["image_dir"], "--backbone", "tiny-random"]
    singles = {name: _single(folder, folder / f"{name}.json", "clip-s,ref-clip-s,cider", *model)
               for name in ("a", "b")}
    loaded = []
    original = Scorer._load_pixels
    monkeypatch.setattr(Scorer, "_load_pixels", lambda self, image: loaded.append(str(image)) or original(self, image))
    out = folder / "contrastive.json"
    assert _evaluate(folder, "--candidates", f"a={folder / 'a.json'}", f"b={folder / 'b.json'}",
                     "--metrics", "clip-s,cider", *model, "--bootstrap", "0", "--out", out) == 0
    assert len(loaded) == N_IMAGES and len(set(loaded)) == N_IMAGES  # once for both systems
    table = json.loads(out.read_text())
    for row in table["rows"]:  # bit-equal: each system's captions in fresh batches, the images encoded alike
        assert row["values"]["clip-s"] == singles[row["system"]]["clip-s"]
        assert row["values"]["cider"] == singles[row["system"]]["cider"]
    assert table["provenance"]["models"]["clip-s"]["backbone"] == "tiny-random"


def test_missing_images_error_names_system_and_ids_then_skip_scores_the_common_images(flickr, capsys):
    folder = flickr["dir"]
    out = folder / "missing.json"
    argv = ["--candidates", f"A={folder / 'a.json'}", f"C={folder / 'c.json'}", "--metrics", "bleu1,cider,length",
            "--bootstrap", "0", "--out", out]
    assert _evaluate(folder, *argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "'C'" in error[0]
    assert all(repr(i) in error[0] for i in flickr["images"][-2:]) and not out.exists()
    assert _evaluate(folder, *argv, "--skip-missing-images") == 0
    table = json.loads(out.read_text())
    assert table["images"]["n"] == N_IMAGES - 2
    assert table["images"]["missing"]["C"] == {"n": 2, "ids": flickr["images"][-2:]}
    assert table["images"]["missing"]["A"]["n"] == 0
    assert "common to all (missing per system: C: 2)" in table["header"] in capsys.readouterr().out
    restricted = folder / "a-common.json"
    restricted.write_text(json.dumps({i: flickr["a"][i] for i in flickr["images"][:-2]}))
    assert table["rows"][0]["values"] == _single(folder, restricted, "bleu1,cider,length")


def test_colliding_ids(tmp_path, capsys):
    (tmp_path / "refs.json").write_text(json.dumps({"1": ["a dog runs", "a brown dog"],
                                                    "2": ["a cat sleeps", "a cat on a bed"]}))
    (tmp_path / "a.json").write_text(json.dumps({"1": "a dog", "2": "a cat"}))
    (tmp_path / "b.json").write_text(json.dumps([{"image_id": 2, "caption": "a cat sleeps"},
                                                 {"image_id": 1, "caption": "a dog runs"}]))
    out = tmp_path / "t.json"
    # integer ids of one file and string ids of another are the same images
    assert _evaluate(tmp_path, "--candidates", f"a={tmp_path / 'a.json'}", f"b={tmp_path / 'b.json'}",
                     "--metrics", "length", "--bootstrap", "0", "--out", out) == 0
    table = json.loads(out.read_text())
    assert table["images"]["ids"] == ["1", "2"]
    assert [r["values"]["length"] for r in table["rows"]] == [2.0, 3.0]
    (tmp_path / "dup.json").write_text(json.dumps([{"image_id": 1, "caption": "a dog"},
                                                   {"image_id": "1", "caption": "a dog runs"},
                                                   {"image_id": 2, "caption": "a cat"}]))
    capsys.readouterr()
    assert _evaluate(tmp_path, "--candidates", f"a={tmp_path / 'a.json'}", f"dup={tmp_path / 'dup.json'}",
                     "--metrics", "length", "--out", tmp_path / "dup-table.json") == 2
    error = capsys.readouterr().err
    assert "'dup'" in error and "'1'" in error and "more than once" in error
    assert not (tmp_path / "dup-table.json").exists()


@pytest.mark.parametrize("spec, message", [
    ("=FILE", "expected NAME=FILE"), ("A=", "expected NAME=FILE"), ("A=nowhere.json", "does not exist"),
    ("twice", "given twice"), ("empty", "empty.json: no candidates")])
def test_bad_candidate_pairs_are_one_error(tmp_path, capsys, spec, message):
    (tmp_path / "refs.json").write_text(json.dumps({"1": ["a dog runs", "a brown dog"]}))
    (tmp_path / "a.json").write_text(json.dumps({"1": "a dog"}))
    (tmp_path / "empty.json").write_text("[]")
    first = f"A={tmp_path / 'a.json'}"
    second = {"twice": first, "=FILE": f"={tmp_path / 'a.json'}", "empty": f"E={tmp_path / 'empty.json'}"}.get(spec, spec)
    out = tmp_path / "t.json"
    assert _evaluate(tmp_path, "--candidates", first, second, "--metrics", "length", "--out", out) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0] and not out.exists()
    assert not (tmp_path / "t.csv").exists()


def test_bootstrap_intervals_equal_a_direct_numpy_computation(flickr):
    """Per-caption length and paired differences by numpy; corpus BLEU-4 on each resample by pycocoevalcap."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider

    from pacs.eval.tokenize import ptb_tokenize

    folder, images, seed, n = flickr["dir"], flickr["images"], 7, 40
    out = folder / "boot.json"
    assert _evaluate(folder, "--candidates", f"A={folder / 'a.json'}", f"B={folder / 'b.json'}", "--baseline", "B",
                     "--metrics", "bleu4,length", "--bootstrap", n, "--seed", seed, "--out", out) == 0
    table = json.loads(out.read_text())
    a_len = np.array([len(flickr["a"][i].split()) for i in images], dtype=float)
    b_len = np.array([len(flickr["b"][i].split()) for i in images], dtype=float)
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, len(images), size=len(images)) for _ in range(n)]
    a_means = np.array([a_len[d].mean() for d in draws])
    b_means = np.array([b_len[d].mean() for d in draws])
    row_a, row_b = table["rows"]
    assert table["baseline"] == "B" and "delta" not in row_b
    assert row_a["ci"]["length"] == pytest.approx(list(np.percentile(a_means, [2.5, 97.5])), rel=1e-12)
    assert row_a["delta"]["length"] == pytest.approx(a_len.mean() - b_len.mean(), rel=1e-12)
    assert row_a["delta_ci"]["length"] == pytest.approx(list(np.percentile(a_means - b_means, [2.5, 97.5])),
                                                        rel=1e-12)
    tokens = ptb_tokenize([flickr["a"][i] for i in images] + [r for i in images for r in flickr["refs"][i]])
    captions, refs = tokens[:len(images)], [tokens[len(images) + 5 * k:len(images) + 5 * k + 5]
                                            for k in range(len(images))]
    bleu4 = []
    for d in draws:  # resampled images, repeats kept apart by position
        score, _ = Bleu(4).compute_score({p: refs[i] for p, i in enumerate(d)},
                                         {p: [captions[i]] for p, i in enumerate(d)}, verbose=0)
        bleu4.append(score[3])
    assert row_a["ci"]["bleu4"] == pytest.approx(list(np.percentile(bleu4, [2.5, 97.5])), rel=1e-9, abs=1e-12)
    assert table["bootstrap"]["methods"]["length"].startswith("mean of per-caption")
    # CIDEr-D recomputed on each resample (document frequencies of the resampled references): pycocoevalcap's Cider
    assert _evaluate(folder, "--candidates", f"A={folder / 'a.json'}", "--metrics", "cider", "--bootstrap", n,
                     "--seed", seed, "--bootstrap-recompute-corpus", "--out", out,
                     "--csv", out.with_suffix(".csv")) == 0  # the first run's CSV is replaced only when named
    table = json.loads(out.read_text())
    cider = [Cider().compute_score({p: refs[i] for p, i in enumerate(d)}, {p: [captions[i]] for p, i in enumerate(d)})[0]
             for d in draws]
    assert table["rows"][0]["ci"]["cider"] == pytest.approx(list(np.percentile(cider, [2.5, 97.5])), rel=1e-9)
    assert table["bootstrap"]["methods"]["cider"].startswith("corpus CIDEr-D recomputed")


def test_meteor_recomputed_on_each_resample_equals_pycocoevalcap(flickr):
    """The jar's corpus METEOR of every resample (pacs.eval.meteor_stats) against pycocoevalcap's Meteor on it."""
    from pycocoevalcap.meteor.meteor import Meteor

    from pacs.eval.system_scoring import RowScores
    from pacs.eval.system_table import bootstrap_samples
    from pacs.eval.tokenize import ptb_tokenize

    images, seed, n = flickr["images"], 5, 15
    tokens = ptb_tokenize([flickr["a"][i] for i in images] + [r for i in images for r in flickr["refs"][i]])
    captions = tokens[:len(images)]
    refs = [tokens[len(images) + 5 * k:len(images) + 5 * k + 5] for k in range(len(images))]
    scores = RowScores(values={"meteor": 0.0}, per_row={"meteor": np.zeros(len(images))}, n_rows=len(images),
                       tokens=(captions, refs))
    samples = bootstrap_samples(scores, ["meteor"], n, seed, recompute_corpus=True)["meteor"]
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, len(images), size=len(images)) for _ in range(n)]
    meteor = Meteor()
    expected = [meteor.compute_score({p: refs[i] for p, i in enumerate(d)}, {p: [captions[i]] for p, i in enumerate(d)})[0]
                for d in draws]
    del meteor
    assert samples.tolist() == pytest.approx(expected, abs=1e-12)


def test_csv_plot_and_html(flickr):
    from pacs.eval.report import normalised_columns

    folder = flickr["dir"]
    out, csv_path, png, page = (folder / n for n in ("o.json", "o-table.csv", "o.png", "o.html"))
    assert _evaluate(folder, "--candidates", f"A={folder / 'a.json'}", f"B={folder / 'b.json'}",
                     "--metrics", "cider,length", "--bootstrap", "10", "--out", out, "--csv", csv_path,
                     "--plot", png, "--html", page) == 0
    table = json.loads(out.read_text())
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["system"] for r in rows] == ["A", "B"]
    for line, row in zip(rows, table["rows"]):
        assert float(line["length"]) == row["values"]["length"] and float(line["cider"]) == row["values"]["cider"]
        assert [float(line["cider_ci_low"]), float(line["cider_ci_high"])] == row["ci"]["cider"]
        assert line["cider_delta"] == ""  # no baseline without a human row or --baseline
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert 'id="system-table"' in text and "data:image/png;base64," in text and ">A</td>" in text
    lengths = [r["values"]["length"] for r in table["rows"]]
    low, high = min(lengths), max(lengths)
    assert [line[1] for line in normalised_columns(table)] == [(v - low) / (high - low) for v in lengths]


def test_library_function_gives_the_command_table(tmp_path):
    from pacs.eval.correlate_run import evaluate_systems
    from pacs.metric.common.errors import InputError

    (tmp_path / "refs.json").write_text(json.dumps({"1": ["a dog runs", "a brown dog"], "2": ["a cat", "cats"]}))
    (tmp_path / "a.json").write_text(json.dumps({"1": "a dog", "2": "a black cat"}))
    table = evaluate_systems([f"a={tmp_path / 'a.json'}"], tmp_path / "refs.json", "length", bootstrap=0,
                             human_baseline=True, seed=1)
    assert table["systems"] == ["a", "human"] and table["rows"][0]["values"]["length"] == 2.5
    human = table["human_baseline"]["held_out"]
    expected = [["a dog runs", "a brown dog"][human["1"]], ["a cat", "cats"][human["2"]]]
    assert table["rows"][1]["values"]["length"] == sum(len(c.split()) for c in expected) / 2
    with pytest.raises(InputError, match="unknown evaluate option 'bootstraps'"):
        evaluate_systems([str(tmp_path / "a.json")], tmp_path / "refs.json", "length", bootstraps=3)
