"""Image lookup shared by every command (`pacs score`, `pacs correlate`, `pacs caption`), and image ids from names.

Lookup of an id: the id→file map first (`--image-map`), then in the image folder `DIR/<relative path>`,
`DIR/<id>` as given, then `DIR/<name>.<ext>` for the extensions `.jpg .jpeg .png` in any case (`.JPG`,
`.Jpeg`). Two files that both match (`1.jpg` and `1.png`) are ambiguous: an InputError naming the id and both
files, never a silent choice. Ids and relative paths follow the rule of a folder the user names
(`pacs.metric.common.contained_paths.UserFolder`, shared with the data sets' `image_root`): relative, no `..`; symlinks
inside the folder are followed.

Ids of `pacs caption` come from the file names (`ids_for_files`): `stem` (the file name without extension),
`coco` (`COCO_val2014_000000391895.jpg` -> the integer 391895) or a JSON file mapping file names to ids.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pacs.metric.common.contained_paths import UserFolder
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
COCO_NAME = re.compile(r"^COCO_[A-Za-z0-9]+_(\d{12})$")
ID_MODES = ("stem", "name", "coco")


def is_image_file(path: Path) -> bool:
    """True for a file whose extension is .jpg, .jpeg or .png in any case."""
    return path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()


class ImageFinder:
    """Finds the file of an image id in an id→file map and/or an image folder (folder listings are cached)."""

    def __init__(self, images_dir: str | os.PathLike | None = None,
                 image_map: Mapping[str, str | os.PathLike] | None = None) -> None:
        self.images_dir = Path(images_dir) if images_dir is not None else None
        # every id / relative path stays inside the folder lexically; symlinks in it are followed (the user's
        # own folder: pacs.metric.common.contained_paths.UserFolder, the rule of every command)
        self._root = UserFolder(self.images_dir, f"the image folder images={self.images_dir}") \
            if self.images_dir is not None else None
        self.image_map = {str(k): Path(v) for k, v in (image_map or {}).items()}
        self._listings: dict[Path, dict[str, list[Path]]] = {}

    def _by_stem(self, folder: Path) -> dict[str, list[Path]]:
        """{stem: [image files]} of one folder (read once)."""
        if folder not in self._listings:
            listing: dict[str, list[Path]] = {}
            if folder.is_dir():
                for path in sorted(folder.iterdir()):
                    if path.suffix.lower() in IMAGE_SUFFIXES:
                        listing.setdefault(path.stem, []).append(path)
            self._listings[folder] = listing
        return self._listings[folder]

    def _in_folder(self, image_id: str, name: str) -> Path | None:
        assert self._root is not None
        what = f"image id {image_id!r}" + (f" (path {name!r})" if name != image_id else "")
        direct = self._root.join(name, what, parameter="images")  # before any existence check
        if direct.is_file():
            return direct
        candidates = self._by_stem(direct.parent).get(direct.name, [])  # entries of a folder inside the root
        matches = [p for p in candidates if p.is_file()]
        if len(matches) > 1:
            raise InputError(f"image id {image_id!r} is ambiguous: {', '.join(str(p) for p in matches)} all match "
                             f"(rename one, or pass an image map)")
        return matches[0] if matches else None

    def find(self, image_id: Any, relative_path: str | None = None) -> Path | None:
        """The file of `image_id` (see the module docstring), or None when there is none.

        An id or relative path that leaves the image folder lexically (`../x`, an absolute path) is an InputError
        naming it, the folder and the rule, whether or not the outside file exists; a symlink inside the folder
        is followed wherever it points (the folder is the user's own).
        """
        key = str(image_id)
        if key in self.image_map:
            path = self.image_map[key]
            return path if path.is_file() else None
        if self.images_dir is None:
            return None
        names = [relative_path, Path(relative_path).name if relative_path else None, key]
        for name in dict.fromkeys(filter(None, names)):
            found = self._in_folder(key, name)
            if found is not None:
                return found
        return None

    def resolve(self, image_id: Any, relative_path: str | None = None) -> Path:
        """Like `find`, but an InputError naming the id (and where it looked) when there is no file."""
        found = self.find(image_id, relative_path)
        if found is not None:
            return found
        key = str(image_id)
        if key in self.image_map:
            where = f"its image map entry {self.image_map[key]} is not a file"
        elif self.images_dir is not None:
            where = (f"no {self.images_dir}/{relative_path or key} or {key}.{{jpg,jpeg,png}} in any case "
                     "(and no image map entry)")
        else:
            where = "no image map entry and no image folder: pass images=DIR or an image_map= entry"
        raise InputError(f"no image file for image id {key!r}: {where}", parameter=("images", "image_map"))


def find_image(image_id: Any, images_dir: str | os.PathLike | None = None,
               image_map: Mapping[str, str | os.PathLike] | None = None,
               relative_path: str | None = None) -> Path | None:
    """One-off `ImageFinder(images_dir, image_map).find(image_id, relative_path)` (use a finder for many ids)."""
    return ImageFinder(images_dir, image_map).find(image_id, relative_path)


def list_images(folder: str | os.PathLike) -> list[Path]:
    """The .jpg/.jpeg/.png files (any case) of `folder`, sorted by name (InputError when none or no folder)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"image folder not found: {folder}")
    files = sorted(path for path in folder.iterdir() if is_image_file(path))
    if not files:
        raise InputError(f"no .jpg/.jpeg/.png images in {folder}")
    return files


