"""Where a `--config` YAML comes from: a file, or a config name shipped with pacs (`--config demo_smoke`).

The default configs live in one place, `recipes/configs/*.yaml`; the distribution maps that folder to the
package `pacs.configs` (setup.cfg `package_dir`), so the same files are package data in an installed wheel
and the source files themselves in a checkout or an editable install. A `--config` value that is an existing
file is used as given; a bare name (no `.yaml`, no path separator) is looked up among the packaged configs;
a `recipes/configs/NAME.yaml` path that does not exist from the current folder (a README command run outside
the checkout) falls back to the packaged NAME. `_base_:` references are relative to the file, so they
resolve inside the package too.
"""
from __future__ import annotations

import importlib.resources
import logging
import os
from pathlib import Path

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.common.suggest import known_hint

logger = logging.getLogger(__name__)

PACKAGE = "pacs.configs"
SUFFIXES = (".yaml", ".yml")
_SOURCE_FOLDER = ("recipes", "configs")  # where the packaged configs live in the source tree


def packaged_configs_dir() -> Path:
    """The folder holding the packaged configs (`recipes/configs` of a checkout, `pacs/configs/` when installed)."""
    try:
        root = importlib.resources.files(PACKAGE)
    except ModuleNotFoundError:
        raise MissingResourceError(f"the packaged configs (package {PACKAGE!r}) are not installed: reinstall pacs "
                                   f"(pip install -e . in a checkout)") from None
    if not isinstance(root, Path):  # e.g. a zip import: configs must be real files for `_base_` resolution
        raise MissingResourceError(f"the packaged configs are not on the file system ({root}); install pacs "
                                   f"from a wheel or a checkout")
    return root


def available_configs() -> list[str]:
    """Names of the packaged configs (file stems), sorted."""
    return sorted(path.stem for path in packaged_configs_dir().iterdir()
                  if path.is_file() and path.suffix in SUFFIXES)


def packaged_config(name: str) -> Path:
    """The file of the packaged config `name` (e.g. 'demo_smoke'); InputError listing the names when unknown."""
    folder = packaged_configs_dir()
    for suffix in SUFFIXES:
        path = folder / f"{name}{suffix}"
        if path.is_file():
            return path
    raise InputError(f"unknown config {name!r}: not a file, and no packaged config has that name "
                     f"{known_hint(name, available_configs(), label='available', max_listed=1000)}")


def is_config_name(value: str) -> bool:
    """True for a bare config name: no path separator and no YAML suffix."""
    separators = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    return not any(sep in value for sep in separators) and not value.lower().endswith(SUFFIXES)


def resolve_config(value: str | os.PathLike) -> Path:
    """The YAML file meant by a `--config` value: an existing file, a packaged config name, or the given path."""
    path = Path(value)
    if path.is_file():
        return path
    text = os.fspath(value)
    if is_config_name(text):
        return packaged_config(text)
    if not path.is_absolute() and tuple(path.parent.parts[-2:]) == _SOURCE_FOLDER and path.suffix in SUFFIXES:
        try:
            packaged = packaged_config(path.stem)
        except (InputError, MissingResourceError):
            return path  # the caller reports the missing file
        logger.info("%s is not here: using the packaged config %s", text, packaged)
        return packaged
    return path
