"""The one-import public API of `pacs`, `pacs.metric`, `pacs.eval` and `pacs.rewards`.

- importing the package roots loads no model stack (every root-level name is lazy, PEP 562);
- every exported name carries a docstring example, and every example passes (run here as a doctest);
- `pacs.metric.score` equals `Scorer.score` built by hand, and the official code's values on fixture A;
- `pacs.eval.correlate` returns exactly the table `pacs correlate --out` writes.
"""
from __future__ import annotations

import doctest
import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pacs import cli as pacs_cli
from pacs.metric.common.errors import InputError

ROOTS = ("pacs", "pacs.metric", "pacs.eval", "pacs.rewards")
MODEL_STACK = ("open_clip", "torchvision", "transformers")
TORCHMETRICS_NAMES = {"CLIPScore", "PACScore", "PACScorePlusPlus"}
TOLERANCE = 1e-4  # the parity tests' tolerance against the official code's values


def test_package_roots_import_no_model_stack_and_their_names_are_lazy(shared):
    """In one fresh interpreter: the roots, then their cheap names, then a text-only `correlate`."""
    probe = f"""
import json, os, sys
os.environ["PACS_SHARED"] = {str(shared)!r}
stack = lambda: [m for m in {MODEL_STACK!r} if m in sys.modules]
steps = {{}}
import pacs, pacs.metric, pacs.eval, pacs.rewards, pacs.metric.common.errors
steps["roots"] = stack()
steps["lazy"] = [m for m in ("pacs.metric.scoring.api", "pacs.eval.correlate_run", "pacs.rewards.registry") if m in sys.modules]
from pacs.eval import cider_d, cider_df, compute_text_metrics, correlate
from pacs.rewards import build_reward, register_reward, reward_names
from pacs.metric import clip_score, ref_score, reference_term, score, MetricScores
steps["names"] = stack()
steps["loaded"] = [m for m in ("pacs.metric.scoring.api", "pacs.eval.correlate_run", "pacs.rewards.registry") if m in sys.modules]
assert correlate("hat", metrics="cider")["cider"]["n"] == 400
steps["correlate"] = stack()
print(json.dumps(steps))
"""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    steps = json.loads(result.stdout.strip().splitlines()[-1])
    assert steps == {"roots": [], "lazy": [], "names": [], "loaded": ["pacs.metric.scoring.api", "pacs.eval.correlate_run", "pacs.rewards.registry"],
                     "correlate": []}


@pytest.mark.parametrize("root", ROOTS)
def test_all_and_dir_list_the_public_names(root):
    module = importlib.import_module(root)
    assert module.__all__ == sorted(set(module.__all__)) == sorted(module._PUBLIC)  # the lazy table, no more
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = module.not_a_name


def _public_names() -> list[tuple[str, str]]:
    return [(root, name) for root in ROOTS for name in importlib.import_module(root).__all__]


@pytest.mark.parametrize("root, name", _public_names())
def test_every_public_name_has_a_passing_docstring_example(root, name, shared, tmp_path, monkeypatch,
                                                           registries_restored):  # examples may register names
    if name in TORCHMETRICS_NAMES:
        pytest.importorskip("torchmetrics")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PACS_SHARED", str(shared))
    obj = getattr(importlib.import_module(root), name)
    tests = doctest.DocTestFinder(recurse=False).find(obj, f"{root}.{name}", globs={})
    assert sum(len(test.examples) for test in tests) > 0, f"{root}.{name} has no docstring example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


# ---------------------------------------------------------------------------------------------- pacs.metric.score
@pytest.fixture(scope="module")
def fixture_a(shared) -> dict:
    """Official-format fixture A (a tiny PAC-S++ file) with its instances and the official code's values."""
    folder = shared / "fixtures" / "pacscore"
    expected = json.loads((folder / "A" / "expected.json").read_text())
    instances = expected["instances"]
    return {"checkpoint": str(folder / "A" / "PAC++_tiny_A.pth"), "arch": str(folder / "A" / "arch.json"),
            "images": [str(folder / "inputs" / "images" / i["image"]) for i in instances],
            "captions": [i["candidate"] for i in instances], "references": [i["references"] for i in instances],
            "instances": instances}


def test_score_equals_the_scorer_and_the_official_values(fixture_a):
    from pacs.metric import Scorer, load_backbone, score

    args = (fixture_a["images"], fixture_a["captions"], fixture_a["references"])
    result = score(*args, checkpoint=fixture_a["checkpoint"], arch=fixture_a["arch"])  # metric="ref-pac-s++"
    backbone = load_backbone(checkpoint=fixture_a["checkpoint"], arch=fixture_a["arch"])
    by_hand = Scorer(backbone, w=2.5, progress=False).score(*args)
    assert result.metric == "ref-pac-s++" and result.w == 2.5 and len(result) == len(fixture_a["instances"])
    np.testing.assert_array_equal(result.scores, by_hand.scores)
    assert result.mean == pytest.approx(float(np.mean(by_hand.scores)), abs=1e-7)
    official = np.array([i["ref_pac_s_w2.5"] for i in fixture_a["instances"]])
    assert np.abs(result.scores - official).max() < TOLERANCE
    free = score(fixture_a["images"], fixture_a["captions"], metric="pac-s++", w=2.0, backbone=backbone)
    assert np.abs(free.scores - [i["pac_s"] for i in fixture_a["instances"]]).max() < TOLERANCE