def coco_image_id(name: str) -> int:
    """The integer id of a COCO file name: `COCO_val2014_000000391895.jpg` -> 391895 (InputError otherwise)."""
    match = COCO_NAME.match(Path(name).stem)
    if match is None:
        raise InputError(f"{name}: not a COCO file name COCO_<split>_<12 digits>.<ext> (use ids= stem or a JSON "
                         "file mapping file names to ids)", parameter="ids")
    return int(match.group(1))


def read_id_map(path: str | os.PathLike) -> dict[str, Any]:
    """Read `{file name: image id}` (ids are strings or integers)."""
    data = read_json_file(path, "image id map")
    if not isinstance(data, dict) or not data:
        raise InputError(f"{path}: an image id map must be a non-empty JSON object {{file name: image id}}")
    for name, image_id in data.items():
        if isinstance(image_id, bool) or not isinstance(image_id, (str, int)):
            raise InputError(f"{path}: the id of {name!r} is not a string or integer: {image_id!r}")
    return dict(data)


def ids_for_files(files: list[Path], mode: str) -> dict[Any, Path]:
    """{image id: file} with ids from the file names: `stem`, `name` (with its extension, Flickr8k's ids), `coco`
    or a JSON file {file name: id}.

    Every file needs an id and every id one file: a file missing from the JSON map, a map entry naming no file,
    or two files with one id is an InputError naming them.
    """
    if mode == "stem":
        ids: list[Any] = [path.stem for path in files]
    elif mode == "name":
        ids = [path.name for path in files]
    elif mode == "coco":
        ids = [coco_image_id(path.name) for path in files]
    else:
        mapping = read_id_map(mode)
        names = {path.name for path in files}
        unknown = [name for name in mapping if name not in names]
        if unknown:
            raise InputError(f"{mode}: {len(unknown)} map entries name no image of the folder, e.g. {unknown[0]!r}")
        missing = [path.name for path in files if path.name not in mapping]
        if missing:
            raise InputError(f"{mode}: no id for {len(missing)} image(s) of the folder, e.g. {missing[0]!r}")
        ids = [mapping[path.name] for path in files]
    result: dict[Any, Path] = {}
    for image_id, path in zip(ids, files):
        if image_id in result:
            raise InputError(f"two images get the id {image_id!r}: {result[image_id].name} and {path.name}")
        result[image_id] = path
    return result


def id_rule_hint(missing: list[str], reference_ids: Iterable[str]) -> str:
    """Which id rule would make candidate ids that match no reference meet them ('' when none would).

    `pacs caption --ids` writes ids by a rule (the file stem by default); reference files of each data set use
    their own (Flickr8k file names, COCO integers): the usual mismatch is one rule against another.
    """
    keys = set(reference_ids)
    if not missing or not keys:
        return ""
    sample = missing[:50]
    by_stem: dict[str, str] = {}
    for key in keys:
        by_stem.setdefault(Path(key).stem, key)
    numeric = {int(key): key for key in keys if key.isdigit()}

    def share(rule: Callable[[str], str | None]) -> str | None:
        """An example (candidate -> reference) when the rule maps most of the sample onto references."""
        hits = [(cid, rule(cid)) for cid in sample if rule(cid) in keys]
        return f"{hits[0][0]!r} -> {hits[0][1]!r}" if hits and 2 * len(hits) >= len(sample) else None

    rules = (
        (lambda cid: by_stem.get(cid) if Path(cid).suffix == "" else None,
         ("the references name images by file name, the candidates by file stem: caption with `pacs caption --ids "
         "name`")),
        (lambda cid: Path(cid).stem if Path(cid).suffix.lower() in IMAGE_SUFFIXES else None,
         ("the references name images by file stem, the candidates by file name: caption with `pacs caption --ids "
         "stem`")),
        (lambda cid: numeric.get(int(COCO_NAME.match(Path(cid).stem).group(1)))
         if COCO_NAME.match(Path(cid).stem) else None,
         ("the references use COCO's integer ids, the candidates COCO file names: caption with `pacs caption --ids "
         "coco`")),
        (lambda cid: numeric.get(int(cid)) if cid.isdigit() else None,
         ("the ids differ in their zero padding (integers against zero-padded strings): write the candidates' ids "
         "as the references do (`pacs caption --ids coco` gives integers)")),
    )
    for rule, advice in rules:
        example = share(rule)
        if example:
            return f"; {advice} (e.g. {example})"
    return ""


def id_mode(value: str) -> str:
    """Check a `--ids` value: `stem`, `name`, `coco` or an existing JSON file."""
    if value in ID_MODES:
        return value
    if not value.lower().endswith(".json"):
        raise InputError(f"ids= must be stem, name, coco or a JSON file mapping file names to ids, got {value!r}",
                         parameter="ids")
    if not Path(value).is_file():
        raise InputError(f"ids= file not found: {value}", parameter="ids")
    return value

