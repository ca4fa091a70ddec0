"""Ids that meet: `pacs caption --ids name` writes Flickr8k's ids, and an evaluation whose candidate ids match no
reference but would under another id rule says which rule to pass."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from pacs.cli import main
from pacs.metric.scoring.image_lookup import id_rule_hint, ids_for_files


def _evaluate(tmp_path: Path, candidates: dict, references: dict, capsys) -> tuple[int, str]:
    (tmp_path / "c.json").write_text(json.dumps(candidates))
    (tmp_path / "r.json").write_text(json.dumps(references))
    code = main(["evaluate", "--candidates", str(tmp_path / "c.json"), "--references", str(tmp_path / "r.json"),
                 "--metrics", "bleu1", "--out", str(tmp_path / "out.json")])
    return code, capsys.readouterr().err


def test_flickr8k_stems_against_file_names_name_the_rule(tmp_path, capsys):
    stems = {"1167669558_87a8a467d6": "a dog runs", "1000268201_693b08cb0e": "a child climbs"}
    references = {f"{key}.jpg": ["a dog running", "a child on stairs"] for key in stems}
    code, err = _evaluate(tmp_path, stems, references, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "no references for candidate image id(s) '1167669558_87a8a467d6'" in err
    assert ("the references name images by file name, the candidates by file stem: caption with "
            "`pacs caption --ids name` (e.g. '1167669558_87a8a467d6' -> '1167669558_87a8a467d6.jpg')") in err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("candidates, references, advice", [
    (["a.jpg", "b.jpg"], ["a", "b"], "caption with `pacs caption --ids stem` (e.g. 'a.jpg' -> 'a')"),
    (["COCO_val2014_000000391895", "COCO_val2014_000000000042"], ["391895", "42"],
     "caption with `pacs caption --ids coco` (e.g. 'COCO_val2014_000000391895' -> '391895')"),
    (["000123", "000042"], ["123", "42"], "the ids differ in their zero padding"),
    (["x", "y"], ["p.jpg", "q.jpg"], None),  # no rule makes them meet: no advice
])
def test_each_rule_is_named_only_when_it_makes_the_ids_meet(candidates, references, advice):
    hint = id_rule_hint(candidates, references)
    assert (hint == "") if advice is None else (advice in hint)


def test_ids_name_keeps_the_file_name(tmp_path):
    files = []
    for name in ("1000268201_693b08cb0e.jpg", "b.png"):
        Image.new("RGB", (4, 4)).save(tmp_path / name)
        files.append(tmp_path / name)
    assert ids_for_files(files, "name") == {"1000268201_693b08cb0e.jpg": files[0], "b.png": files[1]}
