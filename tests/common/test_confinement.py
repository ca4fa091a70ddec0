"""Paths taken from data files stay inside their folder (issue 21: nothing leaked; issue 33: one image lookup).

An image id (`pacs score`, `correlate`/`evaluate`), an image-map entry and a data-set file name are joined with
a folder the user names (`--images`, `image_root`): `../x` or an absolute path is one InputError naming the
item, the folder and the rule, identical whether or not the outside file exists; a symlink inside that folder
is followed (the folder is the user's own). A gallery image and a video id stay strict: a symlink pointing
outside the run directory (the video folder) is refused too, and nothing outside is read.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_errors import one_error_line
from PIL import Image

from pacs import cli as pacs_cli
from pacs.metric.common.contained_paths import ConfinedRoot, path_inside
from pacs.metric.common.errors import InputError


def _png(path: Path, colour: tuple[int, int, int] = (200, 30, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), colour).save(path)
    return path


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """`images/` with one image and two symlinks pointing outside it (`link.png`, `stem.png`), and `outside/`."""
    images, outside = tmp_path / "images", tmp_path / "outside"
    _png(images / "inside.png")
    secret = _png(outside / "secret.png", (1, 2, 3))
    (images / "link.png").symlink_to(secret)
    (images / "stem.png").symlink_to(secret)
    (images / "dangling.png").symlink_to(outside / "nothing-here.png")
    return {"root": tmp_path, "images": images, "outside": outside, "secret": secret}


# --- the helper -----------------------------------------------------------------------------------------------

def test_confined_root_resolves_like_path_resolve_but_refuses_what_leaves(world):
    images = world["images"]
    root = ConfinedRoot(images)
    (images / "sub").mkdir()
    (images / "sub" / "up").symlink_to("..")  # a link that stays inside
    assert root.join("inside.png", "x") == images / "inside.png"
    assert root.resolve(images / "sub" / "up" / "inside.png") == (images / "inside.png").resolve()
    assert root.resolve(images / "missing" / ".." / "inside.png") == (images / "inside.png").resolve()
    assert root.join(str(images / "inside.png"), "x") == images / "inside.png"  # absolute but inside: fine
    for bad in ("../outside/secret.png", str(world["secret"]), "link.png", "dangling.png", "sub/up/../../outside",
                ".", "", "sub/up/link.png"):
        with pytest.raises(InputError, match=r"^image id 'x' must be a path inside the folder$"):
            ConfinedRoot(images, "the folder").join(bad, "image id 'x'")
    (images / "loop-a").symlink_to("loop-b")
    (images / "loop-b").symlink_to("loop-a")
    assert not root.contains(images / "loop-a")
    with pytest.raises(InputError, match="must be a path inside"):
        path_inside(images, "../outside", "it")


def test_nothing_outside_the_root_is_looked_at(world, monkeypatch):
    """Resolution stops at the first component outside the root: no stat / lstat / readlink of outside paths."""
    seen: list[str] = []
    for name in ("stat", "lstat", "readlink"):
        original = getattr(os, name)

        def spy(path, *args, _original=original, **kwargs):
            seen.append(os.fspath(path))
            return _original(path, *args, **kwargs)

        monkeypatch.setattr(os, name, spy)
    root = ConfinedRoot(world["images"])
    seen.clear()  # resolving the root itself looks at the root's own ancestors
    for bad in ("../outside/secret.png", str(world["secret"]), "link.png", "dangling.png"):
        assert not root.contains(world["images"] / bad)
    monkeypatch.undo()
    outside = str(world["outside"])
    assert seen and not [path for path in seen if path.startswith(outside)], seen


# --- pacs score ------------------------------------------------------------------------------------------------

def _score(world: dict[str, Path], candidates, *extra: str) -> tuple[int, Path]:
    cands = world["root"] / "cands.json"
    cands.write_text(json.dumps(candidates))
    out = world["root"] / "out.json"
    code = pacs_cli.main(["score", "--metric", "clip-s", "--backbone", "tiny-random", "--images", str(world["images"]),
                          "--candidates", str(cands), "--out", str(out), *extra])
    return code, out


RULE = "a relative path without '..' (symlinks inside the folder are followed: the folder is yours)"


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "absolute-inside", "dotdot-inside"])
def test_score_refuses_an_image_id_that_leaves_images_lexically(world, capsys, kind):
    image_id = {"dotdot": "../outside/secret.png", "absolute": str(world["secret"]),
                "absolute-inside": str(world["images"] / "inside.png"), "dotdot-inside": "sub/../inside.png"}[kind]
    code, out = _score(world, {"inside": "a red square", image_id: "a caption"})
    line = one_error_line(capsys, "score")
    assert code == 2 and not out.exists()
    assert f"image id {image_id!r}" in line and f"must be a path inside the image folder --images {world['images']}" \
        in line and RULE in line, line


def test_score_follows_symlinks_inside_images(world, capsys):
    """The folder is the user's: `link.png` and `stem` (a symlink found by its stem) read the outside image; a
    dangling symlink is a missing image, named as such."""
    code, out = _score(world, {"inside": "a red square", "link.png": "a dark square", "stem": "a dark square"})
    assert code == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["n"] == 3
    code, out = _score(world, {"inside": "a red square", "dangling.png": "a caption"})
    line = one_error_line(capsys, "score")
    assert code == 2 and "no image file for image id 'dangling.png'" in line, line


def test_score_message_is_the_same_whether_the_outside_file_exists(world, capsys):
    lines = []
    for image_id in ("../outside/secret.png", str(world["secret"])):
        for exists in (True, False):
            if exists:
                _png(world["secret"], (1, 2, 3))
            else:
                world["secret"].unlink()
            code, _ = _score(world, [{"image_id": image_id, "caption": "x"}])
            assert code == 2
            lines.append(one_error_line(capsys, "score"))
    assert lines[0] == lines[1] and lines[2] == lines[3], lines


def test_score_inside_ids_and_image_map(world, capsys, tmp_path):
    code, out = _score(world, {"inside": "a red square", "inside.png": "a red square"})
    assert code == 0 and json.loads(out.read_text())["n"] == 2
    capsys.readouterr()
    maps = tmp_path / "maps"
    maps.mkdir()
    _png(maps / "near.png")
    good = maps / "good.json"  # relative inside the map's folder, or absolute (the user's explicit choice)
    good.write_text(json.dumps({"a": "near.png", "b": str(world["secret"])}))
    code, _ = _score(world, {"a": "x", "b": "y"}, "--image-map", str(good))
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    (maps / "escape.png").symlink_to(world["secret"])  # the map's folder is the user's: its symlinks are followed
    linked = maps / "linked.json"
    linked.write_text(json.dumps({"a": "escape.png"}))
    code, _ = _score(world, {"a": "x"}, "--image-map", str(linked))
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    for value in ("../outside/secret.png", "sub/../near.png"):
        bad = maps / "bad.json"
        bad.write_text(json.dumps({"a": value}))
        code, out = _score(world, {"a": "x"}, "--image-map", str(bad))
        line = one_error_line(capsys, "score")
        assert code == 2 and f"image id 'a' ({value!r}) must be a path inside the image map's folder" in line, line
        assert RULE in line, line


def test_correlate_resolve_images_refuses_even_when_skipping_missing_images(world):
    from pacs.eval.benchmarks import RunContext, resolve_images
    from pacs.eval.caption_scoring import MetricSuite

    for skip in (False, True):
        context = RunContext(Path("."), MetricSuite(["clip-s"]), images=world["images"], skip_missing_images=skip)
        with pytest.raises(InputError, match=r"image id '\.\./outside/secret\.png' must be a path inside"):
            resolve_images(context, ["inside", "../outside/secret.png"])
        with pytest.raises(InputError, match=r"image id 'x' \(path '\.\./outside/secret\.png'\) must be a path inside"):
            resolve_images(context, ["x"], ["../outside/secret.png"])
        keep, paths = resolve_images(context, ["inside", "y"], [None, "link.png"])  # a symlink inside: followed
        assert keep.all() and paths == [world["images"] / "inside.png", world["images"] / "link.png"]


def test_find_video_refuses_a_video_id_that_leaves_the_folder(world):
    from pacs.metric.video.frames import find_video

    videos = world["images"]
    with pytest.raises(InputError, match=r"video id '\.\./outside/secret' must be a path inside the video folder"):
        find_video(videos, "../outside/secret")
    with pytest.raises(InputError, match="video id 'link.png' must be a path inside"):
        find_video(videos, "link.png")
    assert find_video(videos, "inside.png") == videos / "inside.png"


# --- caption data sets ------------------------------------------------------------------------------------------

def _karpathy(folder: Path, filename: str) -> Path:
    path = folder / "dataset_flickr8k.json"
    images = [{"filename": "inside.png", "split": "test", "sentences": [{"raw": "a red square"}]},
              {"filename": filename, "split": "test", "sentences": [{"raw": "a caption"}]}]
    path.write_text(json.dumps({"images": images}))
    return path


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "dotdot-inside"])
def test_dataset_loaders_refuse_image_files_outside_the_image_root(world, kind):
    from pacs.captioner.data.datasets import load_dataset

    images, root = world["images"], world["root"]
    name = {"dotdot": "../outside/secret.png", "absolute": str(world["secret"]), "dotdot-inside": "sub/../inside.png"}[kind]
    expected = f"image file {name!r} must be a path inside the image root {images}: {RULE}"
    with pytest.raises(InputError, match=r"images\[1\]: " + _escaped(expected)):
        load_dataset("flickr8k-karpathy", _karpathy(root, name), image_root=images)
    coco = {"images": [{"id": 1, "file_name": name, "domain": "in-domain"}],
            "annotations": [{"image_id": 1, "id": 1, "caption": "a caption"}]}
    (root / "nocaps.json").write_text(json.dumps(coco))
    with pytest.raises(InputError, match=r"nocaps\.json: images\[0\]: " + _escaped(expected)):
        load_dataset("nocaps", root / "nocaps.json", image_root=images)
    with pytest.raises(InputError, match=r"nocaps\.json: images\[0\]: " + _escaped(expected)):
        load_dataset("vizwiz", root / "nocaps.json", image_root=images)
    (root / "cc3m.tsv").write_text(f"a caption\t{name}\n")
    with pytest.raises(InputError, match=r"cc3m\.tsv: line 1: " + _escaped(expected)):
        load_dataset("cc3m", root / "cc3m.tsv", image_root=images)
    flickr = root / "flickr8k"
    flickr.mkdir()
    (flickr / "Flickr8k.token.txt").write_text(f"{name}#0\ta caption\n")
    for split_file in ("Flickr_8k.trainImages.txt", "Flickr_8k.devImages.txt"):
        (flickr / split_file).write_text("")
    (flickr / "Flickr_8k.testImages.txt").write_text(f"{name}\n")
    with pytest.raises(InputError, match=r"Flickr_8k\.testImages\.txt: line 1: " + _escaped(expected)):
        load_dataset("flickr8k", flickr, image_root=images)
    _png(images / "sub" / "other.png")
    dataset = load_dataset("flickr8k-karpathy", _karpathy(root, "sub/./other.png"), image_root=images)
    assert [item.image_path for item in dataset] == [images / "inside.png", images / "sub" / "other.png"]
    dataset = load_dataset("flickr8k-karpathy", _karpathy(root, "link.png"), image_root=images)  # followed
    assert [item.image_path for item in dataset] == [images / "inside.png", images / "link.png"]


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


# --- the report ------------------------------------------------------------------------------------------------

def _run(world: dict[str, Path], image: str) -> Path:
    run = world["root"] / "run"
    _png(run / "gallery" / "ok.png")
    gallery = [{"image_id": "ok", "image": "gallery/ok.png", "references": ["a red square"], "captions": {}},
               {"image_id": "bad", "image": image, "references": [], "captions": {}}]
    (run / "gallery.json").write_text(json.dumps(gallery))
    return run


@pytest.mark.parametrize("kind", ["etc-hostname", "dotdot", "absolute", "symlink", "dangling-symlink"])
def test_report_refuses_a_gallery_image_outside_the_run_directory(world, capsys, kind):
    from pacs.eval.report import build_report, report_digest, report_inputs, write_report

    run = world["root"] / "run"
    image = {"etc-hostname": "../../../../etc/hostname", "dotdot": "../outside/secret.png",
             "absolute": str(world["secret"]), "symlink": "gallery/link.png",
             "dangling-symlink": "gallery/dangling.png"}[kind]
    _run(world, image)
    (run / "gallery" / "link.png").symlink_to(world["secret"])
    (run / "gallery" / "dangling.png").symlink_to(world["outside"] / "nothing-here.png")
    expected = (f"{run / 'gallery.json'}: entry #1 (image id 'bad'): its image {image!r} must be a path inside "
                f"the run directory {run}")
    for call in (build_report, write_report, report_inputs, report_digest):
        with pytest.raises(InputError) as error:
            call(run)
        assert str(error.value) == expected
    assert pacs_cli.main(["report", str(run)]) == 2
    assert one_error_line(capsys, "report") == f"pacs report: error: {expected}"
    assert not (run / "report.html").exists() and not list(run.glob(".report.html*"))


def test_report_message_is_the_same_whether_the_outside_file_exists(world):
    from pacs.eval.report import write_report

    run = _run(world, "../outside/secret.png")
    messages = []
    for exists in (True, False):
        if not exists:
            world["secret"].unlink()
        with pytest.raises(InputError) as error:
            write_report(run)
        messages.append(str(error.value))
    assert messages[0] == messages[1]


def test_report_refuses_symlinked_inputs_that_lead_outside(world):
    from pacs.eval.report import report_inputs, write_report

    run = _run(world, "gallery/ok.png")
    assert [p.relative_to(run).as_posix() for p in report_inputs(run)] == ["gallery.json", "gallery/ok.png",
                                                                          "gallery/ok.png"]
    assert write_report(run).is_file()
    (world["outside"] / "log.csv").write_text("step,loss\n0,1\n1,0.5\n")
    (run / "logs").mkdir()
    (run / "logs" / "xe.csv").symlink_to(world["outside"] / "log.csv")
    with pytest.raises(InputError, match=r"logs/xe\.csv must be a path inside the run directory"):
        report_inputs(run)
    (run / "logs" / "xe.csv").unlink()
    (run / "results.json").symlink_to(world["outside"] / "results.json")  # dangling: the same refusal
    with pytest.raises(InputError, match=r"results\.json must be a path inside the run directory"):
        write_report(run)


def test_report_inputs_and_digest_never_look_outside_the_run_directory(world, monkeypatch):
    """No stat, lstat, readlink or open of anything under `outside/`, for any kind of escaping gallery image."""
    import builtins
    import io

    from pacs.eval.report import report_digest, report_inputs

    run = _run(world, "gallery/ok.png")
    (run / "gallery" / "link.png").symlink_to(world["secret"])
    outside = str(world["outside"])
    seen: list[str] = []

    def spying(module, name):
        original = getattr(module, name)

        def spy(path, *args, **kwargs):
            if isinstance(path, (str, bytes, os.PathLike)):
                seen.append(os.fsdecode(os.fspath(path)))
            return original(path, *args, **kwargs)

        monkeypatch.setattr(module, name, spy)

    for image in ("../outside/secret.png", str(world["secret"]), "gallery/link.png"):
        gallery = json.loads((run / "gallery.json").read_text())
        gallery[1]["image"] = image
        (run / "gallery.json").write_text(json.dumps(gallery))
        for module, name in ((os, "stat"), (os, "lstat"), (os, "readlink"), (builtins, "open"), (io, "open"),
                             (os, "open")):
            spying(module, name)
        for call in (report_inputs, report_digest):
            with pytest.raises(InputError, match="must be a path inside the run directory"):
                call(run)
        monkeypatch.undo()
        assert seen and not [path for path in seen if path.startswith(outside)], (image, seen)
