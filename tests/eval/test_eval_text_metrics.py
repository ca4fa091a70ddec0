"""PTB tokenization and the pycocoevalcap wrappers; SPICE command line and missing-jar message; Java checks."""
from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

from pacs.eval import java_runtime, spice
from pacs.eval.text_metrics import compute_text_metrics
from pacs.eval.tokenize import ptb_tokenize
from pacs.metric.common.errors import InputError, MissingResourceError, PacsError

CANDIDATES = ["A dog runs on the grass.", "Two kids, playing soccer!", "a man riding a red bike", "",
              "A dog runs on the grass."]
REFERENCES = [["A brown dog is running on grass.", "The dog runs through a field."],
              ["Children play football in a park.", "Two boys are playing soccer."],
              ["A man rides his bicycle.", "A cyclist on a red bike.", "man on a bike"],
              ["An empty street."],
              ["A brown dog is running on grass.", "The dog runs through a field."]]


@pytest.mark.parametrize("tokenizer", ["python", "java"])
def test_ptb_tokenize_matches_pycocoevalcap(tokenizer):
    captions = ["A man, on a \"bike\".", "Hello -- world!", "", "It's (really) nice...", "two\nlines"]
    ours = ptb_tokenize(captions, tokenizer)
    theirs = PTBTokenizer().tokenize({i: [{"caption": c}] for i, c in enumerate(captions)})
    assert ours == [theirs[i][0] for i in range(len(captions))]
    assert ours[0] == "a man on a bike"


def test_text_metrics_equal_pycocoevalcap_per_caption():
    result = compute_text_metrics(CANDIDATES, REFERENCES, ["bleu1", "bleu4", "rouge", "cider"])
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": r} for r in refs] for i, refs in enumerate(REFERENCES)})
    res = tokenizer.tokenize({i: [{"caption": c}] for i, c in enumerate(CANDIDATES)})
    _, bleu = Bleu(4).compute_score(gts, res, verbose=0)
    _, rouge = Rouge().compute_score(gts, res)
    np.testing.assert_allclose(result["bleu1"].per_caption, bleu[0], atol=1e-12)
    np.testing.assert_allclose(result["bleu4"].per_caption, bleu[3], atol=1e-12)
    np.testing.assert_allclose(result["rouge"].per_caption, rouge, atol=1e-12)
    assert result["cider"].per_caption[0] == result["cider"].per_caption[4]  # duplicate row, same value
    assert result["bleu1"].per_caption[3] == 0.0  # the empty candidate is scored


def test_spice_reported_unavailable_without_jars(monkeypatch, tmp_path):
    """METEOR itself is checked by the Flickr8k-Expert reproduction (its JVM start costs ~20 s)."""
    monkeypatch.setenv(spice.CORENLP_ENV, str(tmp_path))
    result = compute_text_metrics(CANDIDATES[:3], REFERENCES[:3], ["bleu1", "spice"])
    assert (result["bleu1"].per_caption > 0).all()
    assert not result["spice"].available and np.isnan(result["spice"].per_caption).all()
    assert "stanford-corenlp-3.6.0.jar" in result["spice"].reason and "--spice-corenlp" in result["spice"].reason


def _fake_spice(monkeypatch, tmp_path, score_of):
    """Make `compute_spice` run a fake SPICE that writes `score_of(candidate)` (None: no item) as each F-score."""
    tmp_path.mkdir(exist_ok=True)
    for jar in spice.CORENLP_JARS:
        (tmp_path / jar).write_bytes(b"")
    monkeypatch.setenv(spice.CORENLP_ENV, str(tmp_path))
    monkeypatch.setattr(spice, "java_major_version", lambda java: 17)
    calls = []
    real_run = subprocess.run

    def fake_run(command, **kwargs):
        if "edu.anu.spice.SpiceScorer" not in command:  # the PTB tokenizer
            return real_run(command, **kwargs)
        items = json.loads(Path(command[command.index("edu.anu.spice.SpiceScorer") + 1]).read_text())
        calls.append([item["test"] for item in items])
        out = [{"image_id": item["image_id"], "test": item["test"], "scores": {"All": {"f": score_of(item["test"])}}}
               for item in items if score_of(item["test"]) != "no item"]
        Path(command[command.index("-out") + 1]).write_text(json.dumps(out))  # NaN is written as NaN
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(spice.subprocess, "run", fake_run)
    return calls


