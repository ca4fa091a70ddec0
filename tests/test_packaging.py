"""The wheel works outside the repository: it installs one top-level package, `pacs`, ships every default config,
and `pacs train --config demo_smoke` runs from a temporary folder in a venv where the installed wheel, not the
checkout, provides pacs, after two other distributions with top-level `metric` and `rewards` came and went.

Also the config-name resolution itself (`pacs.metric.common.config_files`) on the checkout's configs.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pacs import cli as pacs_cli
from pacs.metric.common.config import load_yaml
from pacs.metric.common.config_files import (
    available_configs,
    packaged_configs_dir,
    resolve_config,
)
from pacs.metric.common.errors import InputError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "recipes" / "configs"
SOURCE_ROOTS = ("captioner", "eval", "metric", "rewards")


# Build outputs and caches of the checkout (.gitignore), which a fresh clone would not have.
IGNORED = ("__pycache__", "*.egg-info", "build", "dist", ".pytest_cache", "runs", ".cache", "*.tmp", ".git",
           ".ruff_cache", ".venv*")  # .venv-ci/: the environment .ci/run builds inside the clone


def _build_wheel(tmp_path: Path) -> Path:
    """Build the wheel from a copy of the checkout (so no build/ or egg-info lands in the repository)."""
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*IGNORED))
    out = tmp_path / "dist"
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check",
                           "--outdir", str(out), str(source)], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return wheel


def _runner_site_dirs() -> list[Path]:
    """The site-packages folders of the interpreter running the tests (a venv's own, not its base's)."""
    return [Path(entry) for entry in sys.path if entry.endswith(("site-packages", "dist-packages"))
            and Path(entry).is_dir()]


def _venv_seeing_the_runners_packages(venv: Path) -> Path:
    """A new venv whose imports fall back to the test runner's site-packages, whatever interpreter runs pytest.

    `--system-site-packages` would expose the *base* interpreter's packages when pytest itself runs in a venv.
    A plain path in a `.pth` file adds the runner's folders after the venv's own, but the `.pth` files inside them
    (the checkout's editable-install hook among them) are not processed, so pacs can only come from the wheel.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "pacs_test_runner_packages.pth").write_text("".join(f"{folder}\n" for folder in _runner_site_dirs()))
    return venv / "bin" / "python"


def _collider_wheel(tmp_path: Path, package: str) -> Path:
    """A wheel of another distribution that installs a top-level `package` (as `metric` / `rewards` on PyPI do)."""
    source = tmp_path / f"collider-{package}"
    (source / package).mkdir(parents=True)
    (source / package / "__init__.py").write_text(f'"""Not pacs: another distribution of a top-level {package}."""\n')
    (source / "setup.cfg").write_text(f"[metadata]\nname = collider-{package}\nversion = 1.0\n\n"
                                      f"[options]\npackages = {package}\n")
    (source / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=64"]\n'
                                           'build-backend = "setuptools.build_meta"\n')
    out = tmp_path / "collider-dist"
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check",
                           "--outdir", str(out), str(source)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob(f"collider_{package}-*.whl")
    return wheel


def _top_level_of(wheel: Path) -> set[str]:
    """The top-level names a wheel installs: the first path component of every file it holds but its metadata."""
    return {name.split("/")[0].removesuffix(".py") for name in zipfile.ZipFile(wheel).namelist()
            if ".dist-info/" not in name}


@pytest.mark.slow
def test_wheel_ships_configs_and_runs_outside_the_repository(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    # one namespace: nothing installed at the top level but `pacs`
    assert _top_level_of(wheel) == {"pacs"}
    (top_level,) = [name for name in names if name.endswith(".dist-info/top_level.txt")]
    assert archive.read(top_level).decode().split() == ["pacs"]
    (record,) = [name for name in names if name.endswith(".dist-info/RECORD")]
    recorded = {line.split(",")[0].split("/")[0] for line in archive.read(record).decode().splitlines() if line}
    assert {name for name in recorded if not name.endswith(".dist-info")} == {"pacs"}
    # every default config, under the package the resolver reads
    yamls = sorted(path.name for path in CONFIGS.glob("*.yaml"))
    assert yamls and {f"pacs/configs/{name}" for name in yamls} <= names
    # every package of the source tree (setup.cfg lists them by hand) and the console script's module
    packages = sorted(f"pacs/{init.parent.relative_to(REPO)}" for root in SOURCE_ROOTS
                      for init in (REPO / root).rglob("__init__.py") if "__pycache__" not in init.parts)
    assert {f"{package}/__init__.py" for package in packages} <= names, "a package is missing from setup.cfg"
    assert {"pacs/__init__.py", "pacs/cli.py", "pacs/__main__.py"} <= names

    # beside two other distributions that install top-level `metric` and `rewards`, installed then uninstalled
    venv = tmp_path / "venv"
    python = _venv_seeing_the_runners_packages(venv)
    colliders = [_collider_wheel(tmp_path, package) for package in ("metric", "rewards")]
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*pip, str(wheel), *map(str, colliders)], check=True, timeout=300)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "collider-metric", "collider-rewards"],
                   check=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": ""}
    # the venv's own copy wins over the checkout's editable install, and the colliders took nothing of it
    probe = "import pacs, pacs.metric, pacs.configs; print(pacs.metric.__file__); print(pacs.configs.__file__)"
    where = subprocess.run([str(python), "-c", probe], cwd=elsewhere, env=env, capture_output=True,
                           text=True, check=True).stdout.split()
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert [Path(p) for p in where] == [site / "pacs" / "metric" / "__init__.py",
                                        site / "pacs" / "configs" / "__init__.py"]
    assert not (site / "metric").exists() and not (site / "rewards").exists()

    runs = tmp_path / "runs"
    done = subprocess.run([str(venv / "bin" / "pacs"), "--log-level", "WARNING", "train", "--config", "demo_smoke",
                           f"runs_dir={runs}", "threads=1"], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((runs / "demo_smoke" / "results.json").read_text())
    assert results["rows"] and results["rows"][0]["model"] == "xe"
    assert (runs / "demo_smoke" / "results.md").is_file()
    assert not list(elsewhere.iterdir())  # nothing written to the working folder


def test_a_name_resolves_to_the_packaged_config_and_its_base() -> None:
    assert packaged_configs_dir().resolve() == CONFIGS.resolve()  # one source: the checkout's folder itself
    assert available_configs() == sorted(path.stem for path in CONFIGS.glob("*.yaml"))
    assert resolve_config("demo_smoke").resolve() == (CONFIGS / "demo_smoke.yaml").resolve()
    # `_base_: demo.yaml` is followed inside the package: a key only demo.yaml sets arrives
    by_name = load_yaml("demo_smoke")
    assert by_name == load_yaml(CONFIGS / "demo_smoke.yaml")
    assert by_name["demo"]["run_dir"] == "runs/demo_smoke" and "prompt" in by_name["demo"]


def test_a_path_wins_over_a_name_and_readme_paths_work_from_anywhere(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    local = tmp_path / "demo_smoke"
    local.write_text("demo: {name: mine}\n")
    monkeypatch.chdir(tmp_path)
    assert load_yaml("demo_smoke") == {"demo": {"name": "mine"}}  # an existing file is used as given
    # a README path run outside the checkout falls back to the packaged file of that name
    assert resolve_config("recipes/configs/train_metric.yaml").resolve() == (CONFIGS / "train_metric.yaml").resolve()
    with pytest.raises(InputError, match="config file not found"):
        load_yaml("other/train_metric.yaml")


def test_an_unknown_name_lists_the_available_ones(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(InputError, match=r"unknown config 'demo_smok'.*available: .*demo_smoke"):
        resolve_config("demo_smok")
    # every --config command: exit 2 and one line naming the choices
    for argv in (["train", "--config", "demo_smok"], ["train-metric", "--config", "demo_smok"],
                 ["generate-positives", "--config", "demo_smok"]):
        assert pacs_cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "unknown config 'demo_smok'" in err and "train_metric" in err, argv
