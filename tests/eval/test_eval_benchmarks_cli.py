"""`pacs correlate` / `pacs evaluate` on small files in the released formats; bad input, every case."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from scipy import io as sio

from pacs import cli as pacs_cli
from pacs.eval.benchmarks import BENCHMARKS, Benchmark, RunContext, get_benchmark, register_benchmark
from pacs.eval.caption_scoring import MetricSuite

torch.set_num_threads(1)


def run(argv):
    return pacs_cli.main(argv)


# ------------------------------------------------------------------------------------------------ Flickr8k
@pytest.fixture
def flickr_subset(tmp_path, shared_data):
    """The first 90 expert rows / 200 CF rows of the raw files, with the full token file."""
    folder = tmp_path / "f8k"
    folder.mkdir()
    source = shared_data / "flickr8k"
    lines = (source / "ExpertAnnotations.txt").read_text().splitlines()[:90]
    (folder / "ExpertAnnotations.txt").write_text("\n".join(lines) + "\n")
    lines = (source / "CrowdFlowerAnnotations.txt").read_text().splitlines()[:200]
    (folder / "CrowdFlowerAnnotations.txt").write_text("\n".join(lines) + "\n")
    shutil.copy(source / "Flickr8k.token.txt", folder / "Flickr8k.token.txt")
    return folder


def test_correlate_flickr8k_expert_json_keys_and_counts(flickr_subset, tmp_path, capsys):
    out = tmp_path / "expert.json"
    assert run(["correlate", "flickr8k-expert", "--data", str(flickr_subset), "--metrics", "BLEU1,cider,length",
                "--out", str(out), "--bootstrap", "30"]) == 0
    table = json.loads(out.read_text())
    for name in ("bleu1", "cider", "length"):
        assert {"tau_b", "tau_c", "n", "tau_b_ci", "tau_c_ci", "p_value_vs_best"} <= set(table[name])
        assert table[name]["tau_b_ci"][0] <= table[name]["tau_b"] <= table[name]["tau_b_ci"][1]
    excluded = table["counts"]["excluded_candidate_is_reference"]
    assert table["cider"]["n"] == 3 * (90 - excluded) and excluded >= 1
    assert table["provenance"]["pacs_version"] and table["benchmark"] == "flickr8k-expert"
    assert "cider" in capsys.readouterr().out


def test_clipscore_json_equals_raw_files_and_nan_ratings_are_counted(flickr_subset, tmp_path):
    """The clipscore json built from the same rows gives the same table; NaN ratings are skipped and counted."""
    from pacs.eval.benchmarks.flickr8k import image_references, load_raw, read_token_file

    rows = load_raw(flickr_subset, "expert")
    data: dict = {}
    for image, cand, refs, rating in zip(rows.image_ids, rows.candidates, rows.references, rows.ratings):
        entry = data.setdefault(image, {"image_path": image, "ground_truth": refs, "human_judgement": []})
        entry["human_judgement"].append({"caption": cand, "rating": float(rating)})
    first = next(iter(data.values()))
    first["human_judgement"].append({"caption": "a dog", "rating": float("nan")})
    path = tmp_path / "flickr8k.json"
    path.write_text(json.dumps(data).replace("NaN", "NaN"))
    raw = get_benchmark("flickr8k-expert").run(RunContext(flickr_subset, MetricSuite(["bleu1", "rouge"])))
    context = RunContext(path, MetricSuite(["bleu1", "rouge"]))
    from_json = get_benchmark("flickr8k-expert").run(context)
    assert context.notes["skipped_nan_rating"] == 1
    for name in ("bleu1", "rouge"):
        assert from_json[name]["tau_b"] == pytest.approx(raw[name]["tau_b"], abs=1e-12)
    assert image_references(read_token_file(flickr_subset / "Flickr8k.token.txt"))


def test_flickr8k_cf_subset(flickr_subset):
    context = RunContext(flickr_subset, MetricSuite(["bleu1"]))
    table = get_benchmark("flickr8k-cf").run(context)
    assert table["bleu1"]["n"] == 200  # every CF pair is kept


def test_malformed_annotation_line_names_file_and_line(flickr_subset, capsys):
    path = flickr_subset / "ExpertAnnotations.txt"
    lines = path.read_text().splitlines()
    lines[6] = lines[6].rsplit("\t", 1)[0]  # drop a field on line 7
    path.write_text("\n".join(lines) + "\n")
    assert run(["correlate", "flickr8k-expert", "--data", str(flickr_subset), "--metrics", "bleu1"]) == 2
    assert "ExpertAnnotations.txt:7: expected 5 tab-separated fields" in capsys.readouterr().err


def test_unresolved_caption_id_is_an_error(flickr_subset, capsys):
    path = flickr_subset / "CrowdFlowerAnnotations.txt"
    lines = path.read_text().splitlines()
    fields = lines[3].split("\t")
    fields[1] = "nonexistent.jpg#2"
    lines[3] = "\t".join(fields)
    path.write_text("\n".join(lines) + "\n")
    assert run(["correlate", "flickr8k-cf", "--data", str(flickr_subset), "--metrics", "bleu1"]) == 2
    assert "CrowdFlowerAnnotations.txt:4: caption id 'nonexistent.jpg#2'" in capsys.readouterr().err


def test_non_numeric_rating_and_no_partial_output(flickr_subset, tmp_path, capsys):
    path = flickr_subset / "ExpertAnnotations.txt"
    lines = path.read_text().splitlines()
    lines[0] = lines[0].rsplit("\t", 1)[0] + "\tx"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "never.json"
    assert run(["correlate", "flickr8k-expert", "--data", str(flickr_subset), "--metrics", "bleu1",
                "--out", str(out)]) == 2
    assert "ExpertAnnotations.txt:1: ratings must be numbers" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".never.json*"))


@pytest.mark.parametrize("argv, message", [
    (["correlate", "nope", "--data", ".", "--metrics", "bleu1"], "unknown benchmark 'nope'"),
    (["correlate", "flickr8k-expert", "--data", ".", "--metrics", "bleu1,blue9"], "unknown metric 'blue9'"),
    (["correlate", "flickr8k-expert", "--data", ".", "--metrics", "rep1"], "rep1 is a corpus-level measure"),
    (["correlate", "flickr8k-expert", "--data", "/nonexistent", "--metrics", "bleu1"], "does not exist"),
])
def test_unknown_names_are_clear_errors(argv, message, capsys):
    assert run(argv) == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------------------------ images / contrastive
@pytest.fixture
def tiny_checkpoint(tmp_path):
    from pacs.metric.models.backbones import build_backbone_from_config, save_backbone, tiny_clip_config

    path = tmp_path / "tiny.safetensors"
    save_backbone(build_backbone_from_config(tiny_clip_config(), seed=0), path)
    return path


def test_missing_image_is_an_error_unless_skipped(flickr_subset, shared_data, tiny_checkpoint, tmp_path, capsys):
    lines = (flickr_subset / "ExpertAnnotations.txt").read_text().splitlines()
    judged = sorted({line.split("\t")[0] for line in lines})
    assert len(judged) >= 2
    images = tmp_path / "images"  # only the first judged image is present
    images.mkdir()
    (images / judged[0]).write_bytes((shared_data / "flickr8k" / "images" / judged[0]).read_bytes())
    argv = ["correlate", "flickr8k-expert", "--data", str(flickr_subset), "--metrics", "clip-s,bleu1",
            "--images", str(images), "--checkpoint", str(tiny_checkpoint), "--batch-size", "8"]
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert f"image {judged[1]!r} not found" in err and "--skip-missing-images" in err
    out = tmp_path / "skip.json"
    assert run(argv + ["--skip-missing-images", "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    # by hand: three expert rows per line whose candidate is not one of its image's own captions
    token_lines = (flickr_subset / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines()
    caption_of = {key: text for key, _, text in (t.partition("\t") for t in token_lines)}
    own = {}
    for key, text in caption_of.items():
        own.setdefault(key.split("#")[0], set()).add(text)
    rows_of = {}
    for line in lines:
        image, caption_id = line.split("\t")[:2]
        rows_of[image] = rows_of.get(image, 0) + (0 if caption_of[caption_id] in own[image] else 3)
    assert rows_of[judged[0]] > 0 and sum(rows_of.values()) > rows_of[judged[0]]
    assert table["counts"]["skipped_missing_image"] == sum(rows_of.values()) - rows_of[judged[0]]
    assert table["clip-s"]["n"] == table["bleu1"]["n"] == rows_of[judged[0]]  # skipped for every metric alike


def test_contrastive_metric_needs_images(flickr_subset, tiny_checkpoint, capsys):
    assert run(["correlate", "flickr8k-expert", "--data", str(flickr_subset), "--metrics", "clip-s",
                "--checkpoint", str(tiny_checkpoint)]) == 2
    assert "need images" in capsys.readouterr().err


# ------------------------------------------------------------------------------ composite / foil / pascal
def test_composite_clipscore_json(tmp_path):
    data = {f"img{i}": {"image_path": f"img{i}.jpg", "ground_truth": ["a dog runs on grass", "a brown dog"],
                        "human_judgement": [{"caption": c, "rating": r} for c, r in
                                            [("a dog runs on the grass", 5), ("a cat on a sofa", 1),
                                             ("a brown dog runs", 4), ("two men talking", float(i % 2 or "nan"))]]}
            for i in range(4)}
    data["img0"]["human_judgement"].append({"caption": "", "rating": 1})  # empty: scored and counted
    (tmp_path / "composite.json").write_text(json.dumps(data))
    context = RunContext(tmp_path, MetricSuite(["bleu1", "cider"]))
    table = get_benchmark("composite").run(context)
    assert context.notes["skipped_nan_rating"] == 2
    assert context.notes["empty_candidates"] == 1
    assert table["bleu1"]["n"] == 15 and table["bleu1"]["tau_b"] > 30


def _write_foil(folder, with_ids=True):
    coco = {"annotations": [
        {"image_id": 1, "id": 11, "caption": "A dog sitting on a red couch."},
        {"image_id": 1, "id": 12, "caption": "A dog is on the sofa."},
        {"image_id": 1, "id": 13, "caption": "A brown dog resting on a couch."},
        {"image_id": 1, "id": 14, "caption": "The dog lies on a couch indoors."},
        {"image_id": 1, "id": 15, "caption": "A pet dog on red furniture."},
        {"image_id": 2, "id": 21, "caption": "A man riding a horse on a beach."},
        {"image_id": 2, "id": 22, "caption": "A person on a horse near the ocean."},
        {"image_id": 2, "id": 23, "caption": "A horse rider on the sand."},
        {"image_id": 2, "id": 24, "caption": "A man rides a brown horse."},
        {"image_id": 2, "id": 25, "caption": "Horseback riding at the beach."}]}
    foil = {"images": [{"id": 1}, {"id": 2}], "annotations": [
        {"image_id": 1, "id": 11, "caption": "A dog sitting on a red couch.", "foil": False},
        {"image_id": 1, "id": 11, "caption": "A cat sitting on a red couch.", "foil": True,
         "target_word": "dog", "foil_word": "cat"},
        {"image_id": 2, "id": 21, "caption": "A man riding a horse on a beach.", "foil": False},
        {"image_id": 2, "id": 21 if with_ids else 99, "caption": "A man riding a cow on a beach.", "foil": True,
         "target_word": "horse", "foil_word": "cow"},
        {"image_id": 2, "id": 98, "caption": "A man riding a zebra in a city.", "foil": True,
         "target_word": "horse", "foil_word": "zebra"}]}
    (folder / "captions_val2014.json").write_text(json.dumps(coco))
    (folder / "foilv1.0_test_2017.json").write_text(json.dumps(foil))


@pytest.mark.parametrize("with_ids", [True, False])
def test_foil_released_format(tmp_path, with_ids):
    _write_foil(tmp_path, with_ids)
    context = RunContext(tmp_path, MetricSuite(["bleu1", "length"]))
    table = get_benchmark("foil").run(context)
    assert context.notes["unpaired_foil_captions"] == 1  # the zebra caption matches no correct caption
    assert table["bleu1"]["1-ref"] == 100.0 and table["bleu1"]["4-ref"] == 100.0
    assert table["length"]["4-ref"] == 50.0  # equal lengths: ties count half
    assert table["bleu1"]["n"] == 2


def test_pascal50s_mat_format(tmp_path):
    names = np.array([f"2008_00000{i}.jpg" for i in range(4)], dtype=object)
    sent1 = np.array(["a dog on grass", "a red car", "a man on a boat", "two cats"], dtype=object)
    sent2 = np.array(["a kitchen with a stove", "a car that is red", "a boat", "two cats sleeping"], dtype=object)
    new_input = np.zeros((1, 4), dtype=[("name", "O"), ("sent1", "O"), ("sent2", "O")])
    result = np.zeros((1, 4), dtype=[("result", "O")])
    votes = [[1, 1, 1, -1], [1, 1, -1], [1, 1, -1, -1], [-1, -1, -1]]  # pair 3 ties -> random label
    for i in range(4):
        new_input[0, i] = (np.array([names[i]]), np.array([sent1[i]]), np.array([sent2[i]]))
        result[0, i] = (np.array([votes[i]]),)
    sio.savemat(tmp_path / "pair_pascal.mat", {"new_input": new_input, "result": result,
                                               "category": np.array([[1, 2, 3, 4]], dtype=np.uint8),
                                               "new_data": np.zeros((4, 2), dtype=np.uint8)})
    refs = np.zeros((1, 4), dtype=[("image", "O"), ("sent", "O")])
    pools = [["a dog on the grass", "dog in a park", "a puppy on grass", "a dog", "grass and a dog", "a dog plays"],
             ["a red car", "a car parked", "red car on road", "a red automobile", "car", "the car is red"],
             ["a man on a boat", "a boat on a lake", "man fishing", "a small boat", "a man rowing", "boat"],
             ["two cats", "cats sleeping", "two cats sleeping", "a pair of cats", "cats", "two kittens"]]
    for i in range(4):
        refs[0, i] = (np.array([names[i]]), np.array([[np.array([s]) for s in pools[i]]], dtype=object))
    sio.savemat(tmp_path / "pascal50S.mat", {"refs": refs})
    context = RunContext(tmp_path, MetricSuite(["bleu1", "length"]))
    table = get_benchmark("pascal50s").run(context)
    assert context.notes["human_ties_broken_at_random"] == 1
    assert set(table["bleu1"]) >= {"HC", "HI", "HM", "MM", "mean"}
    assert table["bleu1"]["HC"] == 100.0 and table["bleu1"]["HI"] == 100.0
    assert table["length"]["HI"] == 0.0 and table["length"]["draws"] == 1  # reference-free: one draw
    assert table["bleu1"]["draws"] == 5
    again = get_benchmark("pascal50s").run(RunContext(tmp_path, MetricSuite(["bleu1", "length"])))
    assert again == table  # fixed seed: same draws, same tie labels


def _write_pascal_pairs(folder, sent1, sent2, votes):
    """pair_pascal.mat (categories HC HI HM MM) and a pascal50S.mat whose references are every pair's sent2."""
    n = len(sent1)
    new_input = np.zeros((1, n), dtype=[("name", "O"), ("sent1", "O"), ("sent2", "O")])
    result = np.zeros((1, n), dtype=[("result", "O")])
    for i in range(n):
        new_input[0, i] = (np.array([f"img{i}.jpg"]), np.array([sent1[i]]), np.array([sent2[i]]))
        result[0, i] = (np.array([votes[i]]),)
    sio.savemat(folder / "pair_pascal.mat", {"new_input": new_input, "result": result,
                                             "category": np.array([[1, 2, 3, 4][:n]], dtype=np.uint8),
                                             "new_data": np.zeros((n, 2), dtype=np.uint8)})
    refs = np.zeros((1, n), dtype=[("image", "O"), ("sent", "O")])
    for i in range(n):
        refs[0, i] = (np.array([f"img{i}.jpg"]), np.array([[np.array([sent2[i]])] * 5], dtype=object))
    sio.savemat(folder / "pascal50S.mat", {"refs": refs})