def test_spice_failures_are_counted_and_reported(monkeypatch, tmp_path, caplog):
    scores = {"a dog runs": 0.3, "fails here": None, "two kids play soccer": 0.4, "nan case": float("nan"),
              "dropped": "no item"}
    calls = _fake_spice(monkeypatch, tmp_path, scores.get)
    candidates = ["a dog runs", "fails here", "two kids play soccer", "a dog runs", "nan case", "dropped"]
    references = [["a dog"]] * len(candidates)
    with caplog.at_level(logging.WARNING, logger="pacs.eval.spice"):
        result = compute_text_metrics(candidates, references, ["spice"], tokenized=True)["spice"]
    assert calls == [["a dog runs", "fails here", "two kids play soccer", "nan case", "dropped"]]  # distinct pairs
    # rows 1 (null F), 4 (NaN F) and 5 (no output item) failed; the corpus value is over the distinct successes
    assert result.failed == (1, 4, 5) and result.n_failed == 3 and result.available
    assert result.corpus == pytest.approx((0.3 + 0.4) / 2)
    np.testing.assert_array_equal(np.isnan(result.per_caption), [False, True, False, False, True, True])
    assert result.per_caption[3] == pytest.approx(0.3)
    assert "SPICE failed on 3 of 5 caption(s) (items 1, 3, 4)" in caplog.text


def test_spice_failing_on_every_caption_is_an_error(monkeypatch, tmp_path):
    _fake_spice(monkeypatch, tmp_path, lambda caption: None)
    with pytest.raises(PacsError, match="SPICE failed on all 2 captions"):
        compute_text_metrics(["a dog", "a cat"], [["a dog"], ["a cat"]], ["spice"], tokenized=True)


