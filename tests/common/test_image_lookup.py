"""One image lookup (issue 33 item 6): every command resolves images by one rule (`UserFolder`).

A folder of symlinks works with `score`, `evaluate`, `correlate`, `caption` and the data sets the training and its
rewards read (`image_root`); `../x` and absolute ids are refused on each, in one line naming the rule. What the
report reads back from a run directory stays strict (tests/common/test_confinement.py: a gallery symlink that
leads outside is refused).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from pacs import cli as pacs_cli
from pacs.metric.common.contained_paths import USER_FOLDER_RULE
from pacs.metric.common.errors import InputError

COLOURS = {"red": (200, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 200)}


@pytest.fixture
def links(tmp_path: Path) -> dict[str, Path]:
    """`store/` holds the images, `links/` only symlinks to them (`red.png` ... and a relative one `blue.png`)."""
    store, links = tmp_path / "store", tmp_path / "links"
    store.mkdir()
    links.mkdir()
    for name, colour in COLOURS.items():
        Image.new("RGB", (16, 16), colour).save(store / f"{name}.png")
    (links / "red.png").symlink_to(store / "red.png")
    (links / "green.png").symlink_to(store / "green.png")
    (links / "blue.png").symlink_to(Path("..") / "store" / "blue.png")
    return {"root": tmp_path, "store": store, "links": links}


def _error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pacs {command}: error: "), err
    return err[0]


def _files(root: Path, captions: dict[str, str]) -> tuple[Path, Path]:
    candidates, references = root / "cands.json", root / "refs.json"
    candidates.write_text(json.dumps(captions))
    references.write_text(json.dumps({key: [f"a {name} square" for name in COLOURS] for key in captions}))
    return candidates, references


def _score(links, captions, images):
    candidates, _ = _files(links["root"], captions)
    out = links["root"] / "score.json"
    code = pacs_cli.main(["score", "--metric", "clip-s", "--backbone", "tiny-random", "--images", str(images),
                          "--candidates", str(candidates), "--out", str(out)])
    return code, out, lambda: [row["score"] for row in json.loads(out.read_text())["per_instance"]]


def _evaluate(links, captions, images):
    candidates, references = _files(links["root"], captions)
    out = links["root"] / "evaluate.json"
    code = pacs_cli.main(["evaluate", "--candidates", str(candidates), "--references", str(references),
                          "--metrics", "clip-s", "--backbone", "tiny-random", "--images", str(images),
                          "--out", str(out)])
    return code, out, lambda: json.loads(out.read_text())["metrics"]["clip-s"]


def _correlate(links, captions, images):
    """Flickr8k-Expert in the clipscore json layout: the item's `image_path` is the id joined with --images."""
    data = {str(k): {"image_path": key, "ground_truth": [f"a {name} square" for name in COLOURS],
                     "human_judgement": [{"caption": caption, "rating": 1 + k % 4},
                                         {"caption": caption + " today", "rating": 4 - k % 4}]}
            for k, (key, caption) in enumerate(captions.items())}
    path = links["root"] / "flickr8k.json"
    path.write_text(json.dumps(data))
    out = links["root"] / "correlate.json"
    code = pacs_cli.main(["correlate", "flickr8k-expert", "--data", str(path), "--metrics", "clip-s",
                          "--backbone", "tiny-random", "--images", str(images), "--out", str(out)])
    return code, out, lambda: json.loads(out.read_text())["clip-s"]


COMMANDS = {"score": _score, "evaluate": _evaluate, "correlate": _correlate}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_folder_of_symlinks_scores_as_the_folder_it_points_to(links, capsys, command):
    """The same captions against `links/` (symlinks, one of them relative) and `store/` (the files): equal."""
    captions = {"red.png": "a red square", "green": "a green square", "blue.png": "a blue square"}
    code, _, through_links = COMMANDS[command](links, captions, links["links"])
    assert code == 0, capsys.readouterr().err
    linked = through_links()
    code, _, direct = COMMANDS[command](links, captions, links["store"])
    assert code == 0, capsys.readouterr().err
    assert linked == direct()  # same images, same batches: the same numbers


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("kind", ["dotdot", "absolute"])
def test_dotdot_and_absolute_ids_are_refused_naming_the_rule(links, capsys, command, kind):
    image_id = {"dotdot": "../store/red.png", "absolute": str(links["store"] / "red.png")}[kind]
    code, out, _ = COMMANDS[command](links, {"green.png": "a green square", image_id: "a red square"}, links["links"])
    line = _error_line(capsys, command)
    assert code == 2 and not out.exists()
    assert repr(image_id) in line and str(links["links"]) in line and USER_FOLDER_RULE in line, line


def test_caption_lists_a_folder_of_symlinks(links):
    """`pacs caption --images` reads the folder's entries (the e2e test captions such a folder with a model)."""
    from pacs.captioner.commands.caption_train import list_images

    found = list_images(links["links"])
    assert sorted(found) == ["blue", "green", "red"]
    for key, path in found.items():
        assert path == links["links"] / f"{key}.png"
        assert Image.open(path).convert("RGB").getpixel((0, 0)) == COLOURS[key]


def test_training_data_sets_follow_symlinks_and_refuse_dotdot_naming_the_rule(links):
    """`pacs train`'s data sets (and so its rewards' images) and train-metric's caption data: `image_root`."""
    from pacs.captioner.data.datasets import load_dataset
    from pacs.metric.training.positives import read_caption_dataset

    def karpathy(name: str) -> Path:
        images = [{"filename": name, "split": "test", "sentences": [{"raw": "a square"}], "cocoid": 1}]
        path = links["root"] / "dataset_flickr8k.json"
        path.write_text(json.dumps({"images": images}))
        return path

    dataset = load_dataset("flickr8k-karpathy", karpathy("blue.png"), image_root=links["links"])
    (item,) = list(dataset)
    assert Image.open(item.image_path).convert("RGB").getpixel((0, 0)) == COLOURS["blue"]
    (source,) = read_caption_dataset(karpathy("red.png"), links["links"])
    assert Image.open(source.path).convert("RGB").getpixel((0, 0)) == COLOURS["red"]
    for bad in ("../store/red.png", str(links["store"] / "red.png")):
        with pytest.raises(InputError, match="must be a path inside the image root") as error:
            load_dataset("flickr8k-karpathy", karpathy(bad), image_root=links["links"])
        assert USER_FOLDER_RULE in str(error.value)
        with pytest.raises(InputError, match="must be a path inside the image root") as error:
            read_caption_dataset(karpathy(bad), links["links"])
        assert USER_FOLDER_RULE in str(error.value)


def test_the_report_stays_strict_about_a_gallery_symlink(links):
    """A run directory is not a folder the user names: a gallery image symlinked outside it is refused."""
    from pacs.eval.report import build_report

    run = links["root"] / "run"
    (run / "gallery").mkdir(parents=True)
    (run / "gallery" / "red.png").symlink_to(links["store"] / "red.png")
    (run / "gallery.json").write_text(json.dumps([{"image_id": "red", "image": "gallery/red.png",
                                                   "references": [], "captions": {}}]))
    with pytest.raises(InputError, match=r"its image 'gallery/red\.png' must be a path inside the run directory"):
        build_report(run)