def test_pascal50s_uses_consensus_when_present(tmp_path):
    sent1 = ["a dog on grass", "a red car", "a man", "two cats sleeping"]
    sent2 = ["a kitchen with a big stove", "a car", "a boat on a lake", "two cats"]
    # pair_pascal.mat: every human prefers sent1; pascal50S.mat: every reference is sent2
    _write_pascal_pairs(tmp_path, sent1, sent2, [[1, 1, -1]] * 4)
    # consensus_pascal.mat, 48 rows per pair (reference, B, C, winner): pairs 0-2 prefer sent2 (30/18, 40/8 with
    # B and C swapped, 25/23), pair 3 prefers sent1 (48/0); the references are the consensus winner's sentence,
    # capitalised on odd rows (the same after PTB tokenization; pair 3's differ from pascal50S.mat's sent2).
    plan = [(False, 30, 0), (True, 40, 1), (False, 25, 2), (False, 0, 3)]  # (B=sent2?, rows choosing sent2, pair)
    rows = []
    for swapped, for_sent2, pair in plan:
        b, c = (sent2[pair], sent1[pair]) if swapped else (sent1[pair], sent2[pair])
        winner_text = sent1[pair] if pair == 3 else sent2[pair]
        for row in range(48):
            chosen_sent2 = row < for_sent2
            winner = (1 if swapped else 2) if chosen_sent2 else (2 if swapped else 1)
            rows.append([winner_text.capitalize() if row % 2 else winner_text, b, c, winner])
    sio.savemat(tmp_path / "consensus_pascal.mat", {"triplets": np.array(rows, dtype=object)})
    context = RunContext(tmp_path, MetricSuite(["bleu1", "length"]))
    table = get_benchmark("pascal50s").run(context)
    assert context.notes["labels"] == "consensus_pascal.mat"
    assert context.notes["human_ties_broken_at_random"] == 0
    # labels sent2, sent2, sent2, sent1; length prefers the longer caption: sent2, sent1, sent2, sent1
    assert {k: table["length"][k] for k in ("HC", "HI", "HM", "MM", "mean")} == {
        "HC": 100.0, "HI": 0.0, "HM": 100.0, "MM": 100.0, "mean": 75.0}
    # references drawn from the 48 consensus sentences, all equal to the label: BLEU-1 of the label is 1, the
    # other caption's is lower (pair 3 would be 0 with pascal50S.mat's sent2 references)
    assert {k: table["bleu1"][k] for k in ("HC", "HI", "HM", "MM", "mean")} == {
        "HC": 100.0, "HI": 100.0, "HM": 100.0, "MM": 100.0, "mean": 100.0}
    from pacs.eval.benchmarks.pascal50s import load_pascal50s

    data = load_pascal50s(tmp_path)
    assert data["pair_references"][3] == ["two cats sleeping", "Two cats sleeping"] * 24
    np.testing.assert_array_equal(data["votes"], [[18, 30], [8, 40], [23, 25], [48, 0]])
    # without the consensus file: pair_pascal.mat labels (sent1) and pascal50S.mat references (sent2)
    (tmp_path / "consensus_pascal.mat").unlink()
    fallback = RunContext(tmp_path, MetricSuite(["bleu1", "length"]))
    old = get_benchmark("pascal50s").run(fallback)
    assert fallback.notes["labels"] == "pair_pascal.mat"
    assert old["bleu1"]["mean"] == 0.0 and old["length"]["HI"] == 100.0