def test_score_reuses_a_loaded_scorer_and_backbone(fixture_a):
    from pacs.metric import Scorer, load_backbone, score

    backbone = load_backbone(checkpoint=fixture_a["checkpoint"], arch=fixture_a["arch"])
    scorer = Scorer(backbone, progress=False)
    first = score(fixture_a["images"], fixture_a["captions"], metric="pac-s++", backbone=scorer)
    encoded = scorer.images_encoded
    again = score(fixture_a["images"], fixture_a["captions"], metric="pac-s++", backbone=scorer)
    assert scorer.images_encoded == encoded == len(set(fixture_a["images"]))  # no image encoded twice
    np.testing.assert_array_equal(first.scores, again.scores)
    from_backbone = score(fixture_a["images"], fixture_a["captions"], metric="pac-s++", backbone=backbone)
    np.testing.assert_array_equal(first.scores, from_backbone.scores)


def test_score_refuses_bad_input_with_one_clear_error(fixture_a):
    from pacs.metric import load_backbone, score
    from pacs.metric.models.families import FamilyMismatchError

    tiny = load_backbone("tiny-random")
    images, captions = fixture_a["images"][:2], fixture_a["captions"][:2]
    with pytest.raises(InputError, match="ref-pac-s\\+\\+ is reference-based: pass references="):
        score(images, captions, backbone=tiny, allow_family_mismatch=True)
    with pytest.raises(InputError, match="2 images but 1 captions"):
        score(images, captions[:1], metric="clip-s", backbone=tiny)
    with pytest.raises(InputError, match="not a single string"):
        score(images[:1], captions[0], metric="clip-s", backbone=tiny)
    with pytest.raises(InputError, match="references of caption #1 must be a list"):
        score(images, captions, [["a dog"], "a dog"], metric="ref-clip-s", backbone=tiny)
    with pytest.raises(InputError, match="unknown metric 'bleu4'"):
        score(images, captions, metric="bleu4", backbone=tiny)
    with pytest.raises(FamilyMismatchError, match="pac-s\\+\\+ needs a pac-s\\+\\+ model but tiny-random is a clip"):
        score(images, captions, metric="pac-s++", backbone=tiny)
    with pytest.raises(InputError, match="cannot be combined with an already-loaded Backbone"):
        score(images, captions, metric="clip-s", backbone=tiny, checkpoint=fixture_a["checkpoint"])


# ------------------------------------------------------------------------------------------- pacs.eval.correlate
def test_correlate_returns_the_table_pacs_correlate_json_writes(shared_data, tmp_path, capsys):
    from pacs.eval import correlate

    written = tmp_path / "expert.json"
    argv = ["correlate", "flickr8k-expert", "--data", str(shared_data / "flickr8k"), "--metrics", "bleu1,cider",
            "--out", str(written)]
    assert pacs_cli.main(argv) == 0
    printed = capsys.readouterr().out
    table = correlate("flickr8k-expert", metrics=["bleu1", "cider"])  # data=None: $PACS_SHARED's copy
    assert table == json.loads(written.read_text())
    lines = {line.split()[0]: line.split()[1:] for line in printed.splitlines() if line.strip()}
    for metric in ("bleu1", "cider"):  # the CLI prints the numbers it wrote
        row = table[metric]
        assert lines[metric] == [f"{row['tau_b']:.3f}", f"{row['tau_c']:.3f}", str(row["n"])]


def test_correlate_records_the_data_folder_it_read_whichever_way_it_was_reached(shared_data, tmp_path):
    """The CLI given a link to the data and the API given the folder itself record the same resolved folder (they
    differed in 0.7 when $PACS_SHARED was reached through a link)."""
    from pacs.eval import correlate

    link = tmp_path / "flickr8k-link"
    link.symlink_to(shared_data / "flickr8k", target_is_directory=True)
    written = tmp_path / "expert.json"
    assert pacs_cli.main(["correlate", "flickr8k-expert", "--data", str(link), "--metrics", "bleu1",
                          "--out", str(written)]) == 0
    by_cli = json.loads(written.read_text())["provenance"]["config"]["data"]
    by_api = correlate("flickr8k-expert", data=shared_data / "flickr8k", metrics=["bleu1"])["provenance"]
    assert by_cli == by_api["config"]["data"] == os.path.realpath(shared_data / "flickr8k")


def test_correlate_options_are_the_cli_options(shared_data):
    from pacs.eval import correlate
    from pacs.eval.correlate_run import correlation_options

    request = correlation_options("pascal50s", shared_data / "pascal50s", "length", draws=2, seed=3)
    assert (request.options.draws, request.options.num_refs, request.seed, request.bootstrap,
            request.model.lora_mode) == (2, 5, 3, 0, "official")
    with pytest.raises(InputError, match="unknown correlate option 'num_refs'"):  # pascal50s's, not hat's
        correlate("hat", metrics="cider", num_refs=3)
    with pytest.raises(InputError, match="unknown correlate option 'bootstraps' \\(did you mean 'bootstrap'\\?\\)"):
        correlate("hat", metrics="cider", bootstraps=10)
    with pytest.raises(InputError, match="pass data= for 'foil'"):
        correlate("foil", metrics="cider")
    with pytest.raises(InputError, match="pass metrics="):
        correlate("hat")



def test_the_root_names_are_the_subpackages_own_objects():
    """`pacs.score` is `pacs.metric.score`, `pacs.cider_d` is `pacs.eval.cider_d`, ... (one object, two spellings)."""
    import pacs

    homes = {"score": "pacs.metric", "load_backbone": "pacs.metric", "cider_d": "pacs.eval", "correlate": "pacs.eval",
             "evaluate_systems": "pacs.eval", "build_reward": "pacs.rewards"}
    assert sorted(homes) == pacs.__all__
    for name, home in homes.items():
        assert getattr(pacs, name) is getattr(importlib.import_module(home), name), name
