"""The offline Flickr8k recipe (recipes/configs/flickr8k_tiny.yaml) end to end on the shared data, and `pacs report`
on every kind of run directory pacs writes (a folder without results is refused, nothing written)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from report_checks import check_story_report

from pacs.cli import main

torch.set_num_threads(1)

# the shipped recipe, cut to CI size (the same stages and models; fewer images and steps)
SMALL = ["data.max_train_images=160", "xe.max_steps=40", "xe.eval_every=20", "xe.save_every=20",
         "xe.schedule={warmup_steps: 5, constant_until: 30, decay_until: 40, peak_lr: 2.0e-3, final_lr: 1.0e-4}",
         "scst.max_steps=4", "scst.save_every=2", "scst.monitor_every=2", "evaluation.max_images=40",
         "evaluation.bootstrap=50"]


def _cider(captions: dict[str, str], token_file: Path) -> float:
    """CIDEr-D ×100 of `captions` against the Flickr8k references, by pycocoevalcap (PTB tokenizer, Java)."""
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    references: dict[str, list[str]] = {}
    for line in token_file.read_text(encoding="utf-8").splitlines():
        key, _, caption = line.partition("\t")
        references.setdefault(Path(key.split("#")[0]).stem, []).append(caption.strip())
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": r} for r in references[i]] for i in captions})
    res = tokenizer.tokenize({i: [{"caption": c}] for i, c in captions.items()})
    return 100 * Cider().compute_score(gts, res)[0]


@pytest.mark.slow
def test_flickr8k_tiny_recipe_trains_evaluates_prints_and_reports(tmp_path, shared_data, capsys):
    run = tmp_path / "run"
    assert main(["train", "--config", "flickr8k_tiny", f"run_dir={run}", *SMALL]) == 0
    out = capsys.readouterr().out
    table = json.loads((run / "eval" / "results.json").read_text(encoding="utf-8"))
    assert [(row["model"], row["test_set"]) for row in table["rows"]] == [
        ("xe", "flickr8k"), ("cider", "flickr8k"), ("pac-s++", "flickr8k")]
    # it ends with the table it wrote, then where results.json and report.html are
    assert out.rstrip().endswith(f"{(run / 'eval' / 'results.md').read_text(encoding='utf-8').rstrip()}\n"
                                 f"results: {run / 'eval' / 'results.json'}\nreport: {run / 'report.html'}")
    for row in table["rows"]:
        written = json.loads((run / "eval" / row["model"] / "flickr8k.results.json").read_text(encoding="utf-8"))
        captions = {str(r["image_id"]): r["caption"] for r in written}
        assert len(captions) == 40
        assert row["C"] == pytest.approx(_cider(captions, shared_data / "flickr8k" / "Flickr8k.token.txt"), abs=1e-4)
    # each SCST stage records whether its reward varied within the k samples (the mean of the logged steps: every
    # step scores the same number of images)
    for slug in ("cider", "pac-s++"):
        summary = json.loads((run / "stages" / f"scst-{slug}.json").read_text(encoding="utf-8"))["summary"]
        with open(run / f"scst-{slug}" / "log.csv", newline="", encoding="utf-8") as handle:
            fractions = [float(r["zero_spread"]) for r in csv.DictReader(handle)]
        assert len(fractions) == 4 and summary["zero_spread_fraction"] == pytest.approx(sum(fractions) / 4, abs=1e-4)
        # flagged when the mean over the window (the whole 4-step run: shorter than scst.degenerate_window) > 0.5
        assert summary["degenerate_reward"] is (sum(fractions) / 4 > 0.5)
    # `pacs report` on the recipe's run directory shows its table and its curves
    (run / "report.html").unlink()
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text(encoding="utf-8")
    body = page[page.index('id="results-table"'):page.index("</table>", page.index('id="results-table"'))]
    assert body.count("<tr>") == 4  # the header and one row per model
    for model in ("xe", "cider", "pac-s++"):
        assert f'<td class="name">{model}</td>' in body
    assert all(f'alt="{group} curves"' in page for group in ("xe", "scst", "hacking"))
    check_story_report(run)  # headline, figure, one folded table (no empty METEOR / SPICE), provenance
    # the gallery shows the test set's photographs with every system's caption and the references
    gallery = json.loads((run / "gallery.json").read_text(encoding="utf-8"))
    first = {str(r["image_id"]): r["caption"] for r in json.loads(
        (run / "eval" / "xe" / "flickr8k.results.json").read_text(encoding="utf-8"))}
    assert len(gallery) == 8 and all(set(entry["captions"]) == {"xe", "cider", "pac-s++"} for entry in gallery)
    assert [entry["image_id"] for entry in gallery] == list(first)[:8]
    assert all(entry["captions"]["xe"]["caption"] == first[entry["image_id"]] for entry in gallery)
    assert all(len(entry["references"]) == 5 for entry in gallery)  # Flickr8k: five references per photograph
    assert page.count('<img class="photo"') == 8 and 'class="pixel"' not in page


def test_report_refuses_a_folder_without_results_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "empty" / "xe").mkdir(parents=True)
    assert main(["report", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"pacs report: error: {tmp_path / 'empty'} holds no pacs results (no results.json, "
                          "seeds/results.json, eval/results.json, compare_rewards/results.json, train_log.json")
    assert not (tmp_path / "empty" / "report.html").exists()


def test_report_of_a_compare_rewards_folder_and_of_a_metric_training_folder(tmp_path):
    from pacs.captioner.orchestration.pipeline import write_results

    compare = tmp_path / "compare_rewards"
    compare.mkdir()
    rows = [{"test_set": "flickr8k", "reward": "– (XE)", "C": 8.25}, {"test_set": "flickr8k", "reward": "cider",
                                                                     "C": 10.5}]
    write_results(compare, rows, ["test_set", "reward", "C"])
    assert main(["report", str(compare)]) == 0
    page = (compare / "report.html").read_text(encoding="utf-8")
    # one test set: its column is equal on every row, so it is folded into the note under the table
    assert '<td class="name">– (XE)</td><td>8.25</td>' in page
    assert '<td class="name">cider</td><td>10.50</td>' in page
    assert "so not shown as columns: test_set flickr8k." in page

    metric = tmp_path / "metric"
    metric.mkdir()
    history = [{"step": 10, "val_total": 3.0}, {"step": 20, "val_total": 2.5}]
    (metric / "train_log.json").write_text(json.dumps({"history": history, "best_step": 20, "best_val_total": 2.5,
                                                       "steps": 20, "train_losses": [3.5, 3.1, 2.9]}))
    assert main(["report", str(metric)]) == 0
    page = (metric / "report.html").read_text(encoding="utf-8")
    assert '<td class="name">metric</td><td>20.00</td><td>20.00</td><td>2.50</td>' in page
    assert 'alt="validation curves"' in page and 'alt="training curves"' in page


def test_report_of_a_recipe_over_several_seeds(tmp_path):
    from pacs.captioner.orchestration.pipeline import write_results

    run = tmp_path / "run"
    write_results(run / "seeds", [{"model": "xe", "test_set": "flickr8k", "C": 8.25},
                                  {"model": "cider", "test_set": "flickr8k", "C": 10.5}], ["model", "test_set", "C"])
    for seed, losses in (("seed-0", (0.5, 0.4)), ("seed-1", (0.6, 0.3))):
        log = run / seed / "scst-cider" / "log.csv"
        log.parent.mkdir(parents=True)
        log.write_text("step,loss,zero_spread\n" + "".join(f"{i + 1},{v},1\n" for i, v in enumerate(losses)))
    record = run / "seed-1" / "stages" / "scst-cider.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"stage": "scst-cider", "status": "finished",
                                  "summary": {"warnings": ["reward 'cider' is degenerate: ..."]}}))
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text(encoding="utf-8")
    assert '<td class="name">cider</td><td>10.50</td>' in page and "not shown as columns: test_set flickr8k." in page
    assert 'alt="scst curves"' in page
    assert "<li><b>seed-1/scst-cider</b>: reward &#x27;cider&#x27; is degenerate: ...</li>" in page