def test_pascal50s_consensus_errors_name_the_row(tmp_path, capsys):
    _write_pascal_pairs(tmp_path, ["a dog"], ["a cat"], [[1]])
    rows = [["a dog", "a dog", "a cat", 1]] * 47 + [["a dog", "a dog", "a cat", 3]]
    sio.savemat(tmp_path / "consensus_pascal.mat", {"triplets": np.array(rows, dtype=object)})
    assert run(["correlate", "pascal50s", "--data", str(tmp_path), "--metrics", "length"]) == 2
    assert "triplets row 47 has winner [3]" in capsys.readouterr().err
    rows = [["a dog", "a dog", "a bird", 2]] * 48
    sio.savemat(tmp_path / "consensus_pascal.mat", {"triplets": np.array(rows, dtype=object)})
    assert run(["correlate", "pascal50s", "--data", str(tmp_path), "--metrics", "length"]) == 2
    assert "triplets row 0 (pair 0) chose 'a bird'" in capsys.readouterr().err
    sio.savemat(tmp_path / "consensus_pascal.mat", {"triplets": np.array(rows[:47], dtype=object)})
    assert run(["correlate", "pascal50s", "--data", str(tmp_path), "--metrics", "length"]) == 2
    assert "47 triplets for 1 pairs" in capsys.readouterr().err