def test_evaluate_reports_spice_failures(monkeypatch, tmp_path, capsys):
    from pacs import cli as pacs_cli
    _fake_spice(monkeypatch, tmp_path / "jars", {"a dog runs": 0.5, "a cat sleeps": None}.get)
    (tmp_path / "c.json").write_text(json.dumps({"1": "a dog runs", "2": "a cat sleeps", "3": "a dog runs"}))
    (tmp_path / "r.json").write_text(json.dumps({"1": ["a dog"], "2": ["a cat"], "3": ["a dog"]}))
    out = tmp_path / "eval.json"
    assert pacs_cli.main(["evaluate", "--candidates", str(tmp_path / "c.json"), "--references",
                          str(tmp_path / "r.json"), "--metrics", "spice", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["metrics"]["spice"] == pytest.approx(0.5)
    assert result["failed"] == {"spice": {"n": 1, "items": ["2"]}}
    assert "failed on 1 of 3 captions" in capsys.readouterr().out


def test_parse_spice_output_by_hand():
    items = [{"image_id": 2, "scores": {"All": {"f": 0.25}}}, {"image_id": 0, "scores": {"All": {"f": 0.75}}},
             {"image_id": 1, "scores": {"All": {"f": "NaN"}}}]
    result = spice.parse_spice_output(items, 4)
    assert result.failed == (1, 3) and result.n_failed == 2
    assert result.corpus == pytest.approx(0.5)
    with pytest.raises(PacsError, match="image_id"):
        spice.parse_spice_output([{"scores": {}}], 1)


def test_spice_missing_jar_message(tmp_path):
    with pytest.raises(spice.SpiceUnavailable) as error:
        spice.find_corenlp(tmp_path)
    message = str(error.value)
    assert str(tmp_path) in message and "stanford-corenlp-3.6.0-models.jar" in message
    assert spice.CORENLP_URL in message and spice.CORENLP_ENV in message


def test_spice_found_in_custom_folder(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    for jar in spice.CORENLP_JARS:
        (tmp_path / jar).write_bytes(b"")
    assert spice.find_corenlp(tmp_path) == tmp_path


def test_spice_command_line_for_java_16_and_later(tmp_path):
    modern = spice.spice_command("java", 17, tmp_path, "in.json", "out.json", cache_dir="cache")
    assert "-cache" not in modern  # the LMDB cache step crashes on Java >= 16
    assert modern.count("--add-opens") == len(spice.JAVA16_OPENS)
    assert "java.base/java.lang=ALL-UNNAMED" in modern
    classpath = modern[modern.index("-cp") + 1]
    assert str(tmp_path / "stanford-corenlp-3.6.0.jar") in classpath and str(spice.SPICE_JAR) in classpath
    assert modern[modern.index("-cp") + 2] == "edu.anu.spice.SpiceScorer"
    legacy = spice.spice_command("java", 8, tmp_path, "in.json", "out.json", cache_dir="cache")
    assert "--add-opens" not in legacy and legacy[legacy.index("-cache") + 1] == "cache"


@pytest.mark.parametrize("text, major", [('openjdk version "17.0.15" 2025-04-15', 17),
                                         ('java version "1.8.0_101"', 8), ('openjdk version "21" 2023', 21)])
def test_parse_java_version(text, major):
    assert java_runtime.parse_java_version(text) == major


def test_java_missing_names_the_metrics(monkeypatch):
    monkeypatch.setattr(java_runtime, "java_executable", lambda: None)
    with pytest.raises(MissingResourceError, match="meteor, spice need it"):
        java_runtime.require_java(["meteor", "spice"])


def test_text_metric_bad_input():
    with pytest.raises(InputError, match="2 candidates but 1 reference"):
        compute_text_metrics(["a", "b"], [["a"]], ["bleu1"])
    with pytest.raises(InputError, match="candidate 0 has no reference"):
        compute_text_metrics(["a"], [[]], ["bleu1"])
    with pytest.raises(InputError, match="unknown metric 'blue'"):
        compute_text_metrics(["a"], [["a"]], ["blue"])
    with pytest.raises(InputError, match="clip-s is not a text metric"):
        compute_text_metrics(["a"], [["a"]], ["clip-s"])


def _flickr8k_pairs(shared_data: Path, n_images: int) -> tuple[list[str], list[list[str]]]:
    """Real captions: per Flickr8k image (sorted names), caption 0 as the candidate, captions 1-4 as references."""
    by_image: dict[str, list[str]] = {}
    for line in (shared_data / "flickr8k" / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, _, caption = line.partition("\t")
        by_image.setdefault(key.split("#")[0], []).append(caption)
    keys = sorted(by_image)[:n_images]
    return [by_image[k][0] for k in keys], [by_image[k][1:5] for k in keys]


def test_session_starts_java_once_per_program_and_equals_pycocoevalcap(shared_data):
    """Two evaluations in one TextMetricSession (all images, then a subset, as the per-domain rows do): one METEOR
    process in all (the PTB tokenisation is the Python one), values equal to pycocoevalcap's own classes on its own
    tokens (its Java tokenizer)."""
    from pycocoevalcap.meteor.meteor import Meteor

    from pacs.eval.text_metrics import TextMetricSession

    candidates, references = _flickr8k_pairs(shared_data, 60)
    metrics = ["bleu4", "meteor", "rouge", "cider"]
    with TextMetricSession() as session:
        whole = compute_text_metrics(candidates, references, metrics)
        part = compute_text_metrics(candidates[10:30], references[10:30], metrics)
        assert session.java_starts == 1  # METEOR, reused by the subset; no Java for the PTB tokenisation

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": r} for r in refs] for i, refs in enumerate(references)})
    res = tokenizer.tokenize({i: [{"caption": c}] for i, c in enumerate(candidates)})
    subset = list(range(10, 30))
    meteor = Meteor()
    try:
        meteor_all = meteor.compute_score(gts, res)
        meteor_part = meteor.compute_score({i: gts[i] for i in subset}, {i: res[i] for i in subset})
    finally:
        del meteor
    bleu_all = Bleu(4).compute_score(gts, res, verbose=0)
    rouge_part = Rouge().compute_score({i: gts[i] for i in subset}, {i: res[i] for i in subset})
    np.testing.assert_allclose(whole["meteor"].per_caption, meteor_all[1], atol=1e-12)
    assert abs(whole["meteor"].corpus - meteor_all[0]) <= 1e-12
    np.testing.assert_allclose(part["meteor"].per_caption, meteor_part[1], atol=1e-12)
    assert abs(part["meteor"].corpus - meteor_part[0]) <= 1e-12
    np.testing.assert_allclose(whole["bleu4"].per_caption, bleu_all[1][3], atol=1e-12)
    np.testing.assert_allclose(part["rouge"].per_caption, rouge_part[1], atol=1e-12)
    assert whole["meteor"].per_caption[3] > 0 and len(set(whole["meteor"].per_caption.round(6))) > 30
