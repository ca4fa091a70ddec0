"""`pacs evaluate` without Java: BLEU, ROUGE-L and CIDEr-D are scored (Python PTB tokenizer), METEOR / SPICE
and the Java tokenizer are refused at load in one line (the Java lookup is faked through shutil.which)."""
from __future__ import annotations

import json


def _write_inputs(tmp_path):
    """A two-image candidate file and its references."""
    candidates, references = tmp_path / "c.json", tmp_path / "r.json"
    candidates.write_text(json.dumps({"1": "A dog runs on the grass.", "2": "A man rides a horse."}))
    references.write_text(json.dumps({"1": ["a dog running on grass", "the dog is in a field"],
                                      "2": ["a man on a horse", "a rider and his horse"]}))
    return candidates, references


def test_evaluate_refuses_meteor_and_spice_at_load_without_java(no_java, tmp_path, capsys, monkeypatch):
    from pacs import cli as pacs_cli
    from pacs.eval import system_scoring

    candidates, references = _write_inputs(tmp_path)
    out = tmp_path / "eval.json"

    def never(*args, **kwargs):
        raise AssertionError("nothing may be scored before the refusal")

    monkeypatch.setattr(system_scoring, "score_rows", never)
    code = pacs_cli.main(["evaluate", "--candidates", str(candidates), "--references", str(references),
                          "--metrics", "bleu4,meteor,spice", "--out", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not out.exists() and len(lines) == 1
    assert "metric meteor needs Java" in lines[0] and "metric spice needs Java" in lines[0]
    assert "install a JRE" in lines[0] and "drop meteor" in lines[0]
    code = pacs_cli.main(["evaluate", "--candidates", str(candidates), "--references", str(references),
                          "--metrics", "bleu4", "--ptb-tokenizer", "java"])
    assert code == 2 and "--ptb-tokenizer java needs Java" in capsys.readouterr().err


def test_evaluate_scores_bleu_rouge_cider_without_java(no_java, tmp_path, capsys):
    from pacs import cli as pacs_cli
    candidates, references = _write_inputs(tmp_path)
    out = tmp_path / "eval.json"
    assert pacs_cli.main(["evaluate", "--candidates", str(candidates), "--references", str(references),
                          "--metrics", "bleu1,rouge,cider", "--out", str(out)]) == 0
    values = json.loads(out.read_text())["metrics"]
    # pycocoevalcap's corpus values for these pairs (its Java tokenizer: pacs.eval.text_metrics' doctest)
    assert round(values["bleu1"], 4) == 0.8182 and round(values["rouge"], 4) == 0.7697
    assert round(values["cider"], 4) == 1.7764