# ------------------------------------------------------------------------------ hallucination / robustness
def _success(right, foil):
    """Per item: 1 when the correct caption scores higher, 0.5 on a tie, 0 otherwise."""
    return np.array([1.0 if r > f else 0.5 if r == f else 0.0 for r, f in zip(right, foil)])


def _ptb(texts):
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tokenized = PTBTokenizer().tokenize({i: [{"caption": t}] for i, t in enumerate(texts)})
    return [tokenized[i][0] for i in range(len(texts))]


def test_nocaps_foil_and_hat_subsets(tmp_path, shared_data):
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider

    items = json.loads((shared_data / "hallucination" / "nocaps-val-foil.json").read_text())
    subset = [i for i in items if i["domain"] == "in-domain"][:10] + [i for i in items if i["domain"] != "in-domain"][:20]
    (tmp_path / "nocaps-val-foil.json").write_text(json.dumps(subset))
    table = get_benchmark("nocaps-foil").run(RunContext(tmp_path, MetricSuite(["cider", "length"]), bootstrap=40))
    assert set(table["cider"]) >= {"in-domain", "near-domain", "out-domain", "overall", "mean"}
    # expected values computed independently: length by word counts, CIDEr-D by pycocoevalcap over the distinct
    # (caption, references) rows the benchmark scores, accuracies and the bootstrap written out plainly
    rows = [(i["baseline"], tuple(i["references"])) for i in subset] + [(i["foil"], tuple(i["references"]))
                                                                        for i in subset]
    distinct = list(dict.fromkeys(rows))
    tokens = _ptb([c for c, _ in distinct] + [r for _, refs in distinct for r in refs])
    cand_tokens, ref_tokens = tokens[:len(distinct)], iter(tokens[len(distinct):])
    gts = {k: [next(ref_tokens) for _ in refs] for k, (_, refs) in enumerate(distinct)}
    _, cider = Cider().compute_score(gts, {k: [c] for k, c in enumerate(cand_tokens)})
    cider_of = {row: float(value) for row, value in zip(distinct, cider)}
    n = len(subset)
    success = {"cider": _success([cider_of[r] for r in rows[:n]], [cider_of[r] for r in rows[n:]]),
               "length": _success([len(i["baseline"].split()) for i in subset],
                                  [len(i["foil"].split()) for i in subset])}
    domains = np.array([i["domain"] for i in subset])
    for name, hits in success.items():
        per_domain = [100 * hits[domains == d].mean() for d in ("in-domain", "near-domain", "out-domain")]
        assert [table[name][d] for d in ("in-domain", "near-domain", "out-domain")] == pytest.approx(per_domain)
        assert table[name]["overall"] == pytest.approx(100 * hits.mean())
        assert table[name]["mean"] == pytest.approx(np.mean(per_domain))
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, n, size=n) for _ in range(40)]
    samples = {name: np.array([100 * hits[d].mean() for d in draws]) for name, hits in success.items()}
    best, other = sorted(success, key=lambda name: -table[name]["mean"])
    assert table[best]["p_value_vs_best"] is None
    assert table[other]["p_value_vs_best"] == pytest.approx((np.sum(samples[other] >= samples[best]) + 1) / 41)
    assert table["cider"]["mean_ci"] == pytest.approx(list(np.percentile(samples["cider"], [2.5, 97.5])))
    hat = json.loads((shared_data / "hallucination" / "hat-trainval.json").read_text())[:60]
    (tmp_path / "hat.json").write_text(json.dumps(hat))
    result = get_benchmark("hat").run(RunContext(tmp_path / "hat.json", MetricSuite(["bleu4", "length"])))
    assert result["bleu4"]["n"] == 60
    # AUROC by counting (not hallucinated, hallucinated) pairs, a tie half; BLEU-4 per caption by pycocoevalcap
    tokens = _ptb([h["caption"] for h in hat] + [r for h in hat for r in h["references"]])
    ref_tokens = iter(tokens[len(hat):])
    gts = {k: [next(ref_tokens) for _ in h["references"]] for k, h in enumerate(hat)}
    _, bleu = Bleu(4).compute_score(gts, {k: [c] for k, c in enumerate(tokens[:len(hat)])}, verbose=0)
    positive = [not h["contains_hallucination"] for h in hat]
    for name, values in (("bleu4", bleu[3]), ("length", [len(h["caption"].split()) for h in hat])):
        pos = [v for v, p in zip(values, positive) if p]
        neg = [v for v, p in zip(values, positive) if not p]
        expected = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg) / (len(pos) * len(neg))
        assert result[name]["auroc"] == pytest.approx(expected)


def test_nocaps_foil_bad_item(tmp_path, capsys):
    (tmp_path / "x.json").write_text(json.dumps([{"image_path": "a.jpg", "references": ["a"], "baseline": "a",
                                                   "foil": "b", "domain": "moon"}]))
    assert run(["correlate", "nocaps-foil", "--data", str(tmp_path / "x.json"), "--metrics", "bleu1"]) == 2
    assert "item 0 has domain 'moon'" in capsys.readouterr().err


def test_robustness_suite(tmp_path, shared_data):
    from pacs.eval.benchmarks.robustness import PERTURBATIONS

    out = tmp_path / "robust.json"
    assert run(["correlate", "robustness", "--data", str(shared_data / "flickr8k"), "--metrics", "cider,length",
                "--num-images", "40", "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert set(PERTURBATIONS) <= set(table["cider"])
    assert table["cider"]["random"] > 80 and table["cider"]["shuffle"] > 80
    assert table["length"]["padding"] == 0.0 and table["length"]["truncation"] == 100.0


def test_robustness_perturbations_hand_checked():
    from pacs.eval.benchmarks.robustness import Perturber  # lemminflect is a base dependency: no skip

    originals = ["a dog runs on the grass", "a man rides a red bike", "two cats sleep on a sofa",
                 "a child plays with a ball", "a woman reads a book"]
    pools = [[o, o + " today"] for o in originals]
    perturber = Perturber(originals, pools, np.random.default_rng(0))
    assert perturber.truncation(0) == "a dog runs on the"
    assert perturber.padding(4) == "a woman reads a book in the background setting"
    assert perturber.random(0) != originals[0]
    assert sorted(perturber.shuffle(1).split()) == sorted(originals[1].split()) and perturber.shuffle(1) != originals[1]
    substituted = perturber.substitution(2).split()
    assert len(substituted) == 6 and substituted != originals[2].split()
    assert substituted[3:5] == ["on", "a"]  # function words are never substituted
    assert [perturber.tag(w) for w in ["dog", "red", "running"]] == ["NOUN", "ADJ", "VERB"]
    assert perturber.tag("the") is None and perturber.tag("on") is None


# ------------------------------------------------------------------------------------------------ registry
def test_benchmark_registry_decorator_and_names():
    @register_benchmark("toy-test-benchmark")
    class Toy(Benchmark):
        def run(self, context):
            return {"ok": True}

    try:
        assert get_benchmark("TOY-test-benchmark").run(None) == {"ok": True}
        assert BENCHMARKS["toy-test-benchmark"].name == "toy-test-benchmark"
    finally:
        BENCHMARKS.pop("toy-test-benchmark")
    for name in ("flickr8k-expert", "flickr8k-cf", "composite", "pascal50s", "foil", "nocaps-foil", "hat",
                 "robustness"):
        assert get_benchmark(name).name == name


# ------------------------------------------------------------------------------------------------ evaluate
def test_evaluate_table(tmp_path, capsys):
    pytest.importorskip("harper")
    candidates = [{"image_id": "1", "caption": "A dog runs on the grass."},
                  {"image_id": "2", "caption": "a man riding a elephant on a"},
                  {"image_id": "3", "caption": ""}]
    references = {"1": ["A dog running on grass.", "A brown dog outside."],
                  "2": ["A man rides an elephant.", "A person on an elephant."],
                  "3": ["A red car."]}
    (tmp_path / "c.json").write_text(json.dumps(candidates))
    (tmp_path / "r.json").write_text(json.dumps(references))
    out = tmp_path / "eval.json"
    assert run(["evaluate", "--candidates", str(tmp_path / "c.json"), "--references", str(tmp_path / "r.json"),
                "--metrics", "bleu1,cider,rep1,incorrect,grammar,length", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["metrics"]["incorrect"] == pytest.approx(100 / 3)
    assert result["metrics"]["grammar"] == pytest.approx(100 / 3)  # "a elephant"
    assert result["grammar_backend"].startswith("harper") and result["n_empty"] == 1
    assert result["metrics"]["rep1"] == pytest.approx(2 / 3)  # "a" x3 in caption 2 -> 2 repeats
    assert "harper" in capsys.readouterr().out


def test_evaluate_with_contrastive_metrics(tmp_path, shared_data, tiny_checkpoint):
    images = sorted((shared_data / "flickr8k" / "images").glob("*.jpg"))[:2]
    candidates = {p.name: "a dog runs on the grass" for p in images}
    references = {p.name: ["a dog on grass", "a brown dog"] for p in images}
    (tmp_path / "c.json").write_text(json.dumps(candidates))
    (tmp_path / "r.json").write_text(json.dumps(references))
    out = tmp_path / "eval.json"
    assert run(["evaluate", "--candidates", str(tmp_path / "c.json"), "--references", str(tmp_path / "r.json"),
                "--metrics", "clip-s,ref-clip-s,cider", "--images", str(shared_data / "flickr8k" / "images"),
                "--checkpoint", str(tiny_checkpoint), "--out", str(out)]) == 0
    metrics = json.loads(out.read_text())["metrics"]
    # expected: the same weights through open_clip's plain encode_image / encode_text (no pacs Scorer), CLIP-S =
    # 2.5 max(cos(image, "A photo depicts " + caption), 0) and RefCLIP-S its harmonic mean with max_r cos(caption,
    # reference), averaged over the two images
    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    from pacs.metric.models.preprocess import open_image

    backbone = build_backbone_from_config(tiny_clip_config(), seed=0)
    with torch.no_grad():
        pixels = torch.stack([backbone.preprocess(open_image(p)) for p in images])
        image = torch.nn.functional.normalize(backbone.model.encode_image(pixels).float(), dim=-1)
        texts = ["A photo depicts a dog runs on the grass", "A photo depicts a dog on grass",
                 "A photo depicts a brown dog"]
        text = torch.nn.functional.normalize(backbone.model.encode_text(backbone.tokenize(texts)).float(), dim=-1)
    clip = 2.5 * torch.clamp(image @ text[0], min=0)
    ref = (text[1:] @ text[0]).max()
    refclip = 2 * clip * ref / (clip + ref)
    assert metrics["clip-s"] == pytest.approx(float(clip.mean()), abs=1e-5)
    assert metrics["ref-clip-s"] == pytest.approx(float(refclip.mean()), abs=1e-5)


def test_evaluate_unresolved_candidate_id(tmp_path, capsys):
    (tmp_path / "c.json").write_text(json.dumps({"9": "a dog"}))
    (tmp_path / "r.json").write_text(json.dumps({"1": ["a dog"]}))
    assert run(["evaluate", "--candidates", str(tmp_path / "c.json"), "--references", str(tmp_path / "r.json"),
                "--metrics", "bleu1"]) == 2
    assert "'9'" in capsys.readouterr().err


def test_metric_names_accept_the_papers_spellings():
    from pacs.eval.registry import parse_metric_list

    assert parse_metric_list("BLEU-1,bleu_4,ROUGE-L,CIDEr-D,Rep-2,%Incorrect,PAC-S++") == [
        "bleu1", "bleu4", "rouge", "cider", "rep2", "incorrect", "pac-s++"]
    assert parse_metric_list("bleu-4,bleu4") == ["bleu4"]  # the same metric once
